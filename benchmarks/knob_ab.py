"""Settings of an open-target file's strategy knobs side by side, on the GPU, at a problem's own sizes.

For each candidate (`FOLDER/<problem>/candidate_1.py`, as `gpuyantra kernelbench --out FOLDER`
writes them) and each setting (`MM_F32_TC=1,MM_BLOCK_K=64`; `-` is the file as written): the
largest error against the problem's Model in float64 beside eager's own, the share of elements
outside float32's tolerance (1e-4 + 1e-4 |want|), and device time (`triton.testing.do_bench`, one
process, nothing else on the GPU) against eager, and with `--compile` against torch.compile of the
Model too (default mode, static shapes, timed the same way).

    python benchmarks/knob_ab.py FOLDER --problems .kb/level1,.kb/level2 \
        --settings "MM_F32_TC=0;MM_F32_TC=1;MM_F32_TC=1,MM_BLOCK_K=64" --out ab.json
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.candidate_profile import bound_params, problem_on_cuda  # noqa: E402
from gpuyantra.candidate import load_candidate  # noqa: E402
from gpuyantra.kernelbench.model_new import time_cuda_us  # noqa: E402
from gpuyantra.verifier.bench import float32_as_float32  # noqa: E402

ATOL = RTOL = 1e-4  # the verifier's float32 tolerance against float64


def parse_setting(text: str) -> dict[str, int]:
    if text.strip() in ("", "-"):
        return {}
    pairs = (item.split("=", 1) for item in text.split(","))
    return {key.strip(): int(value) for key, value in pairs}


def problem_file(name: str, roots: list[Path]) -> Path | None:
    stem = name.removeprefix("l2_")
    for root in roots:
        if (root / f"{stem}.py").exists():
            return root / f"{stem}.py"
    return None


def accuracy(out: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    err = (out.double() - want).abs()
    outside = (err > ATOL + RTOL * want.abs()).double().mean().item()
    return float(err.max()), outside


def compiled_us(model: torch.nn.Module, inputs: list[Any]) -> float:
    """torch.compile's time for the Model at these inputs (compiled once, then timed like the rest)."""
    compiled = torch.compile(model, dynamic=False)
    compiled(*inputs)
    return time_cuda_us(lambda: compiled(*inputs))


def one_problem(candidate: Path, problem: Path, settings: list[str], with_compile: bool) -> list[dict[str, Any]]:
    model, inputs = problem_on_cuda(problem)
    as64 = [x.double() if isinstance(x, torch.Tensor) else x for x in inputs]
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        want = copy.deepcopy(model).double()(*as64)
        eager_err, eager_outside = accuracy(model(*inputs), want)
        eager_us = time_cuda_us(lambda: model(*inputs))
        compile_us = compiled_us(model, inputs) if with_compile else None
        best_us = min(eager_us, compile_us or eager_us)
        for text in settings:
            row: dict[str, Any] = {"problem": problem.stem, "setting": text, "eager_us": round(eager_us, 1)}
            if compile_us is not None:
                row["compile_us"] = round(compile_us, 1)
            row.update(eager_max_err=eager_err, eager_outside=eager_outside)
            try:
                cand = load_candidate(str(candidate))
                for key, value in parse_setting(text).items():
                    setattr(cand.module, key, value)
                bound = bound_params(cand, model)
                row["max_err"], row["outside"] = accuracy(cand.entry(*inputs, **bound), want)
                row["us"] = round(time_cuda_us(functools.partial(cand.entry, *inputs, **bound)), 1)
                row["speedup"] = round(eager_us / row["us"], 3)
                row["vs_best"] = round(best_us / row["us"], 3)
            except Exception as exc:  # noqa: BLE001 - a setting that fails is a row, not the end of the run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(
                f"{problem.stem[:40]:40s} {text:32s} "
                + (
                    f"err {row['max_err']:.3g} (eager {eager_err:.3g}) outside {row['outside']:.2g} "
                    f"{row['us']:9.1f} us eager {eager_us:9.1f} us x{row['speedup']:.2f} vs best x{row['vs_best']:.2f}"
                    if "us" in row
                    else row.get("error", "")
                ),
                flush=True,
            )
            rows.append(row)
            torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--problems", default=".kb/level1,.kb/level2", help="problem folders, comma separated")
    parser.add_argument("--settings", default="MM_F32_TC=0;MM_F32_TC=1", help="settings, ';' separated")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compile", action="store_true", help="time torch.compile of the Model too")
    args = parser.parse_args()
    float32_as_float32()  # eager as the verifier times it: TF32 off
    roots = [Path(p) for p in args.problems.split(",")]
    settings = args.settings.split(";")
    rows: list[dict[str, Any]] = []
    for candidate in sorted(args.folder.glob("*/candidate_1.py")):
        problem = problem_file(candidate.parent.name, roots)
        if problem is None:
            print(f"{candidate.parent.name}: no problem file", flush=True)
            continue
        try:
            rows += one_problem(candidate, problem, settings, args.compile)
        except Exception as exc:  # noqa: BLE001
            print(f"{problem.stem}: {type(exc).__name__}: {exc}", flush=True)
        torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
