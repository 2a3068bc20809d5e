#!/usr/bin/env python3
"""Where a decode-shape call's wall time goes: torch allocation, one eager op, a bare Triton launch
with 1 / 10 arguments, and each family's template entry at decode shape (back-to-back calls,
median µs per call; on a launch-bound host these, not the GPU, set decode latency).

    python benchmarks/launch_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import triton
import triton.language as tl

from benchmarks.ops_bench import load_strategy, shape_specs, template_adapter, time_call
from gpuyantra.authors.template import default_strategy
from gpuyantra.ops import all_ops


@triton.jit
def _one_arg(X):
    tl.store(X + tl.arange(0, 16), tl.zeros([16], tl.float32))


@triton.jit
def _ten_args(X, W, Y, n, s, eps, H: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, EVICT: tl.constexpr):
    tl.store(Y + tl.arange(0, 16), tl.zeros([16], tl.float32))


def main() -> None:
    dev = "cuda"
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    buf = torch.empty(64, device=dev)
    rows = [
        ("torch.empty_like", lambda: torch.empty_like(x)),
        ("x * 2 (one eager op)", lambda: x * 2),
        ("x.reshape(-1, H)", lambda: x.reshape(-1, 4096)),
        ("x.is_contiguous()", lambda: x.is_contiguous()),
        ("triton launch, 1 arg", lambda: _one_arg[(1,)](buf)),
        (
            "triton launch, 10 args + num_warps",
            lambda: _ten_args[(1,)](
                x, w, buf, 1, 4096, 1e-6, H=4096, BLOCK=4096, ROWS=1, EVICT="", num_warps=8, num_stages=1
            ),
        ),
    ]
    gen = torch.Generator(device=dev).manual_seed(0)
    for family in all_ops():
        ((name, r, h),) = shape_specs(family.name, ["decode"], 4096, cpu=False)
        acts = family.make_activations(r, h, torch.bfloat16, dev, gen)
        params = family.make_params(h, torch.bfloat16, dev, gen)
        cand = load_strategy(family.name, default_strategy(family.name), template_adapter(family.name))
        rows.append((f"{family.name} template entry", lambda c=cand, a=acts, p=params: c.entry(*a, **p)))
        rows.append((f"{family.name} eager", lambda f=family, a=acts, p=params: f.reference(*a, **p)))
    for label, fn in rows:
        print(f"{label:>40}: {time_call(fn):8.2f} µs", flush=True)


if __name__ == "__main__":
    main()
