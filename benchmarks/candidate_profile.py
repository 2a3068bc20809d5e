#!/usr/bin/env python3
"""Where a candidate's time goes on the GPU, kernel by kernel, beside the problem's own Model.

The problem (KernelBench format: Model, get_init_inputs, get_inputs) is built at its own sizes on
CUDA, the candidate's parameters bound through its ADAPTER, and one call of each side profiled
(torch.profiler, after a warm-up call that compiles the candidate's kernels). Prints each kernel's
device time and the two totals; `--json` writes them.

    python3 benchmarks/candidate_profile.py CANDIDATE.py --problem PROBLEM.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import operator
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def kernel_table(run: Any) -> list[dict[str, Any]]:
    """[{kernel, calls, device_us}] of one profiled call of `run`, longest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    rows: dict[str, dict[str, Any]] = {}
    for event in prof.events():
        if getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        row = rows.setdefault(event.name, {"kernel": event.name[:120], "calls": 0, "device_us": 0.0})
        row["calls"] += 1
        row["device_us"] += getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0)
    return sorted(rows.values(), key=lambda r: -r["device_us"])


def problem_on_cuda(problem: Path) -> tuple[Any, list[Any]]:
    """The problem's Model (seed 0, eval) and its inputs at their own sizes, on CUDA."""
    import torch

    from gpuyantra.kernelbench.problems import load_module

    module = load_module(problem)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs()).cuda().eval()
    return model, [x.cuda() if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]


def bound_params(cand: Any, model: Any) -> dict[str, Any]:
    """The candidate's kernel parameters: the Model's attributes its ADAPTER names."""
    return {b["kernel_param"]: operator.attrgetter(b["module_attr"])(model) for b in cand.adapter}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("candidate")
    parser.add_argument("--problem", required=True)
    parser.add_argument("--json", type=Path, help="write the tables here")
    args = parser.parse_args(argv)
    import torch

    from gpuyantra.candidate import load_candidate
    from gpuyantra.verifier.bench import float32_as_float32

    float32_as_float32()
    model, inputs = problem_on_cuda(Path(args.problem))
    cand = load_candidate(args.candidate)
    bound = bound_params(cand, model)
    report: dict[str, Any] = {"candidate": args.candidate, "problem": args.problem}
    with torch.no_grad():
        for side, run in (("model", lambda: model(*inputs)), ("candidate", lambda: cand.entry(*inputs, **bound))):
            run()  # compiles the candidate's kernels, warms cuDNN's choice
            table = kernel_table(run)
            report[side] = {"total_us": round(sum(r["device_us"] for r in table), 1), "kernels": table}
            print(f"{side}: {report[side]['total_us']:.1f} us on the device")
            for row in table[:12]:
                print(f"  {row['device_us']:12.1f} us  x{row['calls']:<4d} {row['kernel']}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
