"""How long a GPU verdict takes: cold (no cached baselines, no warm child), warm, and six at once.

    python3 benchmarks/verify_speed.py --out $OUT/verify_speed.json [--candidate gpuyantra/kernels/rms_norm.py]

As a GPU worker runs it: one process, `keep_warm=True` (the next verification finds its sandbox child
started), one warm spare per concurrent verification for the round of six (as a worker with six GPU
slots keeps from its start) and the state folder's cached torch.compile baselines. Prints and writes wall seconds and
each verdict's `timings`, reward and speedups; the concurrent round checks that speedups stay within
the noise of the single runs (timing phases hold one GPU-wide lock).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one(path: str, shapes: list[list[int]], dtype: str) -> dict:
    from gpuyantra.verifier import run_verification

    started = time.perf_counter()
    verdict = run_verification(path, device="cuda", shapes=shapes, dtypes=[dtype], keep_warm=True)
    return {
        "wall_s": round(time.perf_counter() - started, 2),
        "reward": verdict.reward,
        "speedup_vs_eager": verdict.speedup_vs_eager,
        "speedup_vs_compile": verdict.speedup_vs_compile,
        "failures": [f.rule for f in verdict.failures],
        "timings": verdict.timings,
        "cached": [row.get("cached") for row in verdict.bench],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--candidate", default=str(ROOT / "gpuyantra" / "kernels" / "rms_norm.py"))
    parser.add_argument("--shapes", default="1x1536,4096x1536")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--spare-wait-s", type=float, default=20.0, help="spares starting, as at a worker start")
    args = parser.parse_args()
    from gpuyantra.config import state_dir
    from gpuyantra.triton_env import prepare

    prepare("cuda")
    (state_dir() / "verifier" / "baselines.json").unlink(missing_ok=True)
    shapes = [[int(d) for d in s.split("x")] for s in args.shapes.split(",")]
    report: dict = {"candidate": args.candidate, "shapes": shapes, "dtype": args.dtype}

    def save() -> None:
        args.out.write_text(json.dumps(report, indent=1))

    report["cold"] = one(args.candidate, shapes, args.dtype)
    print("cold", report["cold"], flush=True)
    save()
    report["warm"] = []
    for _ in range(args.warm_runs):
        report["warm"].append(one(args.candidate, shapes, args.dtype))
        print("warm", report["warm"][-1], flush=True)
        save()
    # As a GPU worker with that many slots: one warm spare per concurrent verification, started
    # before the round (the worker starts them with itself).
    from gpuyantra.verifier.sandbox import keep_spare, set_spare_count

    set_spare_count(args.parallel)
    keep_spare("cuda")
    time.sleep(args.spare_wait_s)
    started = time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        report["parallel"] = list(pool.map(lambda _: one(args.candidate, shapes, args.dtype), range(args.parallel)))
    report["parallel_wall_s"] = round(time.perf_counter() - started, 2)
    for row in report["parallel"]:
        print("parallel", row, flush=True)
    warm = [r["wall_s"] for r in report["warm"]]
    report["summary"] = {
        "cold_s": report["cold"]["wall_s"],
        "warm_median_s": statistics.median(warm) if warm else None,
        "parallel_wall_s": report["parallel_wall_s"],
        "single_speedups_vs_eager": [r["speedup_vs_eager"] for r in report["warm"]],
        "parallel_speedups_vs_eager": [r["speedup_vs_eager"] for r in report["parallel"]],
    }
    print("summary", report["summary"], flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
