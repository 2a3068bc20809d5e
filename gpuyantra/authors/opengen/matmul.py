"""Triton source for a matmul kernel of the plan: one product's (m, n) tiles, with the elementwise
work before it (operands) and after it (epilogue) fused in.

A program owns one [BLOCK_M, BLOCK_N] tile of one batch index (a flat grid: batch-major, the tiles
of a batch GROUP_M-swizzled so that neighbouring programs share operand tiles in L2). The K loop
evaluates the operands' IR at tile indices, so transposes, broadcast batch dims and slices are
strided loads (never copies) and elementwise prologues are computed on the loaded tiles; products
are summed in float32 (`tl.dot`: IEEE for float32 operands, TF32 would not meet float32 accuracy;
the tensor cores for 16-bit ones), or, on the GEMV path (a few rows or columns: bandwidth-bound),
as broadcast products summed over K. The epilogue evaluates the stored values with the product
read from the accumulator.

One kernel serves three constexpr modes: 0 the whole K range and the epilogue; 1 one K slice, its
float32 partial sums stored to a scratch buffer (split-K: few tiles, long K); 2 the slices' sums
added in a fixed order (deterministic), then the epilogue.

Index categories follow emit.py ("r" a column vector, "c" a row vector, "f" a tile), per phase:
operand a is [BLOCK_M, BLOCK_K] (rm, ka), operand b [BLOCK_K, BLOCK_N] (kb, rn), the epilogue
[BLOCK_M, BLOCK_N] (rm, rn); masks and tile shapes follow the phase.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import sympy

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.emit import KernelEmitter
from gpuyantra.authors.opengen.kernel import ZERO, Buffer, Domain, Store, Val
from gpuyantra.authors.opengen.spec import Unsupported
from gpuyantra.authors.opengen.symbolic import product, same_shape

# The K index divided or reduced on a line of the K loop: `i10 = ka // 9`, `i11 = kb % 9`.
_K_GATHER = re.compile(r"\bk[ab]\b\s*(//|%)")

# Per phase: the mask and the tile shape of each index category.
_MASKS = {
    "a": {"r": "rmask", "c": "kmask_a", "f": "amask"},
    "b": {"r": "kmask_b", "c": "cmask", "f": "bmask"},
    "out": {"r": "rmask", "c": "cmask", "f": "fmask"},
}
_TILES = {
    "a": {"r": "[BLOCK_M, 1]", "c": "[1, BLOCK_K]", "f": "[BLOCK_M, BLOCK_K]"},
    "b": {"r": "[BLOCK_K, 1]", "c": "[1, BLOCK_N]", "f": "[BLOCK_K, BLOCK_N]"},
    "out": {"r": "[BLOCK_M, 1]", "c": "[1, BLOCK_N]", "f": "[BLOCK_M, BLOCK_N]"},
}
# Extra runtime arguments of every matmul kernel (after the IR's own): scratch, K per slice, slices.
MATMUL_ARGS = ("_part", "_kps", "_nsplit")
MATMUL_CONSTS = ("MODE", "USE_DOT", "DOT", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "I64")


class MatmulEmitter(KernelEmitter):
    """Writes the @triton.jit function of one matmul domain (see the module docstring)."""

    def __init__(
        self,
        name: str,
        domain: Domain,
        stores: Sequence[Store],
        buffer_of: Callable[[ir.Node], Buffer],
        size_code: Callable[[sympy.Expr], str],
    ):
        super().__init__(name, domain, stores, "matmul", buffer_of, size_code)
        if domain.mm is None:
            raise Unsupported("internal: a matmul kernel without its product")
        self.mm: ir.MatMul = domain.mm
        self.phase = "out"
        self.loop = self._region("loop")
        self.post = self._region("post")
        self.regions += [self.loop, self.post]
        self.out_codes: tuple[str, ...] = ()
        self.operands: tuple[str, str] = ("", "")
        self.offset: Val = ZERO
        self.live: str | None = None  # tiles the output masks keep constant skip their K loop
        # Inputs operand b reads directly along K: {input name: its dim indexed by kb}
        self.b_k_dims: dict[str, int] = {}

    def _mask(self, cat: str) -> str | None:
        return None if cat == "s" else _MASKS[self.phase][cat]

    def _tile_shape(self, cat: str) -> str:
        return _TILES[self.phase][cat]

    def matmul_value(self, node: ir.MatMul, idx: tuple[Val, ...]) -> Val:
        if node is self.mm and self.phase == "out" and tuple(v.code for v in idx) == self.out_codes:
            return Val("acc", "f", "f", self.main)
        return super().matmul_value(node, idx)

    def _full_tile(self, v: Val) -> str:
        """The operand as a full tile, zero past the edges (a prologue may map 0 to nonzero)."""
        code = v.code if v.kind == "f" else f"({v.code}).to(tl.float32)"
        return f"tl.where({_MASKS[self.phase]['f']}, {code}, 0.0)"

    def build(self) -> str:
        mm = self.mm
        batch_shape = mm.shape[:-2]
        self.cur = self.main
        batch = self.unravel(Val("bat", "s", "i", self.main), batch_shape) if batch_shape else []
        rm, rn = Val("rm", "r", "i", self.main), Val("rn", "c", "i", self.main)
        out_idx = (*batch, rm, rn)
        self.out_codes = tuple(v.code for v in out_idx)
        self.offset = self.ravel(out_idx, mm.shape)  # the tile's row-major offset (outputs, partials)
        self.live = self._live_tile(out_idx)
        self.cur = self.loop
        self.phase = "a"
        a = self.value(mm.a, (*batch, rm, Val("ka", "c", "i", self.loop)))
        a_code = self._full_tile(a)
        self.phase = "b"
        b = self.value(mm.b, (*batch, Val("kb", "r", "i", self.loop), rn))
        self.operands = (a_code, self._full_tile(b))
        self.cur = self.post
        self.phase = "out"
        for store in self.stores:
            node = store.node
            if same_shape(node.shape, mm.shape):
                idx = list(out_idx)
            else:  # the product under a reshape (a 3-D input times a matrix): same row-major order
                idx = self._reshape_index(node.shape, mm.shape, out_idx)
            v = self.value(node, idx)
            self.post.lines.append(self._store(store.buffer, self.offset, v, "f"))
        return self._render()

    def _load_input(self, node: ir.Input, idx: tuple[Val, ...], lin: Val | None) -> Val:
        if self.phase == "b":
            k_dims = [d for d, i in enumerate(idx) if i.code == "kb" and node.shape[d] != 1]
            if len(k_dims) == 1:
                self.b_k_dims.setdefault(node.name, k_dims[0])
        return super()._load_input(node, idx, lin)

    def loop_loads(self) -> int:
        """Global loads per step of the K loop. The software pipeline keeps each one's tile in
        shared memory once per extra stage: an operand built from many reads (a concatenation,
        a piecewise gather) loads many."""
        lines = [*self.loop.pre, *self.loop.lines, *self.operands]
        return max(1, sum(line.count("tl.load(") for line in lines))

    def gathers_along_k(self) -> bool:
        """Whether an operand's addresses divide or reduce the K index (a convolution's window,
        channel and tap from one K index), rather than step along it. Such K loops computed wrong
        values on an H200 when software-pipelined (`_mm_plan`'s `pipelined`)."""
        return any(_K_GATHER.search(line) for line in [*self.loop.pre, *self.loop.lines])

    def _live_tile(self, out_idx: tuple[Val, ...]) -> str | None:
        """When every store is where(mask, ..., constant) with a mask the product does not decide
        (triu/tril of a product): code that is 0 for a tile the masks keep entirely constant, so
        that its K loop is skipped; None otherwise."""
        conds: list[ir.Node] = []
        for store in self.stores:
            node = store.node
            if not (isinstance(node, ir.Pointwise) and node.op == "where" and isinstance(node.args[2], ir.Scalar)):
                return None
            if not same_shape(node.shape, self.mm.shape) or ir.reaches(node.args[0], self.mm):
                return None
            conds.append(node.args[0])
        lanes = []
        for cond in conds:
            v = self.value(cond, self._broadcast_index(cond, out_idx))
            if not v.tensor:
                return None
            lanes.append(f"({v.code})" if v.kind == "b" else f"({v.code} != 0)")
        code = f"tl.where(fmask & {' & '.join(lanes) if len(lanes) == 1 else '(' + ' | '.join(lanes) + ')'}, 1, 0)"
        return self.emit(f"tl.max(tl.max({code}, axis=1), axis=0)", "s", "i", []).code

    def _render(self) -> str:
        mm = self.mm
        m = self.size(mm.shape[-2]).code
        n = self.size(mm.shape[-1]).code
        k = self.size(mm.a.shape[-1]).code
        total = self.size(product(mm.shape)).code
        a_code, b_code = self.operands
        body = [
            "pid = tl.program_id(0)",
            "if I64:",
            "    pid = pid.to(tl.int64)",
            "if MODE == 1:  # programs of one tile take consecutive K slices",
            "    pid_k = pid % _nsplit",
            "    pid = pid // _nsplit",
            "else:",
            "    pid_k = 0",
            f"tiles_m = ({m} + BLOCK_M - 1) // BLOCK_M",
            f"tiles_n = ({n} + BLOCK_N - 1) // BLOCK_N",
            "tiles = tiles_m * tiles_n",
            "bat = pid // tiles",
            "tile = pid % tiles",
            "per_group = GROUP_M * tiles_n  # GROUP_M row tiles sweep the columns together (L2 reuse)",
            "first_m = (tile // per_group) * GROUP_M",
            "group_rows = tl.minimum(tiles_m - first_m, GROUP_M)",
            "pid_m = first_m + (tile % per_group) % group_rows",
            "pid_n = (tile % per_group) // group_rows",
            "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)[:, None]",
            "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]",
            f"rmask = rm < {m}",
            f"cmask = rn < {n}",
            "fmask = rmask & cmask",
            *self.main.pre,
            *self.main.lines,
            "acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)",
            "if MODE == 2:  # the K slices' partial sums, added in a fixed order",
            f"    part = _part + {self.offset.code}",
            "    for ks in range(0, _nsplit):",
            "        acc += tl.load(part, mask=fmask, other=0.0)",
            f"        part += {total}  # 64-bit pointer steps: no int32 product of slice and size",
            "else:",
            "    k_lo = pid_k * _kps",
            f"    k_hi = tl.minimum(k_lo + _kps, {k})",
            *(
                [f"    k_hi = tl.where({self.live} > 0, k_hi, k_lo)  # a tile the output mask zeroes needs no products"]
                if self.live
                else []
            ),
            "    for k0 in range(k_lo, k_hi, BLOCK_K):",
            "        ka = k0 + tl.arange(0, BLOCK_K)[None, :]",
            "        kb = k0 + tl.arange(0, BLOCK_K)[:, None]",
            "        if I64:",
            "            ka = ka.to(tl.int64)",
            "            kb = kb.to(tl.int64)",
            "        kmask_a = ka < k_hi",
            "        kmask_b = kb < k_hi",
            "        amask = rmask & kmask_a",
            "        bmask = kmask_b & cmask",
            *("        " + line for line in self.loop.pre + self.loop.lines),
            f"        a_tile = {a_code}",
            f"        b_tile = {b_code}",
            "        if USE_DOT:",
            "            if DOT == 0:  # float32: IEEE products on the FMA units (TF32 alone is not float32 accuracy)",
            '                acc = tl.dot(a_tile, b_tile, acc, input_precision="ieee")',
            "            elif DOT == 3:  # float32 on tensor cores: operands split in two TF32 parts, three products",
            '                acc = tl.dot(a_tile, b_tile, acc, input_precision="tf32x3")',
            "            elif DOT == 1:",
            "                acc = tl.dot(a_tile.to(tl.float16), b_tile.to(tl.float16), acc)",
            "            else:",
            "                acc = tl.dot(a_tile.to(tl.bfloat16), b_tile.to(tl.bfloat16), acc)",
            "        else:  # GEMV: a few rows or columns, bandwidth-bound; broadcast products, float32 sums",
            "            acc += tl.sum(a_tile[:, :, None] * b_tile[None, :, :], axis=1)",
            "if MODE == 1:",
            f"    tl.store(_part + pid_k * {total} + {self.offset.code}, acc, mask=fmask)",
            "else:",
            *("    " + line for line in self.post.pre + self.post.lines),
        ]
        args = self.signature()
        head = f"@triton.jit\ndef {self.name}(\n" + "".join(f"    {a},\n" for a in args) + "):\n"
        return head + "".join(f"    {line}\n" for line in body)

    def signature(self) -> list[str]:
        flags = [f"{f}: tl.constexpr" for f in self.params.flags]
        consts = [f"{c}: tl.constexpr" for c in MATMUL_CONSTS]
        return [*self.params.pointers, *self.params.scalars, *MATMUL_ARGS, *flags, *consts]


def make_emitter(
    name: str,
    domain: Domain,
    stores: Sequence[Store],
    variant: str,
    buffer_of: Callable[[ir.Node], Buffer],
    size_code: Callable[[sympy.Expr], str],
) -> KernelEmitter:
    """The emitter for a kernel of the plan: a matmul kernel for a matmul domain."""
    if domain.mm is not None:
        return MatmulEmitter(name, domain, stores, buffer_of, size_code)
    return KernelEmitter(name, domain, stores, variant, buffer_of, size_code)
