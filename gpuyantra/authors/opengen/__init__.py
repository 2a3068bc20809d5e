"""The open author: a Triton candidate for any traced PyTorch computation, or a reason why not.

Given a module and example inputs (an OpenSpec), `write_open_source` traces the forward to prims
with symbolic sizes (trace.py), lowers it to a small IR of lazy tensor values (ir.py; lower.py
dispatches each op to its family, lower_*.py, which build nodes with construct.py), plans kernels
around its reductions and scans (plan.py), writes each kernel in Triton (emit.py over kernel.py and
emit_*.py, matmul.py, ops.py) and wraps them in a candidate file whose `entry` computes every size
from the actual inputs (source.py).

Supported: elementwise chains with broadcasting, reductions over any dims
(sum, mean, max, min, prod, argmax/argmin, var/std, norms, logsumexp), softmax/log-softmax, the
normalizations (RMS, Layer, Batch in inference, Instance, Group), scans (cumsum, cumprod, reversed,
exclusive, masked) and losses built from these; max and average pooling in 1, 2 and 3 dims as
gathers of the window's positions (pooling.py), and convolutions (grouped, depthwise, transposed
without groups) as one product over those gathers (convolution.py); matrix products (mm, bmm, addmm/baddbmm/addbmm,
mv, dot, and what matmul, Linear and einsum contractions trace to) as tiled tl.dot kernels with
float32 sums, a GEMV path for a few rows or columns and split-K for few tiles over a long K
(matmul.py), operands read through their strides (transposes, broadcast batch dims) with their
elementwise prologue, the elementwise epilogue fused into the store, and diag(v) @ B as a row
scaling. Anything else (grouped transposed convolution, adaptive pooling, attention, integer
matmuls, unknown ops) raises Unsupported with the reason.
"""

from __future__ import annotations

from typing import Any

from gpuyantra.authors.opengen.source import analyse, write_open_source
from gpuyantra.authors.opengen.spec import OpenSpec, Unsupported
from gpuyantra.authors.opengen.strategy import DEFAULT, distance, normalize, points

__all__ = [
    "DEFAULT",
    "OpenSpec",
    "Unsupported",
    "distance",
    "normalize",
    "strategy_space",
    "write_open_source",
]


def strategy_space(spec: OpenSpec) -> list[dict[str, Any]]:
    """Strategies worth trying for this target, best guess first (at most 8). Raises Unsupported."""
    lowered, plan, _ = analyse(spec)
    features = set()
    for k in plan.kernels:
        if k.domain.mm is not None:
            features.add("matmul")
        else:
            features.add("flat" if k.domain.flat else "inner" if k.domain.inner_tiled else "rows")
            features |= {"gather"} if k.domain.flat and k.window_gathers else set()
            features |= {"scan"} if k.scans and not k.domain.inner_tiled else set()
    if lowered.derived:
        features.add("split")
    return points(features)
