"""Lowering of views and indexing: broadcasts and expands, reshapes, transposes and permutes,
slices (prims and aten forms, narrow, select), flips, cat, gather, as_strided and advanced
indexing with integer index tensors. Every view reads its source through an index map: no copy.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.construct import cast_to, make_broadcast, make_reshape
from gpuyantra.authors.opengen.lower_args import FxArgs, Handler
from gpuyantra.authors.opengen.spec import Unsupported
from gpuyantra.authors.opengen.symbolic import as_expr, as_shape, contiguous_strides, product, same

RESHAPES = ("split_dim", "collapse_view", "collapse", "squeeze", "reshape", "view", "_unsafe_view", "unsqueeze",
            "flatten", "_reshape_alias")  # fmt: skip


def _broadcast_in_dim(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "a")
    bdims = tuple(lw.ints(lw.arg(node, 2, "broadcast_dimensions")))
    return make_broadcast(src, shape, bdims)


def _expand(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "self")
    offset = len(shape) - src.rank
    return make_broadcast(src, shape, tuple(range(offset, len(shape))))


def _reshape(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    return make_reshape(lw.tensor(node, 0, "a"), shape)


def _transpose(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "a")
    args = lw.value(node.args[1])
    if isinstance(args, (list, tuple)):  # prims.transpose(a, permutation)
        perm = tuple(int(p) for p in args)
    else:  # aten.transpose(a, dim0, dim1)
        d0, d1 = int(args) % max(src.rank, 1), int(lw.value(node.args[2])) % max(src.rank, 1)
        perm_list = list(range(src.rank))
        perm_list[d0], perm_list[d1] = perm_list[d1], perm_list[d0]
        perm = tuple(perm_list)
    return ir.Permute(shape, src.kind, src.dtype, src, perm)


def _permute(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "self")
    if len(node.args) > 1:
        perm = tuple(int(p) % max(src.rank, 1) for p in lw.value(node.args[1]))
    else:
        perm = tuple(reversed(range(src.rank)))
    return ir.Permute(shape, src.kind, src.dtype, src, perm)


def _slice(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "a")
    second = lw.value(lw.arg(node, 1, "start_indices"))
    if isinstance(second, (list, tuple)):  # prims.slice(a, start_indices, limit_indices, strides)
        starts = tuple(as_expr(s) for s in second)
        strides = lw.value(lw.arg(node, 3, "strides"))
        steps = tuple(int(s) for s in strides) if strides else (1,) * src.rank
        return ir.Slice(shape, src.kind, src.dtype, src, starts, steps)
    # aten.slice.Tensor(self, dim, start, end, step)
    dim = int(second or 0) % max(src.rank, 1)
    start = lw.value(lw.arg(node, 2, "start"))
    step = int(lw.value(lw.arg(node, 4, "step")) or 1)
    start_e = as_expr(start) if start is not None else sympy.Integer(0)
    if start_e.is_number and int(start_e) < 0:
        start_e = start_e + src.shape[dim]
    return _slice_dim(src, shape, dim, start_e, step)


def _slice_dim(src: ir.Node, shape: Any, dim: int, start: sympy.Expr, step: int) -> ir.Node:
    starts = tuple(start if d == dim else sympy.Integer(0) for d in range(src.rank))
    steps = tuple(step if d == dim else 1 for d in range(src.rank))
    return ir.Slice(shape, src.kind, src.dtype, src, starts, steps)


def _slice_in_dim(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "a")
    start = as_expr(lw.value(lw.arg(node, 1, "start_index")))
    step = int(lw.value(lw.arg(node, 3, "stride", 1)) or 1)
    dim = int(lw.value(lw.arg(node, 4, "axis", 0))) % max(src.rank, 1)
    return _slice_dim(src, shape, dim, start, step)


def _narrow(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "self")
    dim = int(lw.value(node.args[1])) % max(src.rank, 1)
    start = as_expr(lw.value(node.args[2]))
    return _slice_dim(src, shape, dim, start, 1)


def _select(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "self")
    dim = int(lw.value(node.args[1])) % max(src.rank, 1)
    index = as_expr(lw.value(node.args[2]))
    if index.is_number and int(index) < 0:
        index = index + src.shape[dim]
    kept = tuple(sympy.Integer(1) if d == dim else s for d, s in enumerate(src.shape))
    sliced = _slice_dim(src, kept, dim, index, 1)
    return make_reshape(sliced, shape)


def _rev(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "a")
    dims = tuple(sorted(d % max(src.rank, 1) for d in lw.ints(node.args[1])))
    if isinstance(src, ir.Scan) and dims == (src.dim,):
        # flip(scan(z)) is the reverse scan of flip(z): one pass that writes in place of a scan
        # into a buffer and a second kernel that copies it flipped (half the bytes moved).
        flipped = ir.Rev(src.src.shape, src.src.kind, src.src.dtype, src.src, dims)
        return ir.Scan(src.shape, src.kind, src.dtype, src.op, flipped, src.dim, not src.reverse)
    return ir.Rev(shape, src.kind, src.dtype, src, dims)


def _cat(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    items = lw.arg(node, 0, "tensors")
    dim = int(lw.value(lw.arg(node, 1, "dim", 0)))
    srcs = tuple(lw.as_node(a, (node.name, ("args", 0, i))) for i, a in enumerate(items))
    srcs = tuple(s for s in srcs if not (s.rank == 1 and s.shape[0] == 0))  # torch skips empty 1-d inputs
    dim %= max(len(shape), 1)
    srcs = tuple(cast_to(s, kind, dtype) for s in srcs)
    if len(srcs) == 1:
        return srcs[0]
    scan = _scan_after_identity(srcs, dim)
    if scan is not None:
        # cat([identity, scan(a)]) is scan(cat([identity, a])) exactly (0 + a = a, 1 * a = a): the
        # scan reads the cat, so no buffer and no second kernel (an exclusive cumsum).
        inner = ir.Cat(shape, scan.src.kind, scan.src.dtype, (*srcs[:-1], scan.src), dim)
        return ir.Scan(shape, scan.kind, scan.dtype, scan.op, inner, dim, scan.reverse)
    return ir.Cat(shape, kind, dtype, srcs, dim)


_SCAN_IDENTITY = {"sum": 0, "prod": 1}


def _scan_after_identity(srcs: tuple[ir.Node, ...], dim: int) -> ir.Scan | None:
    """The forward scan along `dim` that ends the cat, where every piece before it is a constant
    equal to the scan's identity (zeros before a cumsum), with its kind and dtype; else None."""
    scan = srcs[-1]
    if not isinstance(scan, ir.Scan) or scan.dim != dim or scan.reverse or scan.op not in _SCAN_IDENTITY:
        return None
    if any(p.kind != scan.kind or p.dtype != scan.dtype for p in srcs):
        return None
    identity = _SCAN_IDENTITY[scan.op]
    return scan if all(_constant(p) == identity for p in srcs[:-1]) else None


def _constant(node: ir.Node) -> float | int | bool | None:
    """The value of a node that is one constant everywhere (a broadcast scalar), else None."""
    while isinstance(node, (ir.Broadcast, ir.Reshape)):
        node = node.src
    return node.value if isinstance(node, ir.Scalar) else None


def _gather(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "self")
    dim = int(lw.value(node.args[1])) % max(src.rank, 1)
    index = lw.tensor(node, 2, "index")
    return ir.Gather(shape, kind, dtype, src, dim, index)


def _as_strided(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "self")
    source_val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if isinstance(source_val, torch.Tensor) and not isinstance(src, ir.AsStrided):
        meta_strides = as_shape(source_val.stride())
        want = contiguous_strides(as_shape(source_val.shape))
        if not all(same(a, b) or s == 1 for a, b, s in zip(meta_strides, want, src.shape)):
            raise Unsupported("as_strided on a non-contiguous value")
    if isinstance(src, ir.AsStrided):
        src = src.src  # as_strided addresses the storage: a chain of them collapses onto its base
    strides = as_shape(lw.value(node.args[2]))
    offset_v = lw.value(lw.arg(node, 3, "storage_offset"))
    offset = as_expr(offset_v) if offset_v is not None else sympy.Integer(0)
    if same(offset, sympy.Integer(0)) and same(product(shape), product(src.shape)):
        if all(same(a, b) or s == 1 for a, b, s in zip(strides, contiguous_strides(shape), shape)):
            return make_reshape(src, shape)
    return ir.AsStrided(shape, src.kind, src.dtype, src, strides, offset)


def _index(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "self")
    items = lw.arg(node, 1, "indices")
    indices: list[ir.Node | None] = []
    for i, a in enumerate(items):
        if a is None:
            indices.append(None)
            continue
        t = lw.as_node(a, (node.name, ("args", 1, i)))
        if t.kind != "i":
            raise Unsupported("indexing with a boolean mask (a data-dependent shape)")
        indices.append(t)
    if all(i is None for i in indices):
        return src
    return ir.Index(shape, kind, dtype, src, tuple(indices))


VIEW_OPS: dict[str, Handler] = {
    "broadcast_in_dim": _broadcast_in_dim,
    "expand": _expand,
    **{n: _reshape for n in RESHAPES},
    "transpose": _transpose,
    "permute": _permute,
    "t": _permute,
    "slice": _slice,
    "slice_in_dim": _slice_in_dim,
    "narrow": _narrow,
    "select": _select,
    "rev": _rev,
    "flip": _rev,
    "cat": _cat,
    "gather": _gather,
    "as_strided": _as_strided,
    "index": _index,
}
