"""The base of the kernel emitters (emit.py): the code regions of a kernel and common
subexpressions, its sizes and runtime arguments, index arithmetic, the tile's own indices, loads
and stores, and `value`, which evaluates an IR node at an index tuple through the handler table
that emit.py fills.

The node handlers live in emit_values.py (leaves, elementwise and view nodes) and emit_folds.py
(reductions, products, scans); kernel assembly in emit.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import sympy

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.kernel import ZERO, Buffer, Domain, KernelParams, Region, Store, Val, join_cats
from gpuyantra.authors.opengen.ops import LIBDEVICE_FLAG, LIBDEVICE_HELPERS, LIBDEVICE_HOST
from gpuyantra.authors.opengen.spec import Unsupported
from gpuyantra.authors.opengen.symbolic import contiguous_strides, literal, product


class TileEmitter:
    """The state of an emitter writing one @triton.jit function that computes `stores` over
    `domain`, and the machinery every node handler uses (see the module docstring)."""

    _HANDLERS: ClassVar[dict[type, Any]] = {}  # node type -> emission method (filled in emit.py)

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
        self.shared_pass: tuple[Region, Region] | None = None  # the loop folds of the inputs alone share
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

    def use_helpers(self, helpers: Sequence[str]) -> None:
        """The file defines `helpers`; a kernel calling libdevice through them takes the LIBDEVICE
        constexpr (true on a GPU: the interpreter has no libdevice)."""
        self.helpers.update(helpers)
        if LIBDEVICE_HELPERS.intersection(helpers):
            self.params.flags[LIBDEVICE_FLAG] = LIBDEVICE_HOST

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
        return self.emit(code, join_cats(*(d.cat for d in deps)), "i", deps, "i")

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

    # --- loads ------------------------------------------------------------------------------------
    def _load_mask(self, cat: str) -> str | None:
        parts = [m for m in [self._mask(cat)] if m]
        parts += [g.code for g in self.guards]
        return " & ".join(parts) if parts else None

    def _load(self, pointer: str, offset: Val, kind: str, deps: list[Val]) -> Val:
        cat = join_cats(offset.cat, *(g.cat for g in self.guards))
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
        cat = join_cats(lin.cat, strided.cat)
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
