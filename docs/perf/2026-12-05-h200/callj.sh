#!/bin/bash
set -u
source benchmarks/device_prelude.sh || exit 3
export TRITON_INTERPRET=0
R=/tmp/callj; mkdir -p $R
python3 -c "import torch,triton,sys;print(sys.version);print(torch.__version__,triton.__version__)" > $R/versions.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $R/versions.txt
timeout 150 python3 benchmarks/verify_cli_speed.py --out $R/tree_b3 --where worker --templates rms_norm \
  --warm-runs 3 --parallel-templates rms_norm --parallel-rounds 3 --between-s 3 --timeout-s 100 > $R/tree_b3.log 2>&1
python3 -c "
import json; d=json.load(open('$R/tree_b3/cli_speed.json')); s=d['summary']['rms_norm']; c=d['templates']['rms_norm']['cold']
print('cold', c['wall_s'], c.get('failures'), 'contract', c['timings'].get('contract'))
print('warm', s.get('warm_median_s'), 'rounds', s.get('round_walls_s'), 'over', s.get('round_over_one'), 'accepted', s.get('round_all_accepted'))"
gzip -f $R/tree_b3/cli_speed.json
tar czf $OUT/callj.tgz -C /tmp callj
