#!/bin/bash
set -u
source benchmarks/device_prelude.sh || exit 3
export TRITON_INTERPRET=0
R=/tmp/callh; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.mem,clocks.sm --format=csv > $R/versions.txt
python3 -c "import torch,triton,sys;print(sys.version);print(torch.__version__,triton.__version__)" >> $R/versions.txt
run() { # name, variant dir
  cp -r .ab/$2/. .
  timeout 150 python3 benchmarks/verify_cli_speed.py --out $R/$1 --where worker --templates rms_norm \
    --warm-runs 3 --parallel-templates rms_norm --parallel-rounds 4 --between-s 0 --timeout-s 100 > $R/$1.log 2>&1
  python3 -c "
import json; d=json.load(open('$R/$1/cli_speed.json')); s=d['summary']['rms_norm']; c=d['templates']['rms_norm']['cold']['timings']
print('$1 cold', s.get('cold_s'), 'contract', c.get('contract'), 'corr', c.get('child_correctness'), 'precompile', c.get('child_precompile'), 'wait', c.get('child_precompile_wait'), 'beside', c.get('beside_precompile'), 'bench', c.get('child_benchmark'), 'end', c.get('child_exit'), c.get('child_results_seen'))
print('$1 warm', s.get('warm_median_s'), 'rounds', s.get('round_walls_s'), 'over', s.get('round_over_one'), 'path', [max(p) for p in s.get('round_path_s')])"
  gzip -f $R/$1/cli_speed.json
}
run new1 new
run old1 old
run new2 new
run old2 old
cp -r .ab/new/. .
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/verifier/test_fork_server.py tests/verifier/test_transport.py tests/verifier/test_adversarial.py > $R/gpu_tests.txt 2>&1
tail -3 $R/gpu_tests.txt
tar czf $OUT/callh.tgz -C /tmp callh
