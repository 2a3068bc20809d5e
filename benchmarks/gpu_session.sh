#!/usr/bin/env bash
# Every GPU measurement of the project in one device call (about 8 minutes on an H200):
#   device run, carry [".whl"], command: bash benchmarks/gpu_session.sh
# Fetch the wheels first, here: ../shared/scripts/device-wheels.sh liger-kernel
# Results land in $OUT; copy them into docs/perf/<date>-h200-*/ with the date and versions.
set -uo pipefail
source benchmarks/device_prelude.sh || exit 1
OUT=${OUT:-/tmp/gy-out}; mkdir -p "$OUT"
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())' | tee "$OUT/versions.txt"
run() { local name=$1; shift; echo "== $name"; timeout "$@" 2>&1 | tee "$OUT/$name.log" | tail -40; }
run verify_rms_norm 120 python3 -m gpuyantra.cli verify gpuyantra/kernels/rms_norm.py --device cuda --shapes 1x1536,4096x1536 --dtypes bfloat16 --json
run ops_bench 200 python3 benchmarks/ops_bench.py --out "$OUT"
run profile_bench 100 python3 benchmarks/profile_bench.py --out "$OUT/profile_h200.json"
run serving_bench 200 python3 benchmarks/serving_bench.py --out "$OUT/serving_bench.json" --skip-compile
