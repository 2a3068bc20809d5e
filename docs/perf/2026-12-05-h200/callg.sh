#!/bin/bash
# Next GPU session, one call (~450 s): six `gpuyantra verify` at once through the worker and the
# cold verdict, variants on one machine interleaved: new (the tree), sw5 (the tree with
# GPUYANTRA_SWITCH_INTERVAL_MS=5), old (.ab/old: e767e5b's gpuyantra/verifier/, workers/main.py,
# gpuyantra/processes.py), new again. Prepare before the call (here, untracked, delete before commit):
#   mkdir -p .ab/old .ab/new && for f in $(git ls-files gpuyantra/verifier workers/main.py gpuyantra/processes.py); do
#     mkdir -p .ab/old/$(dirname $f) .ab/new/$(dirname $f); git show e767e5b:$f > .ab/old/$f 2>/dev/null || rm -f .ab/old/$f; cp $f .ab/new/$f; done
# Carry [".whl"]; move docs/perf/2026-*/ raw folders out of the tree first (64 MiB limit).
set -u
source benchmarks/device_prelude.sh || exit 3
export TRITON_INTERPRET=0
R=/tmp/callg; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.mem,clocks.sm --format=csv > $R/versions.txt
python3 -c "import torch,triton,sys;print(sys.version);print(torch.__version__,triton.__version__)" >> $R/versions.txt
run() { # name, variant dir, extra env
  cp -r .ab/$2/. .
  env $3 timeout 150 python3 benchmarks/verify_cli_speed.py --out $R/$1 --where worker --templates rms_norm \
    --warm-runs 3 --parallel-templates rms_norm --parallel-rounds 4 --between-s 0 --timeout-s 100 > $R/$1.log 2>&1
  python3 -c "
import json; d=json.load(open('$R/$1/cli_speed.json')); s=d['summary']['rms_norm']; c=d['templates']['rms_norm']['cold']['timings']
print('$1 cold', s.get('cold_s'), 'contract', c.get('contract'), 'precompile', c.get('child_precompile'), 'wait', c.get('child_precompile_wait'), 'beside', c.get('beside_precompile'), 'bench', c.get('child_benchmark'))
print('$1 warm', s.get('warm_median_s'), 'rounds', s.get('round_walls_s'), 'over', s.get('round_over_one'), 'cpu', s.get('round_parent_cpu_s'))"
  gzip -f $R/$1/cli_speed.json
}
run new1 new "X=1"
run sw51 new "GPUYANTRA_SWITCH_INTERVAL_MS=5"
run old1 old "X=1"
run new2 new "X=1"
cp -r .ab/new/. .
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/verifier/test_fork_server.py > $R/gpu_tests.txt 2>&1
tail -1 $R/gpu_tests.txt
tar czf $OUT/callg.tgz -C /tmp callg
