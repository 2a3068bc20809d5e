#!/bin/bash
# Calls 3 and 4 (CALL=3 / CALL=4): six `gpuyantra verify` at once through the worker, new (the tree
# in .ab/new) against old (.ab/old: the previous commit's verifier files), in the order new, old,
# new on one machine; then the GPU-marked fork-server test on new (call 4 only). Everything lands in
# one archive. Call 3's new was a first version of the spares' warm-up turn (each spare's wait for a
# gap before its turn); call 4's is the committed one (the wait inside the turn).
set -u
source benchmarks/device_prelude.sh || exit 3
export TRITON_INTERPRET=0
R=/tmp/call${CALL:-4}; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.mem,clocks.sm --format=csv > $R/versions.txt
python3 -c "import torch,triton,sys;print(sys.version);print(torch.__version__,triton.__version__)" >> $R/versions.txt
run() { # name, variant
  cp -r .ab/$2/gpuyantra/. gpuyantra/
  timeout 150 python3 benchmarks/verify_cli_speed.py --out $R/$1 --where worker --templates rms_norm \
    --warm-runs 3 --parallel-templates rms_norm --parallel-rounds 4 --between-s 0 --timeout-s 100 > $R/$1.log 2>&1
  cat $R/$1/cli_speed.json | python3 -c "
import json,sys; d=json.load(sys.stdin); s=d['summary']['rms_norm']
fails=sorted({f for r in [d['templates']['rms_norm']['cold'], *d['templates']['rms_norm']['warm']] + [x for rd in d['rounds'].get('rms_norm',[]) for x in rd['runs']] for f in r.get('failures') or []})
print('$1', 'warm', s.get('warm_median_s'), 'rounds', s.get('round_walls_s'), 'over', s.get('round_over_one'), 'fails', fails)"
}
run new1 new
run old1 old
run new2 new
cp -r .ab/new/gpuyantra/. gpuyantra/
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/verifier/test_fork_server.py > $R/gpu_tests.txt 2>&1
tail -1 $R/gpu_tests.txt
tar czf $OUT/call${CALL:-4}.tgz -C /tmp call${CALL:-4}
