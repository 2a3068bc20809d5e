# Sourced at the start of every command on the lent GPU machine (see docs/perf/README.md):
# installs the wheels its image lacks (carried in .whl/) and the temporal CLI, without network.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD \
  && { [ -x /tmp/temporal ] || { xz -dc .whl/temporal.xz > /tmp/temporal.new && chmod +x /tmp/temporal.new \
       && mv /tmp/temporal.new /tmp/temporal; }; } \
  && export PATH=/tmp:/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 GPUYANTRA_STATE_DIR=/tmp/gy-state
