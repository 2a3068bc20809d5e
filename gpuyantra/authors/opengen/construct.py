"""Constructors of IR nodes with light simplification, shared by every family of the lowering:
pointwise ops (constant folding, x - mean(x) centered without cancellation), broadcasts and
reshapes (collapsed where they change nothing), reductions (full reductions over many elements
split across programs), matrix products (diag(v) @ B as a row scaling) and the shifted variance.

They call one another (a pointwise subtraction may build a centered mean, which builds pointwise
ops and reductions), so they stay together; the lowering's driver (lower.py) sets the registry
that collects the run-time sizes of split reductions.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import sympy
import torch
from torch.utils._sympy import functions as sf

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.spec import Unsupported
from gpuyantra.authors.opengen.symbolic import contiguous_strides, literal, product, same, same_shape

# Full reductions over more than this many elements (when known) are split across programs.
SPLIT_LITERAL_MIN = 1 << 16
# Partial reductions whose rows hold at least this many elements (known when written) are split per
# row: an H200 ran a LayerNorm over 16 rows of 4 M elements 17x slower than torch.compile on 8
# programs (two rows each). Never rows of a served model's norms (hidden sizes, vocabularies):
# there the split's extra launch would cost decode steps more than it gives.
ROW_SPLIT_MIN = 1 << 20
SPLIT_PARTS = sympy.Symbol("SPLIT_PARTS", integer=True, positive=True)  # strategy constants of the file
SPLIT_CHUNK = sympy.Symbol("SPLIT_CHUNK", integer=True, positive=True)
SPLITS: ContextVar[list[tuple[sympy.Symbol, sympy.Expr]] | None] = ContextVar("SPLITS", default=None)


def retype(node: ir.Node, dtype: torch.dtype) -> ir.Node:
    """The same value under another dtype of the same kind (float32 math either way)."""
    if node.dtype == dtype:
        return node
    if isinstance(node, ir.Pointwise):
        return ir.Pointwise(node.shape, node.kind, dtype, node.op, node.args)
    return ir.Pointwise(node.shape, node.kind, dtype, "identity", (node,))


def cast_to(node: ir.Node, kind: str, dtype: torch.dtype) -> ir.Node:
    if node.kind == kind:
        return node
    return make_pointwise(node.shape, kind, dtype, "cast", (node,))


def make_pointwise(shape: Any, kind: str, dtype: torch.dtype, op: str, args: tuple[ir.Node, ...]) -> ir.Node:
    if op == "sub" and len(args) == 2:
        dims = match_mean(args[0], args[1])
        if dims is not None:  # x - mean(x): centered without cancellation
            return retype(make_centered(args[0], dims), dtype)
    if all(isinstance(a, ir.Scalar) for a in args) and not shape:
        folded = _fold(op, [a.value for a in args if isinstance(a, ir.Scalar)], kind)
        if folded is not None:
            return ir.Scalar((), kind, dtype, folded)
    return ir.Pointwise(tuple(shape), kind, dtype, op, args)


def _fold(op: str, values: list[Any], kind: str) -> Any:
    """Constant-fold pointwise ops on python scalars (the few the graphs need)."""
    try:
        if op == "cast":
            v = values[0]
            return float(v) if kind == "f" else (bool(v) if kind == "b" else int(v))
        if op == "identity":
            return values[0]
        table: dict[str, Callable[..., Any]] = {
            "add": operator.add,
            "sub": operator.sub,
            "mul": operator.mul,
            "neg": operator.neg,
            "sqrt": math.sqrt,
            "exp": math.exp,
            "log": math.log,
            "reciprocal": lambda a: 1.0 / a,
        }
        fn = table.get(op)
        return fn(*values) if fn is not None else None
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def make_broadcast(src: ir.Node, shape: Any, bdims: tuple[int, ...]) -> ir.Node:
    shape = tuple(shape)
    if src.rank == len(shape) and bdims == tuple(range(len(shape))) and same_shape(src.shape, shape):
        return src
    # Only size-1 dims added, nothing expanded: a reshape (unsqueeze).
    if all(
        shape[d] == 1 or (d in bdims and same(src.shape[bdims.index(d)], shape[d])) for d in range(len(shape))
    ) and list(bdims) == sorted(bdims):
        return make_reshape(src, shape)
    return ir.Broadcast(shape, src.kind, src.dtype, src, bdims)


def make_reshape(src: ir.Node, shape: Any) -> ir.Node:
    shape = tuple(shape)
    if same_shape(src.shape, shape):
        return src
    if isinstance(src, ir.Reshape):
        return make_reshape(src.src, shape)
    if isinstance(src, ir.Scalar):
        return ir.Broadcast(shape, src.kind, src.dtype, src, ()) if shape else src
    return ir.Reshape(shape, src.kind, src.dtype, src)


def make_reduce(op: str, src: ir.Node, dims: tuple[int, ...], dtype: torch.dtype) -> ir.Node:
    shape = tuple(s for d, s in enumerate(src.shape) if d not in dims)
    if not dims:
        return src
    kind = "i" if op in ("argmax", "argmin") else src.kind
    if op == "sum" and src.kind == "b":
        src = cast_to(src, "i", torch.int64)
        kind = "i"
    if op in ("sum", "prod", "max", "min") and src.kind != "b":
        full = len(dims) == src.rank
        split = _split_reduce(op, src, kind, dtype) if full else _split_rows(op, src, dims, kind, dtype)
        if split is not None:
            return split
    return ir.Reduce(shape, kind, dtype, op, src, dims)


def _pad(op: str, kind: str) -> float | int:
    """The fold's identity: what positions past a split's end hold."""
    if kind != "f" and op in ("max", "min"):
        return -(2**63) if op == "max" else 2**63 - 1
    return {"sum": 0, "prod": 1, "max": -math.inf, "min": math.inf}[op]


def _split_rows(op: str, src: ir.Node, dims: tuple[int, ...], kind: str, dtype: torch.dtype) -> ir.Node | None:
    """A reduction over `dims` whose rows are known to be long (ROW_SPLIT_MIN): each row as partials
    over `parts` programs, then a fold per row. `parts` is a run-time size entry computes: about
    SPLIT_PARTS programs in all, at least SPLIT_CHUNK elements each (1 part when rows are many)."""
    registry = SPLITS.get()
    n = product([src.shape[d] for d in dims])
    known = literal(n)
    if registry is None or known is None or known < ROW_SPLIT_MIN:
        return None
    kept_shape = tuple(s for d, s in enumerate(src.shape) if d not in dims)
    rows = sympy.Max(1, product(kept_shape))
    parts = sympy.Symbol(f"_parts{len(registry)}", integer=True, positive=True)
    registry.append((parts, sympy.Max(1, sympy.Min(sf_ceildiv(SPLIT_PARTS, rows), sf_ceildiv(n, SPLIT_CHUNK)))))
    k = len(kept_shape)
    chunk = sf_ceildiv(n, parts)
    view = ir.Split((*kept_shape, parts, chunk), src.kind, src.dtype, src, _pad(op, kind), tuple(sorted(dims)))
    partial = ir.Reduce((*kept_shape, parts), kind, dtype, op, view, (k + 1,))
    return ir.Reduce(kept_shape, kind, dtype, op, partial, (k,))


def _split_reduce(op: str, src: ir.Node, kind: str, dtype: torch.dtype) -> ir.Node | None:
    """A full reduction as partials over `parts` programs, then one fold of the partials: one
    program per row would leave a GPU idle on a loss over a billion elements. `parts` is a
    run-time size entry computes from the element count (1 for small inputs)."""
    registry = SPLITS.get()
    n = product(src.shape)
    known = literal(n)
    if registry is None or (known is not None and known <= SPLIT_LITERAL_MIN):
        return None
    parts = sympy.Symbol(f"_parts{len(registry)}", integer=True, positive=True)
    registry.append((parts, sympy.Max(1, sympy.Min(SPLIT_PARTS, sf_ceildiv(n, SPLIT_CHUNK)))))
    view = ir.Split((parts, sf_ceildiv(n, parts)), src.kind, src.dtype, src, _pad(op, kind))
    partial = ir.Reduce((parts,), kind, dtype, op, view, (1,))
    return ir.Reduce((), kind, dtype, op, partial, (0,))


def make_matmul(a: ir.Node, b: ir.Node, dtype: torch.dtype) -> ir.Node:
    """a @ b for a (*batch, M, K) and b (*batch, K, N); a diagonal matrix (torch.diag's
    where(i == j, v, 0)) on either side becomes a row or column scaling: no product at all."""
    if a.rank != b.rank or a.rank < 2:
        raise Unsupported(f"matmul of ranks {a.rank} and {b.rank}")
    if not same(a.shape[-1], b.shape[-2]) or not same_shape(a.shape[:-2], b.shape[:-2]):
        raise Unsupported(f"matmul of shapes {list(a.shape)} and {list(b.shape)} (sizes differ)")
    shape = (*a.shape[:-1], b.shape[-1])
    rank = len(shape)
    diagonal = _diagonal_values(a)
    if diagonal is not None:  # diag(v) @ b: row m of b times v[m, m]
        scale = make_broadcast(diagonal, shape, (*range(rank - 2), rank - 2))
        return make_pointwise(shape, "f", dtype, "mul", (scale, b))
    diagonal = _diagonal_values(b)
    if diagonal is not None:  # a @ diag(v): column n of a times v[n, n]
        scale = make_broadcast(diagonal, shape, (*range(rank - 2), rank - 1))
        return make_pointwise(shape, "f", dtype, "mul", (a, scale))
    return ir.MatMul(shape, "f", dtype, a, b)


def _diagonal_values(node: ir.Node) -> ir.Node | None:
    """v[..., t, t] when `node` is where(i == j, v, 0) over its last two dims (what torch.diag and
    diag_embed trace to), else None."""
    if not (isinstance(node, ir.Pointwise) and node.op == "where" and node.rank >= 2):
        return None
    cond, values, other = node.args
    if not (isinstance(other, ir.Scalar) and other.value == 0):
        return None
    if not (isinstance(cond, ir.Pointwise) and cond.op == "eq"):
        return None
    axes = {_iota_axis(arg) for arg in cond.args}
    rank = node.rank
    if axes != {rank - 2, rank - 1} or not same(node.shape[-1], node.shape[-2]):
        return None
    values = make_broadcast(values, node.shape, tuple(range(rank - values.rank, rank)))
    # Element t of the diagonal is element t * (n + 1) of the row-major (n, n) trailing block.
    n = node.shape[-1]
    batch = node.shape[:-2]
    strides = (*contiguous_strides(node.shape)[:-2], n + 1)
    return ir.AsStrided((*batch, n), values.kind, values.dtype, values, strides, sympy.Integer(0))


def _iota_axis(node: ir.Node) -> int | None:
    """The dim along which `node` counts 0, 1, 2, ... (an arange broadcast or unsqueezed), else None."""
    if isinstance(node, ir.Iota):
        return 0 if node.start == 0 and node.step == 1 and node.rank == 1 else None
    if isinstance(node, ir.Broadcast):
        inner = _iota_axis(node.src)
        return node.bdims[inner] if inner is not None else None
    if isinstance(node, ir.Reshape):
        inner = _iota_axis(node.src)
        if inner is None:
            return None
        src_big = [d for d, s in enumerate(node.src.shape) if s != 1]
        dst_big = [d for d, s in enumerate(node.shape) if s != 1]
        if inner not in src_big or len(src_big) != len(dst_big):
            return None
        return dst_big[src_big.index(inner)]
    if isinstance(node, ir.Pointwise) and node.op in ("identity", "cast") and node.kind == "i":
        return _iota_axis(node.args[0])
    return None


def sf_ceildiv(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    return sf.CeilDiv(a, b)


def make_variance(src: ir.Node, dims: tuple[int, ...], correction: float) -> ir.Node:
    """sum((x - mean)^2) / (n - correction), the centered values from `centered` (shifted)."""
    n = product([src.shape[d] for d in dims])
    f32 = torch.float32
    centered = make_centered(src, dims)
    squares = make_pointwise(src.shape, "f", f32, "mul", (centered, centered))
    ss = make_reduce("sum", squares, dims, f32)
    c = sympy.Integer(int(correction)) if float(correction).is_integer() else sympy.Float(correction)
    denom = ir.SizeValue((), "f", f32, n - c)
    return make_pointwise(ss.shape, "f", src.dtype, "div", (ss, denom))


def make_centered(src: ir.Node, dims: tuple[int, ...]) -> ir.Node:
    """x - mean(x) over `dims`, computed as (x - k) - mean(x - k) with k the row's first element:
    rows far from zero (mean 2000, spread 1) keep their digits, since the mean itself, rounded to
    float32, is never subtracted from x."""
    f32 = torch.float32
    n = product([src.shape[d] for d in dims])
    kept = tuple(d for d in range(src.rank) if d not in dims)
    kept_shape = tuple(src.shape[d] for d in kept)
    first_shape = tuple(sympy.Integer(1) if d in dims else s for d, s in enumerate(src.shape))
    first = ir.Slice(first_shape, src.kind, src.dtype, src, (sympy.Integer(0),) * src.rank, (1,) * src.rank)
    shift = make_broadcast(make_reshape(first, kept_shape), src.shape, kept)
    shifted = make_pointwise(src.shape, "f", f32, "sub", (src, shift))
    mean = make_pointwise(
        kept_shape, "f", f32, "div", (make_reduce("sum", shifted, dims, f32), ir.SizeValue((), "f", f32, n))
    )
    return ir.Pointwise(src.shape, "f", f32, "sub", (shifted, make_broadcast(mean, src.shape, kept)))


def match_mean(a: ir.Node, b: ir.Node) -> tuple[int, ...] | None:
    """The reduced dims when `b` is mean(a) over them, broadcast back to a's shape (keepdim)."""
    if not same_shape(a.shape, b.shape) or a.kind != "f":
        return None
    labels: list[object] = list(range(b.rank))
    node = b
    div_seen = False
    while True:
        if isinstance(node, ir.Broadcast):
            labels = [0 if node.src.shape[i] == 1 else labels[bd] for i, bd in enumerate(node.bdims)]
            node = node.src
        elif isinstance(node, ir.Reshape):
            moved = _unsqueeze_map(node.src.shape, node.shape, labels)
            if moved is None:
                return None
            labels, node = moved, node.src
        elif isinstance(node, ir.Pointwise) and node.op == "div" and not div_seen:
            count = node.args[1]
            if isinstance(count, ir.SizeValue):
                n_expr = count.expr
            elif isinstance(count, ir.Scalar) and float(count.value).is_integer():
                n_expr = sympy.Integer(int(count.value))  # a reduced extent the trace pinned
            else:
                return None
            div_seen, node = True, node.args[0]
        elif isinstance(node, ir.Reduce) and node.op == "sum" and div_seen and node.src is a:
            kept = [d for d in range(a.rank) if d not in node.dims]
            if labels != kept or not same(n_expr, product([a.shape[d] for d in node.dims])):
                return None
            return node.dims
        else:
            return None


def _unsqueeze_map(src: Sequence[sympy.Expr], dst: Sequence[sympy.Expr], labels: list[object]) -> list[object] | None:
    """Labels of src's dims when the reshape only adds or drops size-1 dims, else None."""
    src_big = [d for d in range(len(src)) if src[d] != 1]
    dst_big = [d for d in range(len(dst)) if dst[d] != 1]
    if len(src_big) != len(dst_big) or not all(same(src[i], dst[j]) for i, j in zip(src_big, dst_big)):
        return None
    out: list[object] = [0] * len(src)
    for i, j in zip(src_big, dst_big):
        out[i] = labels[j]
    return out
