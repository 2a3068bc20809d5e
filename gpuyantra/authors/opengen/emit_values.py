"""Kernel emission of the IR's leaves, elementwise and view nodes: inputs' scalars and params,
pointwise ops (constant powers specialised), broadcasts, reshapes, permutes, slices, reversals,
gathers, advanced indexing, as_strided, split views, iotas and concatenations. Each handler maps
the node's index tuple to its source's and evaluates the source there (TileEmitter.value).
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.emit_tile import TileEmitter
from gpuyantra.authors.opengen.kernel import ZERO, Val, join_cats
from gpuyantra.authors.opengen.ops import Operand, libm, pointwise
from gpuyantra.authors.opengen.spec import Unsupported
from gpuyantra.authors.opengen.symbolic import product, same, same_shape


class ValueEmitter(TileEmitter):
    """The handlers of leaves, elementwise and view nodes (see the module docstring)."""

    def _scalar(self, node: ir.Scalar, idx: tuple[Val, ...], lin: Val | None) -> Val:
        return Val(_literal(node.value), "s", node.kind)

    def _float_param(self, node: ir.FloatParam, idx: tuple[Val, ...], lin: Val | None) -> Val:
        arg = self._scalar_arg(f"f_{node.name}", f"float({node.name})")
        if node.scale == 1.0 and node.offset == 0.0 and node.power == 1:
            return Val(arg, "s", "f")
        term = arg if node.power == 1 else f"tl.div_rn(1.0, {arg})"
        return self.emit(f"({node.scale!r} * {term} + {node.offset!r})", "s", "f", [])

    def _size_value(self, node: ir.SizeValue, idx: tuple[Val, ...], lin: Val | None) -> Val:
        size = self.size(node.expr)
        return Val(f"({size.code} * 1.0)", "s", "f") if node.kind == "f" else size

    def _broadcast(self, node: ir.Broadcast, idx: tuple[Val, ...], lin: Val | None) -> Val:
        src_idx = [ZERO if node.src.shape[i] == 1 else idx[bd] for i, bd in enumerate(node.bdims)]
        return self.value(node.src, src_idx)

    def _reshape(self, node: ir.Reshape, idx: tuple[Val, ...], lin: Val | None) -> Val:
        # A reshape keeps the row-major offset: lin passes through.
        return self.value(node.src, self._reshape_index(node.src.shape, node.shape, idx), lin)

    def _permute(self, node: ir.Permute, idx: tuple[Val, ...], lin: Val | None) -> Val:
        src_idx: list[Val] = [ZERO] * node.rank
        for i, p in enumerate(node.perm):
            src_idx[p] = idx[i]
        return self.value(node.src, src_idx)

    def _slice(self, node: ir.Slice, idx: tuple[Val, ...], lin: Val | None) -> Val:
        src_idx = [
            self.ix_add(self.size(node.starts[d]), self.ix_mul(i, self.size(sympy.Integer(node.steps[d]))))
            for d, i in enumerate(idx)
        ]
        return self.value(node.src, src_idx)

    def _rev(self, node: ir.Rev, idx: tuple[Val, ...], lin: Val | None) -> Val:
        src_idx = list(idx)
        for d in node.dims:
            src_idx[d] = self.ix_sub(self.size(node.shape[d] - 1), idx[d])
        return self.value(node.src, src_idx)

    def _gather(self, node: ir.Gather, idx: tuple[Val, ...], lin: Val | None) -> Val:
        index = self.value(node.index, idx)
        if index.kind != "i":
            raise Unsupported("gather with a non-integer index")
        src_idx = list(idx)
        src_idx[node.dim] = index
        return self.value(node.src, src_idx)

    def _index(self, node: ir.Index, idx: tuple[Val, ...], lin: Val | None) -> Val:
        return self.value(node.src, self._index_index(node, idx))

    def _as_strided(self, node: ir.AsStrided, idx: tuple[Val, ...], lin: Val | None) -> Val:
        # The element's row-major offset in the source, then the source's own indices.
        flat = self.size(node.offset)
        for i, stride in zip(idx, node.strides):
            flat = self.ix_add(flat, self.ix_mul(i, self.size(stride)))
        return self.value(node.src, self.unravel(flat, node.src.shape, bounded=False), flat)

    def _split(self, node: ir.Split, idx: tuple[Val, ...], lin: Val | None) -> Val:
        """Element p * chunk + c of src's row-major order (with `dims`: of the split dims' order, at
        the kept dims' index), or the pad past its end."""
        *kept, part, col = idx
        split_dims = node.dims or tuple(range(node.src.rank))
        split_shape = [node.src.shape[d] for d in split_dims]
        flat = self.ix_add(self.ix_mul(part, self.size(node.shape[-1])), col)
        inside = self.emit(f"({flat.code} < {self.size(product(split_shape)).code})", flat.cat, "b", [flat])
        self.guards.append(inside)
        try:
            if node.dims:
                inner, outer = iter(self.unravel(flat, split_shape)), iter(kept)
                full = [next(inner) if d in node.dims else next(outer) for d in range(node.src.rank)]
                v = self.value(node.src, full)
            else:
                v = self.value(node.src, self.unravel(flat, node.src.shape), flat)
        finally:
            self.guards.pop()
        code, _ = pointwise(
            "where", [self._operand(inside), self._operand(v), Operand(_literal(node.pad), node.kind, False)], node.kind
        )
        return self.emit(code, join_cats(inside.cat, v.cat), node.kind, [inside, v])

    def _iota(self, node: ir.Iota, idx: tuple[Val, ...], lin: Val | None) -> Val:
        step = self.ix_mul(idx[0], self.size(sympy.Integer(node.step)))
        v = self.ix_add(self.size(sympy.Integer(node.start)), step)
        if node.kind == "i":
            return v
        return self.emit(f"{v.code}.to(tl.float32)" if v.tensor else f"({v.code} * 1.0)", v.cat, "f", [v])

    def _operand(self, v: Val) -> Operand:
        return Operand(v.code, v.kind, v.tensor)

    def _pointwise(self, node: ir.Pointwise, idx: tuple[Val, ...], lin: Val | None) -> Val:
        if node.op == "pow" and isinstance(node.args[1], ir.Scalar):
            special = self._pow_constant(node, idx, lin)
            if special is not None:
                return special
        args = [
            self.value(a, self._broadcast_index(a, idx), lin if same_shape(a.shape, node.shape) else None)
            for a in node.args
        ]
        code, helpers = pointwise(node.op, [self._operand(a) for a in args], node.kind)
        self.use_helpers(helpers)
        if all(not a.tensor for a in args) and not helpers and "tl." not in code:
            return Val(code, "s", node.kind)
        return self.emit(code, join_cats(*(a.cat for a in args)), node.kind, args)

    def _pow_constant(self, node: ir.Pointwise, idx: tuple[Val, ...], lin: Val | None) -> Val | None:
        exponent = node.args[1]
        assert isinstance(exponent, ir.Scalar)
        e = float(exponent.value)
        base_node = node.args[0]
        base = self.value(
            base_node, self._broadcast_index(base_node, idx), lin if same_shape(base_node.shape, node.shape) else None
        )
        if base.kind != "f" or node.kind != "f":
            return None
        x = base.code
        # ATen's pow by these constants: sqrt, rsqrt, reciprocal and products (sqrtf, rsqrtf, IEEE division)
        rsqrt, helpers = libm("rsqrt", x)
        forms: dict[float, tuple[str, tuple[str, ...]] | None] = {
            1.0: None,
            2.0: (f"({x} * {x})", ()),
            3.0: (f"({x} * {x} * {x})", ()),
            0.5: (f"tl.sqrt_rn({x})", ()),
            -0.5: (rsqrt, helpers),
            -1.0: (f"tl.div_rn(1.0, {x})", ()),
            -2.0: (f"tl.div_rn(1.0, {x} * {x})", ()),
            0.0: None,
        }
        if e not in forms:
            return None
        if e == 1.0:
            return base
        if e == 0.0:
            return Val("1.0", "s", "f")
        code, needs = forms[e] or ("", ())
        if not base.tensor and ("tl." in code or needs):
            return None
        self.use_helpers(needs)
        return self.emit(code, base.cat, "f", [base])

    def _broadcast_index(self, arg: ir.Node, idx: tuple[Val, ...]) -> list[Val]:
        """Right-aligned broadcasting: size-1 dims read index 0."""
        offset = len(idx) - arg.rank
        return [ZERO if arg.shape[i] == 1 else idx[offset + i] for i in range(arg.rank)]

    def _reshape_index(self, src: Sequence[sympy.Expr], dst: Sequence[sympy.Expr], idx: tuple[Val, ...]) -> list[Val]:
        """Source indices of a row-major reshape: dims grouped where sizes match (1:1 copies,
        splits and merges need no more than one div/mod per dim), else through the flat offset."""
        out: list[Val] = [ZERO] * len(src)
        s_dims = [d for d in range(len(src)) if src[d] != 1]
        d_dims = [d for d in range(len(dst)) if dst[d] != 1]
        i = j = 0
        while i < len(s_dims) and j < len(d_dims):
            group = self._group(src, dst, s_dims, d_dims, i, j)
            if group is None:
                break
            gi, gj = group
            s_group, d_group = s_dims[i:gi], d_dims[j:gj]
            if len(s_group) == 1 and len(d_group) == 1:
                out[s_group[0]] = idx[d_group[0]]
            else:
                flat = self.ravel([idx[d] for d in d_group], [dst[d] for d in d_group])
                for d, v in zip(s_group, self.unravel(flat, [src[d] for d in s_group])):
                    out[d] = v
            i, j = gi, gj
        if i < len(s_dims) or j < len(d_dims):
            flat = self.ravel([idx[d] for d in d_dims[j:]], [dst[d] for d in d_dims[j:]])
            for d, v in zip(s_dims[i:], self.unravel(flat, [src[d] for d in s_dims[i:]])):
                out[d] = v
        return out

    @staticmethod
    def _group(
        src: Sequence[sympy.Expr], dst: Sequence[sympy.Expr], s_dims: list[int], d_dims: list[int], i: int, j: int
    ) -> tuple[int, int] | None:
        """End positions of the smallest groups src[i:a], dst[j:b] with equal products."""
        for a in range(i + 1, len(s_dims) + 1):
            ps = product([src[d] for d in s_dims[i:a]])
            for b in range(j + 1, len(d_dims) + 1):
                pd = product([dst[d] for d in d_dims[j:b]])
                if same(ps, pd):
                    return a, b
        return None

    def _index_index(self, node: ir.Index, idx: tuple[Val, ...]) -> list[Val]:
        """Source indices of src[..., i, ...]: the index tensors' broadcast dims sit where the
        indexed dims were when those are adjacent, else in front (numpy rules)."""
        indices = list(node.indices) + [None] * (node.src.rank - len(node.indices))
        indexed = [d for d, t in enumerate(indices) if t is not None]
        b_rank = node.rank - (node.src.rank - len(indexed))
        adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
        b_start = indexed[0] if adjacent else 0
        b_idx = idx[b_start : b_start + b_rank]
        rest = iter(idx[:b_start] + idx[b_start + b_rank :])
        out: list[Val] = []
        for d, t in enumerate(indices):
            if t is None:
                out.append(next(rest))
                continue
            v = self.value(t, self._broadcast_index(t, b_idx))
            size = self.size(node.src.shape[d])
            out.append(self.emit(f"tl.where({v.code} < 0, {v.code} + {size.code}, {v.code})", v.cat, "i", [v], "i"))
        return out

    def _cat(self, node: ir.Cat, idx: tuple[Val, ...], lin: Val | None = None) -> Val:
        d = node.dim
        offsets: list[sympy.Expr] = [sympy.Integer(0)]
        for s in node.srcs:
            offsets.append(offsets[-1] + s.shape[d])
        parts: list[tuple[Val | None, Val]] = []
        for k, src in enumerate(node.srcs):
            start, end = self.size(offsets[k]), self.size(offsets[k + 1])
            conds = []
            if k > 0:
                conds.append(self.emit(f"({idx[d].code} >= {start.code})", idx[d].cat, "b", [idx[d]]))
            if k < len(node.srcs) - 1:
                conds.append(self.emit(f"({idx[d].code} < {end.code})", idx[d].cat, "b", [idx[d]]))
            guard = (
                conds[0]
                if len(conds) == 1
                else self.emit(f"{conds[0].code} & {conds[1].code}", conds[0].cat, "b", conds)
                if conds
                else None
            )
            if guard is not None:
                self.guards.append(guard)
            sub = list(idx)
            sub[d] = self.ix_sub(idx[d], start)
            v = self.value(src, sub)
            if guard is not None:
                self.guards.pop()
            parts.append((guard, v))
        result = parts[-1][1]
        for guard, v in reversed(parts[:-1]):
            assert guard is not None
            code, _ = pointwise("where", [self._operand(guard), self._operand(v), self._operand(result)], node.kind)
            result = self.emit(code, join_cats(guard.cat, v.cat, result.cat), node.kind, [guard, v, result])
        return result


def _literal(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if value != value:
        return "float('nan')"
    if value in (float("inf"), float("-inf")):
        return "float('inf')" if value > 0 else "float('-inf')"
    return repr(float(value))
