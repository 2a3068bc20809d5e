"""Triton source for one kernel of the plan: evaluate IR nodes at symbolic tile indices.

A kernel iterates a *domain*: a shape S whose dims split into kept dims (rows: one row per index of
the kept dims, ROWS rows per program) and reduced dims (columns, BLOCK wide). Flat kernels (no
reduced dims) walk S's elements in row-major order, BLOCK per program.

Values are produced by evaluating nodes at index tuples (one Triton index expression per dim);
each expression has a category: "s" scalar, "r" per row ([ROWS, 1]), "c" per column ([1, BLOCK],
or [BLOCK] in flat kernels), "f" full tile ([ROWS, BLOCK]). A reduction whose source has the
domain's shape and folds exactly the reduced dims, read at the current row, is computed inline as a
pass over the row; any other reduction is read from a buffer another kernel wrote.

Two variants per row kernel: "single" (the row fits one block: straight-line code, each load once)
and "chunked" (loops over BLOCK-wide slices, one loop per pass, row statistics carried between).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import sympy
import torch

from gpuyantra.authors.opengen import ir
from gpuyantra.authors.opengen.ops import Operand, pointwise
from gpuyantra.authors.opengen.spec import Unsupported
from gpuyantra.authors.opengen.symbolic import contiguous_strides, literal, product, same, same_shape


@dataclass
class Buffer:
    """A tensor a kernel writes (an output or an intermediate) and later kernels may read."""

    name: str
    shape: tuple[sympy.Expr, ...]  # allocation shape (row-major, contiguous)
    kind: str
    node: ir.Node | None = None  # the value it holds (None: a graph output computed via a reshape)


@dataclass(frozen=True)
class Domain:
    shape: tuple[sympy.Expr, ...]
    rdims: tuple[int, ...]  # reduced (column) dims; () for flat kernels
    mm: ir.MatMul | None = None  # matmul kernels: the product whose (m, n) tiles the kernel computes

    @property
    def flat(self) -> bool:
        return not self.rdims and self.mm is None

    @property
    def kept(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d not in self.rdims)

    @property
    def trailing(self) -> bool:
        """Reduced dims are the last ones: a row is one contiguous run of a row-major tensor."""
        n = len(self.shape)
        return self.rdims == tuple(range(n - len(self.rdims), n))

    @property
    def inner_tiled(self) -> bool:
        """Reduced dims before the last kept dim (a sum over dim 1 of [B, D1, D2]): a program's
        rows are consecutive indices of that last kept dim, contiguous in memory, so its loads
        coalesce; the other kept dims are one index per program."""
        kept = self.kept
        return bool(self.rdims and kept and kept[-1] > max(self.rdims) and self.shape[kept[-1]] != 1)

    def inner(self) -> sympy.Expr:
        return self.shape[self.kept[-1]]

    def outer(self) -> sympy.Expr:
        return product([self.shape[d] for d in self.kept[:-1]])

    def rows(self) -> sympy.Expr:
        return product([self.shape[d] for d in self.kept])

    def cols(self) -> sympy.Expr:
        return product([self.shape[d] for d in self.rdims]) if self.rdims else product(self.shape)


@dataclass(frozen=True)
class Store:
    node: ir.Node
    buffer: Buffer
    mode: str  # "full": at every domain index; "row": one value per row
    keepdim: bool = False  # row stores: the node's index has the reduced dims as size 1


@dataclass
class Val:
    code: str
    cat: str  # "s" | "r" | "c" | "f"
    kind: str  # "f" | "i" | "b"
    region: Region | None = None  # None: a literal or a kernel argument (valid everywhere)

    @property
    def tensor(self) -> bool:
        return self.region is not None


ZERO = Val("0", "s", "i")


class Region:
    """A run of straight-line code; in the chunked variant, a loop over column slices or the code
    between two loops."""

    def __init__(self, kind: str, ident: int):
        self.kind = kind  # "main" | "loop" | "post"
        self.ident = ident
        self.pre: list[str] = []  # loop accumulators, before the loop
        self.lines: list[str] = []
        self.closed = False
        self.final = False  # the loop that stores full-tile outputs (scans run there)


def _join(*cats: str) -> str:
    has_r = any(c in ("r", "f") for c in cats)
    has_c = any(c in ("c", "f") for c in cats)
    return "f" if has_r and has_c else "r" if has_r else "c" if has_c else "s"


@dataclass
class KernelParams:
    """The kernel's runtime arguments, in first-use order, with their host expressions."""

    pointers: dict[str, str] = field(default_factory=dict)  # param -> host tensor variable
    scalars: dict[str, str] = field(default_factory=dict)  # param -> host expression
    flags: dict[str, str] = field(default_factory=dict)  # constexpr param -> host expression


class KernelEmitter:
    """Writes one @triton.jit function computing `stores` over `domain` (see module docstring)."""

    _HANDLERS: ClassVar[dict[type, Any]] = {}  # node type -> emission method (filled below the class)

    def __init__(
        self,
        name: str,
        domain: Domain,
        stores: Sequence[Store],
        variant: str,  # "flat" | "single" | "chunked"
        buffer_of: Callable[[ir.Node], Buffer],  # materialized value of a node another kernel writes
        size_code: Callable[[sympy.Expr], str],  # host expression of a size
    ):
        self.name = name
        self.domain = domain
        self.stores = list(stores)
        self.variant = variant
        self.buffer_of = buffer_of
        self.size_code = size_code
        self.params = KernelParams()
        self.helpers: set[str] = set()
        self.counter = 0
        self.cache: dict[tuple[object, ...], Val] = {}
        self.regions: list[Region] = []
        self.main = self._region("main")
        self.regions.append(self.main)
        self.tail = self.main
        self.cur = self.main  # where full-tile and column values go
        self.guards: list[Val] = []
        self.size_params: dict[str, str] = {}  # str(expr) -> param
        self.kept_cache: dict[int, Val] = {}
        self.computing: set[int] = set()  # stores of this kernel being computed (cycle guard)
        self.raveled: dict[tuple[object, ...], Val] = {}  # bounded unravel results -> the flat index
        if variant == "chunked":
            self.tail = self._region("post")
            self.regions.append(self.tail)

    # --- regions and emission ---------------------------------------------------------------------
    def _region(self, kind: str) -> Region:
        self.counter += 1
        return Region(kind, self.counter)

    def _pos(self, region: Region) -> int:
        return self.regions.index(region)

    def _fresh(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def _accessible(self, val: Val) -> bool:
        region = val.region
        if region is None:
            return True
        if region not in self.regions or self._pos(region) > self._pos(self.cur):
            return False
        return not (region.kind == "loop" and region is not self.cur)

    def _home(self, cat: str, deps: Sequence[Val]) -> Region:
        """The region a new value goes to: the current loop for tile values, else as early as its
        dependencies allow (row statistics computed once, not per slice)."""
        if cat in ("c", "f") or self.variant != "chunked":
            return self.cur
        regions = [d.region for d in deps if d.region is not None]
        if not regions:
            return self.main
        return max(regions, key=self._pos)

    def emit(self, code: str, cat: str, kind: str, deps: Sequence[Val], prefix: str = "t") -> Val:
        """A new variable holding `code` (common subexpressions share one variable)."""
        region = self._home(cat, deps)
        key = ("expr", code, region.ident if region.kind == "loop" else 0)
        hit = self.cache.get(key)
        if hit is not None and self._accessible(hit):
            return hit
        name = self._fresh(prefix)
        region.lines.append(f"{name} = {code}")
        val = Val(name, cat, kind, region)
        self.cache[key] = val
        return val

    # --- sizes and arguments ------------------------------------------------------------------------
    def size(self, expr: sympy.Expr) -> Val:
        value = literal(expr)
        if value is not None:
            return Val(str(value), "s", "i")
        key = str(expr)
        if key not in self.size_params:
            name = f"n{len(self.size_params)}"
            self.size_params[key] = name
            self.params.scalars[name] = self.size_code(expr)
        return Val(self.size_params[key], "s", "i")

    def _pointer(self, param: str, host: str) -> str:
        self.params.pointers.setdefault(param, host)
        return param

    def _scalar_arg(self, param: str, host: str) -> str:
        self.params.scalars.setdefault(param, host)
        return param

    # --- index arithmetic (folded where trivial) ----------------------------------------------------
    def _ix(self, code: str, deps: Sequence[Val]) -> Val:
        return self.emit(code, _join(*(d.cat for d in deps)), "i", deps, "i")

    def ix_mul(self, a: Val, b: Val) -> Val:
        if a.code == "0" or b.code == "0":
            return ZERO
        if b.code == "1":
            return a
        if a.code == "1":
            return b
        return self._ix(f"{a.code} * {b.code}", [a, b])

    def ix_add(self, a: Val, b: Val) -> Val:
        if a.code == "0":
            return b
        if b.code == "0":
            return a
        return self._ix(f"{a.code} + {b.code}", [a, b])

    def ix_sub(self, a: Val, b: Val) -> Val:
        if b.code == "0":
            return a
        return self._ix(f"{a.code} - {b.code}", [a, b])

    def ix_div(self, a: Val, b: Val) -> Val:
        if b.code == "1" or a.code == "0":
            return a
        return self._ix(f"{a.code} // {b.code}", [a, b])

    def ix_mod(self, a: Val, b: Val) -> Val:
        if b.code == "1" or a.code == "0":
            return ZERO
        return self._ix(f"{a.code} % {b.code}", [a, b])

    def unravel(self, flat: Val, shape: Sequence[sympy.Expr], bounded: bool = True) -> list[Val]:
        """Row-major indices of `flat` in `shape` (the first one without a modulo when `flat` is
        known to be below the shape's numel)."""
        out: list[Val] = []
        for d in range(len(shape)):
            if shape[d] == 1:
                out.append(ZERO)
                continue
            idx = self.ix_div(flat, self.size(product(shape[d + 1 :])))
            if d > 0 or not bounded:
                idx = self.ix_mod(idx, self.size(shape[d]))
            out.append(idx)
        if bounded:
            self.raveled[self._ravel_key(out, shape)] = flat
        return out

    def ravel(self, idx: Sequence[Val], shape: Sequence[sympy.Expr]) -> Val:
        known = self.raveled.get(self._ravel_key(idx, shape))
        if known is not None and self._accessible(known):
            return known  # ravel(unravel(x)) is x: a reshape and back reads the index it started from
        total = ZERO
        for i, stride in zip(idx, contiguous_strides(shape)):
            total = self.ix_add(total, self.ix_mul(i, self.size(stride)))
        return total

    @staticmethod
    def _ravel_key(idx: Sequence[Val], shape: Sequence[sympy.Expr]) -> tuple[object, ...]:
        return (tuple(v.code for v in idx), tuple(str(sympy.expand(s)) for s in shape))

    # --- the tile's own indices -------------------------------------------------------------------
    def rows(self) -> Val:
        return Val("rows", "r", "i", self.main)

    def cols(self) -> Val:
        """Column indices of the current slice (flat kernels: element offsets)."""
        if self.variant == "chunked":
            return Val(f"cols{self.cur.ident}", "c", "i", self.cur)
        return Val("cols", "c", "i", self.main)

    def _mask(self, cat: str) -> str | None:
        if cat == "s":
            return None
        if cat == "r":
            return "rmask"
        suffix = str(self.cur.ident) if self.variant == "chunked" else ""
        if cat == "c" or self.domain.flat:
            return f"cmask{suffix}"
        return f"fmask{suffix}"

    def kept_index(self, d: int) -> Val:
        if d not in self.kept_cache:
            kept = self.domain.kept
            saved, self.cur = self.cur, self.main
            if self.domain.inner_tiled:
                outer = [self.domain.shape[k] for k in kept[:-1]]
                flat = Val("outer", "s", "i", self.main)
                idx = Val("rin", "r", "i", self.main) if d == kept[-1] else self.unravel(flat, outer)[kept.index(d)]
            else:
                idx = self.unravel(self.rows(), [self.domain.shape[k] for k in kept])[kept.index(d)]
            self.cur = saved
            self.kept_cache[d] = idx
        return self.kept_cache[d]

    def col_index(self, d: int) -> Val:
        dims = tuple(range(len(self.domain.shape))) if self.domain.flat else self.domain.rdims
        pos = dims.index(d)
        shape = [self.domain.shape[k] for k in dims]
        return self.unravel(self.cols(), shape)[pos]

    def full_index(self) -> tuple[Val, ...]:
        return tuple(
            self.col_index(d) if (self.domain.flat or d in self.domain.rdims) else self.kept_index(d)
            for d in range(len(self.domain.shape))
        )

    def row_index(self) -> tuple[Val, ...]:
        return tuple(self.kept_index(d) for d in self.domain.kept)

    def domain_linear(self) -> Val:
        """Row-major offset of the current full index in a tensor of the domain's shape."""
        if self.domain.flat:
            return self.cols()
        if self.domain.trailing:
            return self.ix_add(self.ix_mul(self.rows(), self.size(self.domain.cols())), self.cols())
        return self.ravel(self.full_index(), self.domain.shape)

    # --- values -----------------------------------------------------------------------------------
    def value(self, node: ir.Node, idx: Sequence[Val], lin: Val | None = None) -> Val:
        """The node's value at `idx`; `lin`, when given, is idx's row-major offset in node.shape."""
        idx = tuple(idx)
        if len(idx) != node.rank:
            raise Unsupported(f"internal: index of rank {len(idx)} for a node of rank {node.rank}")
        key = ("node", id(node), tuple(v.code for v in idx), tuple(g.code for g in self.guards))
        hit = self.cache.get(key)
        if hit is not None and self._accessible(hit):
            return hit
        val = self._compute(node, idx, lin)
        self.cache[key] = val
        return val

    def _compute(self, node: ir.Node, idx: tuple[Val, ...], lin: Val | None) -> Val:
        handler = self._HANDLERS.get(type(node))
        if handler is None:
            raise Unsupported(f"internal: no emission for {type(node).__name__}")
        return handler(self, node, idx, lin)

    def _scalar(self, node: ir.Scalar, idx: tuple[Val, ...], lin: Val | None) -> Val:
        return Val(_literal(node.value), "s", node.kind)

    def _float_param(self, node: ir.FloatParam, idx: tuple[Val, ...], lin: Val | None) -> Val:
        arg = self._scalar_arg(f"f_{node.name}", f"float({node.name})")
        if node.scale == 1.0 and node.offset == 0.0 and node.power == 1:
            return Val(arg, "s", "f")
        term = arg if node.power == 1 else f"(1.0 / {arg})"
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
        """Element p * chunk + c of src's row-major order, or the pad past its end."""
        part, col = idx
        flat = self.ix_add(self.ix_mul(part, self.size(node.shape[1])), col)
        inside = self.emit(f"({flat.code} < {self.size(product(node.src.shape)).code})", flat.cat, "b", [flat])
        self.guards.append(inside)
        try:
            v = self.value(node.src, self.unravel(flat, node.src.shape), flat)
        finally:
            self.guards.pop()
        code, _ = pointwise(
            "where", [self._operand(inside), self._operand(v), Operand(_literal(node.pad), node.kind, False)], node.kind
        )
        return self.emit(code, _join(inside.cat, v.cat), node.kind, [inside, v])

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
        self.helpers.update(helpers)
        if all(not a.tensor for a in args) and not helpers and "tl." not in code:
            return Val(code, "s", node.kind)
        return self.emit(code, _join(*(a.cat for a in args)), node.kind, args)

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
        forms = {
            1.0: None,
            2.0: f"({x} * {x})",
            3.0: f"({x} * {x} * {x})",
            0.5: f"tl.sqrt({x})",
            -0.5: f"tl.rsqrt({x})",
            -1.0: f"(1.0 / {x})",
            -2.0: f"(1.0 / ({x} * {x}))",
            0.0: None,
        }
        if e not in forms:
            return None
        if e == 1.0:
            return base
        if e == 0.0:
            return Val("1.0", "s", "f")
        if not base.tensor and "tl." in str(forms[e]):
            return None
        return self.emit(str(forms[e]), base.cat, "f", [base])

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
            result = self.emit(code, _join(guard.cat, v.cat, result.cat), node.kind, [guard, v, result])
        return result

    # --- loads ------------------------------------------------------------------------------------
    def _load_mask(self, cat: str) -> str | None:
        parts = [m for m in [self._mask(cat)] if m]
        parts += [g.code for g in self.guards]
        return " & ".join(parts) if parts else None

    def _load(self, pointer: str, offset: Val, kind: str, deps: list[Val]) -> Val:
        cat = _join(offset.cat, *(g.cat for g in self.guards))
        mask = self._load_mask(cat)
        if offset.cat != cat:  # a guard wider than the offset: the pointer must have the mask's shape
            offset = self.emit(self._tile(offset, cat), cat, "i", [offset, *self.guards], "i")
        addr = f"{pointer} + {offset.code}" if offset.code != "0" else pointer
        code = f"tl.load({addr}, mask={mask}, other=0)" if mask else f"tl.load({addr})"
        if kind == "f":
            code += ".to(tl.float32)"
        return self.emit(code, cat, kind, [offset, *deps, *self.guards])

    def _load_input(self, node: ir.Input, idx: tuple[Val, ...], lin: Val | None) -> Val:
        name = node.name
        pointer = self._pointer(f"p_{name}", name)
        strided = ZERO
        for d, i in enumerate(idx):
            if node.shape[d] == 1:
                continue
            stride = self._scalar_arg(f"{name}_st{d}", f"{name}.stride({d})")
            strided = self.ix_add(strided, self.ix_mul(i, Val(stride, "s", "i")))
        if lin is not None and lin.code != strided.code:
            flag = f"C_{name}"
            self.params.flags[flag] = f"{name}.is_contiguous()"
            offset = self._select_offset(flag, lin, strided)
        else:
            offset = strided
        return self._load(pointer, offset, node.kind, [])

    def _select_offset(self, flag: str, lin: Val, strided: Val) -> Val:
        """A constexpr choice: the row-major offset when the tensor is contiguous at run time."""
        cat = _join(lin.cat, strided.cat)
        region = self._home(cat, [lin, strided])
        key = ("offset", flag, lin.code, strided.code, region.ident)
        hit = self.cache.get(key)
        if hit is not None and self._accessible(hit):
            return hit
        name = self._fresh("o")
        region.lines += [f"if {flag}:", f"    {name} = {lin.code}", "else:", f"    {name} = {strided.code}"]
        val = Val(name, cat, "i", region)
        self.cache[key] = val
        return val

    def _load_buffer(self, buf: Buffer, idx: Sequence[Val], lin: Val | None = None) -> Val:
        pointer = self._pointer(f"p_{buf.name}", buf.name)
        offset = lin if lin is not None else self.ravel(idx, buf.shape)
        return self._load(pointer, offset, buf.kind, [])

    # --- reductions, products and scans ---------------------------------------------------------------
    def _matmul(self, node: ir.MatMul, idx: tuple[Val, ...], lin: Val | None = None) -> Val:
        return self.matmul_value(node, idx)

    def matmul_value(self, node: ir.MatMul, idx: tuple[Val, ...]) -> Val:
        """A product's value: its accumulator in its own matmul kernel, else the buffer it was written to."""
        return self._load_buffer(self.buffer_of(node), idx)

    def _inline_reduce(self, node: ir.Reduce, idx: tuple[Val, ...]) -> bool:
        d = self.domain
        if d.flat or not same_shape(node.src.shape, d.shape) or tuple(node.dims) != d.rdims:
            return False
        return [v.code for v in idx] == [v.code for v in self.row_index()]

    def _reduce(self, node: ir.Reduce, idx: tuple[Val, ...], lin: Val | None = None) -> Val:
        if not self._inline_reduce(node, idx):
            return self._load_buffer(self.buffer_of(node), idx)
        if id(node) in self.computing:
            raise Unsupported("internal: a reduction depends on itself")
        self.computing.add(id(node))
        try:
            return self._reduce_pass(node)
        finally:
            self.computing.discard(id(node))

    def _pass_regions(self) -> tuple[Region, Region]:
        """A new loop + post region, placed before the code that needs their result."""
        if self.variant != "chunked":
            return self.main, self.main
        loop, post = self._region("loop"), self._region("post")
        at = self._pos(self.cur) if self.cur.kind == "loop" else self._pos(self.tail)
        self.regions[at:at] = [loop, post]
        return loop, post

    def _reduce_pass(self, node: ir.Reduce) -> Val:
        loop, post = self._pass_regions()
        saved, self.cur = self.cur, loop
        try:
            v = self.value(node.src, self.full_index(), self.domain_linear() if self.domain.trailing else None)
            fmask = self._mask("f")
            result = self._fold(node, v, fmask, loop, post)
        finally:
            if self.variant == "chunked":
                loop.closed = True
            self.cur = saved
        return result

    def _fold(self, node: ir.Reduce, v: Val, fmask: str | None, loop: Region, post: Region) -> Val:
        kind = v.kind if node.op not in ("argmax", "argmin") else "f"
        acc_ty = "tl.float32" if kind == "f" else "tl.int64"
        x = v.code if kind == "f" or v.kind != "b" else f"{v.code}.to(tl.int64)"
        if kind == "b":
            kind, acc_ty = "i", "tl.int64"
        if node.op in ("argmax", "argmin"):
            return self._fold_arg(node, v, fmask, loop, post)
        big = "float('inf')" if kind == "f" else "9223372036854775807"
        identity = {"sum": "0", "prod": "1", "max": f"-{big}", "min": big}[node.op]
        if kind == "f":
            identity = {"sum": "0.0", "prod": "1.0"}.get(node.op, identity)
        masked = f"tl.where({fmask}, {x}, {identity})"
        finish = {
            "sum": "tl.sum({a}, axis=1, keep_dims=True)",
            "max": "tl.max({a}, axis=1, keep_dims=True)",
            "min": "tl.min({a}, axis=1, keep_dims=True)",
            "prod": "tl.reduce({a}, 1, _mul_combine, keep_dims=True)",
        }[node.op]
        if node.op == "prod":
            self.helpers.add("_mul_combine")
        out_kind = node.kind if node.kind != "b" else "i"
        if self.variant != "chunked":
            masked_v = self.emit(masked, "f", kind, [v])
            return self.emit(finish.format(a=masked_v.code), "r", out_kind, [masked_v], "r")
        acc = self._fresh("acc")
        loop.pre.append(f"{acc} = tl.full([ROWS, BLOCK], {identity}, {acc_ty})")
        combine = {
            "sum": f"{acc} + {masked}",
            "prod": f"{acc} * {masked}",
            "max": f"tl.maximum({acc}, {masked})",
            "min": f"tl.minimum({acc}, {masked})",
        }[node.op]
        loop.lines.append(f"{acc} = {combine}")
        name = self._fresh("r")
        post.lines.append(f"{name} = {finish.format(a=acc)}")
        return Val(name, "r", out_kind, post)

    def _fold_arg(self, node: ir.Reduce, v: Val, fmask: str | None, loop: Region, post: Region) -> Val:
        """First index of the max (min): lanes keep their first best, then the smallest index
        among the lanes holding the row's best wins."""
        big = "float('inf')"
        worst = f"-{big}" if node.op == "argmax" else big
        better = ">" if node.op == "argmax" else "<"
        pick = "tl.max" if node.op == "argmax" else "tl.min"
        x = v.code if v.kind == "f" else f"{v.code}.to(tl.float32)"
        cols = self.cols().code
        if self.variant != "chunked":
            vv = self.emit(f"tl.where({fmask}, {x}, {worst})", "f", "f", [v])
            best = self.emit(f"{pick}({vv.code}, axis=1, keep_dims=True)", "r", "f", [vv], "r")
            code = f"tl.min(tl.where({vv.code} == {best.code}, {cols}, 2147483647), axis=1, keep_dims=True)"
            return self.emit(code, "r", "i", [vv, best], "r")
        acc_v, acc_i = self._fresh("accv"), self._fresh("acci")
        loop.pre.append(f"{acc_v} = tl.full([ROWS, BLOCK], {worst}, tl.float32)")
        loop.pre.append(f"{acc_i} = tl.zeros([ROWS, BLOCK], dtype=tl.int64)")
        lane, upd = self._fresh("vv"), self._fresh("upd")
        loop.lines += [
            f"{lane} = tl.where({fmask}, {x}, {worst})",
            f"{upd} = {lane} {better} {acc_v}",
            f"{acc_i} = tl.where({upd}, {cols}, {acc_i})",
            f"{acc_v} = tl.where({upd}, {lane}, {acc_v})",
        ]
        top, name = self._fresh("r"), self._fresh("r")
        post.lines += [
            f"{top} = {pick}({acc_v}, axis=1, keep_dims=True)",
            f"{name} = tl.min(tl.where({acc_v} == {top}, {acc_i}, 9223372036854775807), axis=1, keep_dims=True)",
        ]
        return Val(name, "r", "i", post)

    def _inline_scan(self, node: ir.Scan, idx: tuple[Val, ...]) -> bool:
        d = self.domain
        if d.flat or (node.dim,) != d.rdims or not same_shape(node.src.shape, d.shape):
            return False
        if self.variant == "chunked" and not self.cur.final:
            return False
        if self.variant != "chunked" and self.cur is not self.main:
            return False
        return [v.code for v in idx] == [v.code for v in self.full_index()]

    def _scan(self, node: ir.Scan, idx: tuple[Val, ...], lin: Val | None = None) -> Val:
        if not self._inline_scan(node, idx):
            return self._load_buffer(self.buffer_of(node), idx)
        v = self.value(node.src, idx, self.domain_linear() if self.domain.trailing else None)
        fmask = self._mask("f")
        acc_ty = "tl.float32" if node.kind == "f" else "tl.int64"
        x = v.code if node.kind == "f" or v.kind == "i" else f"{v.code}.to(tl.int64)"
        identity = {"sum": "0", "prod": "1", "logsumexp": "float('-inf')"}[node.op]
        if node.kind == "f" and node.op != "logsumexp":
            identity += ".0"
        masked = self.emit(f"tl.where({fmask}, {x}, {identity})", "f", node.kind, [v])
        if node.op == "sum":
            scan = f"tl.cumsum({masked.code}, axis=1)"
            total = f"tl.sum({masked.code}, axis=1, keep_dims=True)"
        else:
            fn = "_mul_combine" if node.op == "prod" else "_logaddexp_combine"
            self.helpers.add(fn)
            scan = f"tl.associative_scan({masked.code}, 1, {fn})"
            total = f"tl.reduce({masked.code}, 1, {fn}, keep_dims=True)"
        if self.variant != "chunked":
            return self.emit(scan, "f", node.kind, [masked])
        carry = self._fresh("carry")
        self.cur.pre.append(f"{carry} = tl.full([ROWS, 1], {identity}, {acc_ty})")
        name = self._fresh("sc")
        if node.op == "logsumexp":
            self.cur.lines += [
                f"{name} = _logaddexp_combine({scan}, {carry})",
                f"{carry} = _logaddexp_combine({carry}, {total})",
            ]
        else:
            combine = "+" if node.op == "sum" else "*"
            self.cur.lines += [f"{name} = {scan} {combine} {carry}", f"{carry} = {carry} {combine} {total}"]
        return Val(name, "f", node.kind, self.cur)

    # --- stores -----------------------------------------------------------------------------------
    def _tile(self, v: Val, cat: str) -> str:
        """`v` broadcast to the store's tile shape."""
        if v.cat == cat or (v.cat in ("c", "f") and self.domain.flat):
            return v.code
        shape = self._tile_shape(cat)
        ty = {"f": "tl.float32", "i": "tl.int64", "b": "tl.int1"}[v.kind]
        if v.kind == "b":
            return (
                f"(tl.zeros({shape}, dtype=tl.int32) + tl.where({v.code}, 1, 0)) != 0"
                if v.tensor
                else f"(tl.zeros({shape}, dtype=tl.int32) + {int(v.code == 'True')}) != 0"
            )
        return f"(tl.zeros({shape}, dtype={ty}) + {v.code})"

    def _tile_shape(self, cat: str) -> str:
        return {"r": "[ROWS, 1]", "f": "[ROWS, BLOCK]", "c": "[BLOCK]"}[cat]

    def _store(self, buf: Buffer, offset: Val, v: Val, cat: str) -> str:
        pointer = self._pointer(f"p_{buf.name}", buf.name)
        mask = self._mask(cat)
        value = self._tile(v, cat)
        addr = f"{pointer} + {offset.code}" if offset.code != "0" else pointer
        mask_part = f", mask={mask}" if mask else ""
        return f"tl.store({addr}, ({value}).to({pointer}.dtype.element_ty){mask_part})"

    def build(self) -> str:
        """Emit every store; returns the kernel's source."""
        full = [s for s in self.stores if s.mode == "full"]
        rows = [s for s in self.stores if s.mode == "row"]
        if full:
            final = self._region("loop") if self.variant == "chunked" else self.main
            final.final = True
            if self.variant == "chunked":
                self.regions.insert(self._pos(self.tail), final)
            self.cur = final
            for store in full:
                self.computing.add(id(store.node))
                lin = self.domain_linear() if self.domain.flat or self.domain.trailing else None
                v = self.value(store.node, self.full_index(), lin)
                self.computing.discard(id(store.node))
                offset = self.domain_linear()
                cat = "c" if self.domain.flat else "f"
                self.cur.lines.append(self._store(store.buffer, offset, v, cat))
            if self.variant == "chunked":
                final.closed = True
            self.cur = self.main if self.variant != "chunked" else self.tail
        for store in rows:
            idx = self.row_index()
            if store.keepdim:
                full_idx = list(ZERO for _ in self.domain.shape)
                for d, v_idx in zip(self.domain.kept, idx):
                    full_idx[d] = v_idx
                idx = tuple(full_idx)
            v = self.value(store.node, idx)
            self.tail.lines.append(self._store(store.buffer, self.rows(), v, "r"))
        return self._render()

    # --- rendering ----------------------------------------------------------------------------------
    def _render(self) -> str:
        body: list[str] = []
        d = self.domain
        body.append("pid = tl.program_id(0)")
        body.append("if I64:")
        body.append("    pid = pid.to(tl.int64)")
        if d.flat:
            n = self.size(product(d.shape)).code
            body += ["cols = pid * BLOCK + tl.arange(0, BLOCK)", f"cmask = cols < {n}"]
        elif d.inner_tiled:
            n_inner = self.size(d.inner()).code
            body += [
                f"blocks = ({n_inner} + ROWS - 1) // ROWS",
                "outer = pid // blocks",
                "rin = (pid % blocks) * ROWS + tl.arange(0, ROWS)[:, None]",
                f"rmask = rin < {n_inner}",
                f"rows = outer * {n_inner} + rin",
            ]
        else:
            m = self.size(d.rows()).code
            body += ["rows = pid * ROWS + tl.arange(0, ROWS)[:, None]", f"rmask = rows < {m}"]
        if not d.flat and self.variant != "chunked":
            r = self.size(d.cols()).code
            body += ["cols = tl.arange(0, BLOCK)[None, :]", f"cmask = cols < {r}", "fmask = rmask & cmask"]
        r_code = self.size(d.cols()).code if not d.flat else ""
        for region in self.regions:
            if region.kind == "loop":
                body += region.pre
                k = region.ident
                body.append(f"for start{k} in range(0, {r_code}, BLOCK):")
                loop_body = [
                    f"cols{k} = start{k} + tl.arange(0, BLOCK)[None, :]",
                    f"cmask{k} = cols{k} < {r_code}",
                    f"fmask{k} = rmask & cmask{k}",
                    *region.lines,
                ]
                body += ["    " + line for line in loop_body]
            else:
                body += region.pre + region.lines
        args = self.signature()
        head = f"@triton.jit\ndef {self.name}(\n" + "".join(f"    {a},\n" for a in args) + "):\n"
        return head + "".join(f"    {line}\n" for line in body)

    def signature(self) -> list[str]:
        consts = ["ROWS: tl.constexpr", "BLOCK: tl.constexpr", "I64: tl.constexpr"]
        flags = [f"{f}: tl.constexpr" for f in self.params.flags]
        return [*self.params.pointers, *self.params.scalars, *flags, *consts]


_H = Callable[[KernelEmitter, Any, tuple[Val, ...], "Val | None"], Val]
KernelEmitter._HANDLERS = {
    ir.Input: KernelEmitter._load_input,
    ir.Scalar: KernelEmitter._scalar,
    ir.FloatParam: KernelEmitter._float_param,
    ir.SizeValue: KernelEmitter._size_value,
    ir.Pointwise: KernelEmitter._pointwise,
    ir.Broadcast: KernelEmitter._broadcast,
    ir.Reshape: KernelEmitter._reshape,
    ir.Permute: KernelEmitter._permute,
    ir.Slice: KernelEmitter._slice,
    ir.Rev: KernelEmitter._rev,
    ir.Cat: KernelEmitter._cat,
    ir.Gather: KernelEmitter._gather,
    ir.Index: KernelEmitter._index,
    ir.AsStrided: KernelEmitter._as_strided,
    ir.Iota: KernelEmitter._iota,
    ir.Split: KernelEmitter._split,
    ir.Reduce: KernelEmitter._reduce,
    ir.MatMul: KernelEmitter._matmul,
    ir.Scan: KernelEmitter._scan,
}


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


def dtype_code(dtype: torch.dtype) -> str:
    return f"torch.{str(dtype).replace('torch.', '')}"
