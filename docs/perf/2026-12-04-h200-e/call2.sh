#!/bin/bash
# Call 2: six `gpuyantra verify` at once through the worker, old (HEAD's verifier files in .ab/old)
# against new (spares' CUDA contexts one at a time, the reference cache scaled to the GPU), on one
# machine, in the order new, old, new, old; then a py-spy profile of the new one.
set -u
source benchmarks/device_prelude.sh || exit 3
export TRITON_INTERPRET=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/versions.txt
python3 -c "import torch,triton,sys;print(sys.version);print(torch.__version__,triton.__version__)" >> $OUT/versions.txt
run() { # name, variant, extra args
  name=$1; variant=$2; shift 2
  cp -r .ab/$variant/gpuyantra/. gpuyantra/
  timeout 150 python3 benchmarks/verify_cli_speed.py --out $OUT/$name --where worker --templates rms_norm \
    --warm-runs 3 --parallel-templates rms_norm --parallel-rounds 4 --between-s 0 --timeout-s 100 "$@" \
    > $OUT/$name.log 2>&1
  gzip -f $OUT/$name/*.txt 2>/dev/null
}
run new1 new
run old1 old
run new2 new
run old2 old
run prof new --profile gil,idle
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
for name in ("new1", "old1", "new2", "old2", "prof"):
    try:
        s = json.load(open(f"{out}/{name}/cli_speed.json"))["summary"]["rms_norm"]
        print(name, "warm", s["warm_median_s"], "rounds", s["round_walls_s"], "over", s["round_over_one"])
    except Exception as e:
        print(name, "failed", e)
PY
