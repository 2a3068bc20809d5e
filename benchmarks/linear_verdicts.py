#!/usr/bin/env python3
"""The `linear` template judged by the verifier itself at several knob points, for one projection.

A campaign decides on the verifier's timings (one call after an L2 flush, eager and torch.compile
beside), which differ from a CUDA-graph harness's (`linear_gemv.py`: replays over many weight
copies). So a start point chosen from the harness can still lose in the verdict that decides. This
runs `gpuyantra verify` on copies of `gpuyantra/kernels/linear.py` with the given module constants
changed, at the projection's decode shapes, and prints kernel / eager / compile microseconds per
shape and the reward a campaign would judge (`gpuyantra.verifier.verdict.reward_on_shapes`).

    python3 benchmarks/linear_verdicts.py --weight 1536x8960 --shapes 8x1x8960,1x1x8960 \\
        --points 'SMALL_BLOCK_N=16;SMALL_BLOCK_N=32,SMALL_STAGES=3' --out /tmp/down.json
    python3 benchmarks/linear_verdicts.py --device cpu --weight 8x32 --shapes 2x1x32 --points 'BLOCK_N=2' --out x.json

Points are separated by ";", knobs within a point by ","; an empty point is the template as it is.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEMPLATE = ROOT / "gpuyantra" / "kernels" / "linear.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weight", required=True, help="the projection's weight shape, NxK")
    p.add_argument("--bias", action="store_true", help="the projection has a bias")
    p.add_argument("--shapes", required=True, help="activation shapes, comma-separated (e.g. 8x1x8960,1x1x8960)")
    p.add_argument("--points", default="", help="knob points: 'A=1,B=2;A=3' (an empty point: the template as is)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--timeout", type=int, default=240, help="seconds per verification")
    p.add_argument("--out", required=True, help="JSON file to write")
    return p.parse_args(argv)


def parse_points(text: str) -> list[dict[str, str]]:
    points = []
    for chunk in text.split(";"):
        knobs = dict(item.split("=", 1) for item in chunk.split(",") if item.strip())
        points.append({k.strip(): v.strip() for k, v in knobs.items()})
    return points


def candidate_at(point: dict[str, str], folder: Path, index: int) -> Path:
    """A copy of the template with each knob's module-level assignment replaced."""
    source = TEMPLATE.read_text()
    for knob, value in point.items():
        source, count = re.subn(rf"^{re.escape(knob)} = [^#\n]*", f"{knob} = {value}  ", source, flags=re.M)
        if count != 1:
            raise SystemExit(f"knob {knob} is not a module constant of {TEMPLATE.name}")
    path = folder / f"linear_point_{index}.py"
    path.write_text(source)
    return path


def verify(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, "-m", "gpuyantra.cli", "verify", str(path), "--device", args.device, "--json"]
    argv += ["--shapes", args.shapes, "--dtypes", args.dtype, "--param-shape", f"weight={args.weight}"]
    argv += ["--param-shape", f"bias={args.weight.split('x')[0] if args.bias else 'none'}"]
    argv += ["--timeout", str(args.timeout)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout + 60)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-800:]}"}


def summarize(point: dict[str, str], verdict: dict[str, Any], shapes: list[list[int]]) -> dict[str, Any]:
    from gpuyantra.verifier.verdict import reward_on_shapes

    rows = [
        {k: r.get(k) for k in ("shape", "kernel_us", "eager_us", "compile_us", "compile_ro_us")}
        for r in verdict.get("bench") or []
    ]
    judged = reward_on_shapes(verdict, shapes) if "error" not in verdict else None
    return {
        "point": point,
        "accepted": verdict.get("accepted"),
        "failures": [f.get("rule") for f in verdict.get("failures") or []],
        "error": verdict.get("error"),
        "rows": rows,
        "decode": judged,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shapes = [[int(d) for d in s.split("x")] for s in args.shapes.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="gy-linear-points-") as tmp:
        for i, point in enumerate(parse_points(args.points)):
            row = summarize(point, verify(candidate_at(point, Path(tmp), i), args), shapes)
            results.append(row)
            Path(args.out).write_text(
                json.dumps({"weight": args.weight, "shapes": shapes, "points": results}, indent=1)
            )
            cells = " ".join(
                f"{r['shape']}: {fmt(r['kernel_us'])} us (eager {fmt(r['eager_us'])})" for r in row["rows"]
            )
            decode = row["decode"] or {}
            speedup = fmt(decode.get("speedup_vs_eager"), 3)
            print(f"{point or 'template'}: reward {decode.get('reward')} x{speedup} | {cells}")
            if row["error"] or row["failures"]:
                print(f"  {row['error'] or row['failures']}")
    return 0


def fmt(value: Any, digits: int = 2) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.{digits}f}"


if __name__ == "__main__":
    raise SystemExit(main())
