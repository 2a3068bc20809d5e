#!/bin/bash
set -u
source benchmarks/device_prelude.sh || exit 3
export TRITON_INTERPRET=0
R=/tmp/calli; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.mem,clocks.sm --format=csv > $R/versions.txt
python3 -c "import torch,triton,sys;print(sys.version);print(torch.__version__,triton.__version__)" >> $R/versions.txt
run() { # name, variant dir, between, rounds
  cp -r .ab/$2/. .
  timeout 170 python3 benchmarks/verify_cli_speed.py --out $R/$1 --where worker --templates rms_norm \
    --warm-runs 3 --parallel-templates rms_norm --parallel-rounds $4 --between-s $3 --timeout-s 100 > $R/$1.log 2>&1
  python3 -c "
import json; d=json.load(open('$R/$1/cli_speed.json')); s=d['summary']['rms_norm']; c=d['templates']['rms_norm']['cold']['timings']
print('$1 cold', s.get('cold_s'), 'contract', c.get('contract'), 'corr', c.get('child_correctness'), 'precompile', c.get('child_precompile'), 'wait', c.get('child_precompile_wait'), 'bench', c.get('child_benchmark'), 'collect', c.get('sandbox_collect'))
print('$1 warm', s.get('warm_median_s'), 'rounds', s.get('round_walls_s'), 'over', s.get('round_over_one'))"
  gzip -f $R/$1/cli_speed.json
}
run new_b3 new 3 5
run old_b3 old 3 5
run new_b0 new 0 4
cp -r .ab/new/. .
tar czf $OUT/calli.tgz -C /tmp calli
