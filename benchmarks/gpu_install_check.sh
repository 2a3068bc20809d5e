#!/usr/bin/env bash
# The container image's environment, built without Docker on a GPU machine whose Python already has a
# CUDA torch, triton and transformers (the lent H200's image): a virtual environment that sees those
# (--system-site-packages), the wheels the image lacks carried in .whl/ (benchmarks/device_wheels.sh),
# and gpuyantra itself installed into it with pip (no PYTHONPATH). Then what the Dockerfile's image
# must be able to do: a C compiler and Python.h for Triton's launcher, `pip check` on the project's
# ranges, the image's torch/triton/transformers kept, a CUDA verification, and a short real campaign.
#
#   device run, carry [".whl"]:  bash benchmarks/gpu_install_check.sh
# Output in $OUT (default /tmp/gy-install): install.log, versions.txt, verify.json, campaign/.
set -uo pipefail
OUT=${OUT:-/tmp/gy-install}; mkdir -p "$OUT"
VENV=/tmp/gy-venv
step() { echo "== $*"; }
fail() { echo "FAILED: $*"; exit 1; }

step "toolchain Triton needs at run time"
cc --version | head -1 || fail "no C compiler (cc)"
python3 -c 'import sysconfig, os, sys; h = os.path.join(sysconfig.get_paths()["include"], "Python.h"); sys.exit(0 if os.path.exists(h) else f"no {h}")' \
  || fail "no Python headers"

step "virtual environment over the image's packages"
before=$(python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)')
python3 -m venv --system-site-packages "$VENV" || fail "venv"
# The image's python may itself be a virtual environment (or use PYTHONPATH), whose packages
# --system-site-packages does not reach: point the new one at the folders torch was found in.
python3 -c 'import sys, os; print("\n".join(p for p in sys.path if os.path.isdir(p) and p.endswith(("site-packages", "dist-packages"))))' \
  > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/image-packages.pth"
"$VENV/bin/pip" install -q --no-index --no-deps --no-cache-dir .whl/*.whl >"$OUT/install.log" 2>&1 || fail "wheels (see install.log)"
"$VENV/bin/pip" install -q --no-index --no-deps --no-build-isolation --no-cache-dir -e . >>"$OUT/install.log" 2>&1 \
  || fail "gpuyantra (see install.log)"
"$VENV/bin/pip" check >>"$OUT/install.log" 2>&1; echo "pip check exit $?" | tee -a "$OUT/install.log"
after=$("$VENV/bin/python" -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)')
echo "image: $before / venv: $after" | tee "$OUT/versions.txt"
[ "$before" = "$after" ] || fail "the install replaced the image's torch, triton or transformers"
[ -x /tmp/temporal ] || { xz -dc .whl/temporal.xz > /tmp/temporal && chmod +x /tmp/temporal; }

export PATH="$VENV/bin:/tmp:$PATH" GPUYANTRA_STATE_DIR=/tmp/gy-install-state PYTHONUNBUFFERED=1
unset PYTHONPATH
cd /tmp || exit 1  # away from the checkout: the package must come from the install
step "gpuyantra from the install: $(command -v gpuyantra)"
python -c 'import gpuyantra, os; print("imported from", os.path.dirname(gpuyantra.__file__), "PYTHONPATH", os.environ.get("PYTHONPATH"))' \
  || fail "gpuyantra is not importable from the install"
cd - >/dev/null || exit 1

step "a CUDA verification"
timeout 180 gpuyantra verify gpuyantra/kernels/rms_norm.py --device cuda --shapes 1x1536,4096x1536 --dtypes bfloat16 --json \
  >"$OUT/verify.json" 2>"$OUT/verify.log"; echo "verify exit $?"
tail -c 400 "$OUT/verify.json"; echo

step "a short campaign (Temporal dev server, workers, gpuyantra serve --cuda-graphs, optimize --wait)"
budget=${CAMPAIGN_BUDGET_S:-400}  # one device call is 10 minutes: shorter when run beside other parts
timeout $((budget + 20)) python benchmarks/campaign_bench.py --out "$OUT/campaign" --phases "${CAMPAIGN_PHASES:-before,cold,after}" \
  --max-targets 1 --max-iterations 1 --budget-s "$budget" --skip-compile; echo "campaign exit $?"
