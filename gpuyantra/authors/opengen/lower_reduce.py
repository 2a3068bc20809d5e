"""Lowering of reductions, normalizations' statistics and scans: sum/prod/amax/amin over dims,
max/min over everything (or elementwise, with two tensors), max/min over a dim with their indices,
argmax/argmin, var (two passes over centered values, never E[x^2] - E[x]^2) and cumsum, cumprod,
logcumsumexp. Normalizations (RMS, Layer, Batch, Group, ...) trace to these plus pointwise ops.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.construct import cast_to, make_pointwise, make_reduce, make_reshape, make_variance
from gpuyantra.authors.opengen.lower_args import FxArgs, Handler, schema_name
from gpuyantra.authors.opengen.symbolic import as_shape, product, same_shape


def _max_min(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    name = schema_name(node)
    src = lw.tensor(node, 0, "self")
    if len(node.args) > 1 and isinstance(node.args[1], torch.fx.Node):  # max(a, b): elementwise
        other = lw.tensor(node, 1, "other")
        return make_pointwise(shape, kind, dtype, "maximum" if name == "max" else "minimum", (src, other))
    return make_reduce(name, src, tuple(range(src.rank)), dtype)


def _dims(lw: FxArgs, node: torch.fx.Node, rank: int, i: int = 1, name: str = "dims") -> tuple[int, ...]:
    raw = lw.value(lw.arg(node, i, name))
    if raw is None or (isinstance(raw, (list, tuple)) and len(raw) == 0 and rank == 0):
        return tuple(range(rank))
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    return tuple(sorted({int(d) % max(rank, 1) for d in items}))


def _reduce(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "inp")
    dims = _dims(lw, node, src.rank)
    name = schema_name(node)
    op = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}[name]
    return make_reduce(op, cast_to(src, kind, dtype), dims, dtype)


def _var(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    """var = sum((x - mean)^2) / (n - correction): two passes (never E[x^2] - E[x]^2)."""
    src = lw.tensor(node, 0, "inp")
    dims = _dims(lw, node, src.rank)
    correction = lw.value(lw.arg(node, 2, "correction", 1.0))
    correction = 1.0 if correction is None else float(correction)
    return make_variance(src, dims, correction)


def _argreduce(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "self")
    dim = lw.value(lw.arg(node, 1, "dim"))
    keepdim = bool(lw.value(lw.arg(node, 2, "keepdim", False)))
    name = schema_name(node)
    if dim is None:
        flat = make_reshape(src, (product(src.shape),))
        out = make_reduce(name, flat, (0,), dtype)
    else:
        out = make_reduce(name, src, (int(dim) % max(src.rank, 1),), dtype)
    return make_reshape(out, shape) if not same_shape(out.shape, shape) or keepdim else out


def max_dim(lw: FxArgs, node: torch.fx.Node, name: str) -> tuple[ir.Node, ir.Node]:
    """torch.max(x, dim) / torch.min(x, dim): (values, indices of the first extreme)."""
    src = lw.tensor(node, 0, "self")
    dim = int(lw.value(lw.arg(node, 1, "dim"))) % max(src.rank, 1)
    keepdim = bool(lw.value(lw.arg(node, 2, "keepdim", False)))
    vals_meta, idx_meta = node.meta["val"]
    values = make_reduce(name, src, (dim,), vals_meta.dtype)
    indices = make_reduce("arg" + name, src, (dim,), idx_meta.dtype)
    if keepdim:
        values = make_reshape(values, as_shape(vals_meta.shape))
        indices = make_reshape(indices, as_shape(idx_meta.shape))
    return values, indices


def _scan(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "self")
    dim = int(lw.value(node.args[1])) % max(src.rank, 1)
    name = schema_name(node)
    if src.rank == 0:
        return cast_to(src, kind, dtype)
    op = {"cumsum": "sum", "cumprod": "prod", "logcumsumexp": "logsumexp"}[name]
    return ir.Scan(shape, kind, dtype, op, cast_to(src, kind, dtype), dim)


REDUCTION_OPS: dict[str, Handler] = {
    "max": _max_min,
    "min": _max_min,
    "sum": _reduce,
    "prod": _reduce,
    "amax": _reduce,
    "amin": _reduce,
    "var": _var,
    "argmax": _argreduce,
    "argmin": _argreduce,
    "cumsum": _scan,
    "cumprod": _scan,
    "logcumsumexp": _scan,
}
