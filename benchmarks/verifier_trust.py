"""Verdicts of the verifier on the project's own cheat and honest candidates, on any device.

    python3 benchmarks/verifier_trust.py --device cuda --out $OUT/verifier_trust.json [--bench-templates]

Each cheat must be rejected with the rule that names its class (`EXPECTED`); each honest candidate
and family template must be accepted. With `--bench-templates` the templates are also timed (CUDA),
so their rewards can be compared with earlier runs. Prints one line per candidate and writes every
verdict to `--out`; exits 1 if any verdict is not the expected one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuyantra.triton_env import prepare  # noqa: E402

CANDIDATES = ROOT / "tests" / "verifier" / "candidates"
# cheat file -> (rule naming its class, dtypes it needs)
EXPECTED = {
    "cheat_fp16_sum_of_squares": ("unstable-numerics", None),
    "cheat_one_pass_variance": ("unstable-numerics", None),
    "cheat_exp_sigmoid": ("unstable-numerics", None),
    "cheat_softmax_no_max": ("unstable-numerics", None),
    "cheat_baked_eps": ("hardcoded-constant", None),
    "cheat_grid_cap": ("shape-cap", None),
    "cheat_tile_cap": ("shape-cap", None),
}
HONEST = ("honest_rowwise", "honest_chunked", "honest_helper")
TEMPLATE_SHAPES = {"rope": "1x12x1x128,1x12x512x128"}  # q's [B, H, S, D]; the rest take [rows, H]


def run(path: Path, device: str, benchmark: bool, shapes: list[list[int]] | None, dtypes: list[str] | None) -> dict:
    from gpuyantra.verifier import run_verification

    started = time.perf_counter()
    verdict = run_verification(path, device=device, benchmark=benchmark, shapes=shapes, dtypes=dtypes)
    data = verdict.to_dict()
    data["wall_s"] = round(time.perf_counter() - started, 1)
    return data


def parse_shapes(text: str) -> list[list[int]]:
    return [[int(d) for d in part.split("x")] for part in text.split(",")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="cheats,honest,templates")
    parser.add_argument("--bench-templates", action="store_true")
    parser.add_argument("--template-dtype", default="bfloat16")
    parser.add_argument("--only", default="", help="comma-separated candidate/template names to run (default: all)")
    args = parser.parse_args()
    device = prepare(args.device)
    parts = set(args.parts.split(","))
    only = set(filter(None, args.only.split(",")))

    def wanted(name: str) -> bool:
        return not only or name in only

    results: dict[str, dict] = {}
    ok = True

    def report(name: str, data: dict, good: bool) -> None:
        nonlocal ok
        ok = ok and good
        rules = sorted({f"{f['layer']}/{f['rule']}" for f in data["failures"]})
        print(
            f"{'ok ' if good else 'BAD'} {name}: reward {data['reward']} rules {rules} checks {data['checks']} "
            f"eager x{data.get('speedup_vs_eager')} compile x{data.get('speedup_vs_compile')} "
            f"{data['wall_s']} s",
            flush=True,
        )
        results[name] = data
        args.out.write_text(json.dumps(results, indent=1))

    if "cheats" in parts:
        for name, (rule, dtypes) in EXPECTED.items():
            if not wanted(name):
                continue
            data = run(CANDIDATES / f"{name}.py", device, False, None, dtypes)
            report(name, data, data["reward"] == -1 and rule in {f["rule"] for f in data["failures"]})
    if "honest" in parts:
        for name in HONEST:
            if not wanted(name):
                continue
            data = run(CANDIDATES / f"{name}.py", device, False, None, None)
            report(name, data, data["accepted"])
    if "templates" in parts:
        from gpuyantra.ops import all_ops

        for op in [family.name for family in all_ops() if wanted(family.name)]:
            path = ROOT / "gpuyantra" / "kernels" / f"{op}.py"
            shapes = parse_shapes(TEMPLATE_SHAPES.get(op, "1x1536,4096x1536"))
            data = run(path, device, args.bench_templates, shapes, [args.template_dtype])
            report(f"template:{op}", data, data["accepted"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
