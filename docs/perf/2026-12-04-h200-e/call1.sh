#!/bin/bash
# Call 1: where six `gpuyantra verify` at once through the worker spend their time (py-spy over the
# worker and its children), and the reference cache's size under the command's three dtypes.
set -u
source benchmarks/device_prelude.sh || exit 3
export TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/versions.txt
python3 -c "import torch,triton,sys;print(sys.version);print(torch.__version__,triton.__version__)" >> $OUT/versions.txt
run() { # name, extra env
  name=$1; shift
  env "$@" timeout 200 python3 benchmarks/verify_cli_speed.py --out $OUT/$name --where worker --templates rms_norm \
    --warm-runs 3 --parallel-templates rms_norm --parallel-rounds 3 --between-s 0 --timeout-s 100 $PROFILE \
    > $OUT/$name.log 2>&1
  tail -4 $OUT/$name.log | head -2
  gzip -f $OUT/$name/*.txt 2>/dev/null
}
PROFILE="--profile gil,idle" run prof
PROFILE="" run base1
PROFILE="" run cache16 GPUYANTRA_REFERENCE_CACHE_MB=16384
PROFILE="" run base2
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
for name in ("prof", "base1", "cache16", "base2"):
    try:
        s = json.load(open(f"{out}/{name}/cli_speed.json"))["summary"]["rms_norm"]
        print(name, "warm", s["warm_median_s"], "rounds", s["round_walls_s"], "over", s["round_over_one"])
    except Exception as e:
        print(name, "failed", e)
PY
