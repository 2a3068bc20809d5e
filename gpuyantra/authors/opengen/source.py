"""Assemble the candidate file: header, strategy block, kernels, and the host `entry`.

entry reads every size from its actual inputs (`x.shape[d]`), allocates outputs and float32
intermediates, and launches each kernel of the plan: a row kernel picks its single-block variant
when the reduced length fits BLOCK_R_MAX and its chunked variant otherwise; rows per program and
the grid come from the run-time sizes (no cap: the grid is one dim, programs tile the rows).
Non-contiguous inputs are read through their strides (a constexpr flag per input selects the
plain row-major offset when the input happens to be contiguous). Host code only allocates and
reads metadata; every value is computed by the kernels.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import sympy
import torch

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.construct import SPLIT_CHUNK, SPLIT_PARTS
from gpuyantra.authors.opengen.emit import KernelEmitter
from gpuyantra.authors.opengen.kernel import Buffer, dtype_code
from gpuyantra.authors.opengen.lower import Lowered, lower
from gpuyantra.authors.opengen.matmul import MatmulEmitter, make_emitter
from gpuyantra.authors.opengen.ops import HELPERS, LIBDEVICE_HELPERS
from gpuyantra.authors.opengen.plan import LARGE_WINDOW, WINDOW_GATHERS, KernelPlan, Plan, Planner
from gpuyantra.authors.opengen.spec import OpenSpec, Unsupported
from gpuyantra.authors.opengen.strategy import COMMENTS, MATMUL_KNOBS, normalize
from gpuyantra.authors.opengen.symbolic import host_code, literal, product
from gpuyantra.authors.opengen.trace import check_size_generic, trace_spec

_TEMP_DTYPES = {"f": torch.float32, "i": torch.int64, "b": torch.bool}

# Host helper of files with a matmul kernel: the launch configuration from the run-time sizes.
MM_PLAN = """# Shared memory the K loop's pipeline buffers may take (an H100/H200 block has 227 KB; the
# operands of tl.dot and the epilogue need the rest).
MM_SMEM_BYTES = 180 * 1024


def _mm_plan(batch, m, n, k, dtype, interpreted, loads=2, pipelined=True):
    # (gemv, dot kind, BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, K slices, K per slice) for a
    # (batch, m, k) x (batch, k, n) product of `dtype` operands, with `loads` global loads per K
    # step. Triton's CPU interpreter (no GPU) pays per program and per op, not per element: there,
    # few large tiles and no auto split.
    dot = 1 if dtype == torch.float16 else 2 if dtype == torch.bfloat16 else 0
    if dot == 0 and MM_F32_TC and not interpreted:
        dot = 3  # float32 operands: three TF32 tensor-core products per pair (see MM_F32_TC)
    p2 = triton.next_power_of_2
    if min(m, n) <= GEMV_MAX:
        # a few rows or columns (matrix-vector): bandwidth-bound, broadcast products in registers
        bk = min(GEMV_BLOCK_K, p2(k))
        budget = GEMV_TILE * (8 if interpreted else 1)
        if m <= n:
            bm = p2(m)
            bn = max(1, min(p2(n), budget // (bm * bk)))
        else:
            bn = p2(n)
            bm = max(1, min(p2(m), budget // (bn * bk)))
        gemv, warps, stages = True, 4, 2
    else:
        bm, bn, bk = MM_BLOCK_M, MM_BLOCK_N, MM_BLOCK_K
        if dot == 0 and not interpreted:
            # float32 IEEE products run on the FMA units: half-size tiles keep the accumulators in registers
            bm, bn = max(16, bm // 2), max(16, bn // 2)
        bm = min(bm, max(16, p2(m)))
        bn = min(bn, max(16, p2(n)))
        bk = min(bk, max(16, p2(k)))
        gemv, warps, stages = False, MM_WARPS or max(1, min(8, bm * bn // 1024)), MM_STAGES
    # Each pipeline stage keeps every load's tile in shared memory: a gathered operand (27 loads of
    # [64, 32] float32 per step) needed 442 KB at 3 stages, past the GPU's 227 KB, and float32
    # 128x64 tiles on tensor cores 256 KB at 3 stages (two loads of 32 KB per stage, and tf32x3's
    # split operands).
    tile_bytes = max(bm * bk, bk * bn) * dtype.itemsize
    stages = max(1, min(stages, MM_SMEM_BYTES // (loads * tile_bytes)))
    if not pipelined:
        # An operand gathered along K (a convolution's window: channel and tap from one K index)
        # came out wrong on 70-99 % of elements on an H200 with a software-pipelined K loop, and
        # right with one stage at every size tried.
        stages = 1
    tiles = batch * triton.cdiv(m, bm) * triton.cdiv(n, bn)
    k_blocks = triton.cdiv(k, bk)
    split = MM_SPLIT_K
    if split == 0 and interpreted:
        split = 1
    elif split == 0:
        # few tiles and a long K (a large-K product, a matrix-vector product): K slices fill the GPU
        few = tiles < MM_PROGRAMS // 2 and k_blocks >= 8
        split = min(k_blocks // 4, triton.cdiv(MM_PROGRAMS, tiles), 64) if few else 1
    split = max(1, min(split, k_blocks))
    kps = triton.cdiv(k_blocks, split) * bk
    return gemv, dot, bm, bn, bk, warps, stages, triton.cdiv(k, kps), kps


def _k_major(t, d):
    # Operand b K-major (dim d of t contiguous) for float32 products on tensor cores (DOT 3): on an
    # H200 a 4096^3 float32 product took 2.1 ms with b K-major and 4.3 ms with b N-major (the
    # row-major B of A @ B). The copy reads and writes K x N elements once, a transpose at 0.5-1
    # TB/s: it paid at 512 rows (batched 512x1024x2048: 8.7 -> 6.7 ms) and not at 256 (256 x 2^19
    # x 256: 2.3 -> 4.6 ms), hence only from 512 rows up.
    if t.dim() < 2 or t.stride(d) == 1 or 0 in t.stride():  # a broadcast view would grow
        return t
    return t.movedim(d, -1).contiguous().movedim(-1, d)
"""


# Host helper of every file: the launch options that keep PyTorch's CUDA rounding (see ops.py).
NUMERICS = """def _numerics(dev, matmul):
    # Launch options for torch's rounding on CUDA: libdevice keeps subnormals (Triton flushes them to
    # zero by default; torch does not), and outside matmuls no product and sum fuse into one FMA (eager
    # rounds after each op). The interpreter ignores them; Triton's ROCm backend has no reflect-ftz.
    opts = {} if matmul else {"enable_fp_fusion": False}
    if dev.type == "cuda" and torch.version.hip is None:  # (triton.runtime is closed to candidates)
        opts["enable_reflect_ftz"] = False
    return opts
"""


Analysis = tuple[Lowered, Plan, dict[sympy.Symbol, str]]
_ANALYSES: dict[int, tuple[OpenSpec, Analysis | Unsupported]] = {}


def analyse(spec: OpenSpec) -> Analysis:
    """Trace, lower and plan the spec's computation (raises Unsupported). Remembered per spec
    object: strategies only change the rendering."""
    hit = _ANALYSES.get(id(spec))
    if hit is None or hit[0] is not spec:
        try:
            result: Analysis | Unsupported = _analyse(spec)
        except Unsupported as exc:
            result = exc
        if len(_ANALYSES) > 32:
            _ANALYSES.clear()
        hit = (spec, result)
        _ANALYSES[id(spec)] = hit
    if isinstance(hit[1], Unsupported):
        raise Unsupported(str(hit[1]))
    return hit[1]


def _analyse(spec: OpenSpec) -> Analysis:
    traced = trace_spec(spec)
    lowered = lower(traced, spec)  # first: an op the author refuses is the better reason
    check_size_generic(spec, traced)
    check_live_sizes(spec, lowered)
    order = sorted(
        lowered.symbols, key=lambda sym: (spec.input_names.index(lowered.symbols[sym][0]), lowered.symbols[sym][1])
    )
    names = {sym: f"_sz{k}" for k, sym in enumerate(order)}
    names.update({sym: str(sym) for sym, _ in lowered.derived})
    names.update({SPLIT_PARTS: "SPLIT_PARTS", SPLIT_CHUNK: "SPLIT_CHUNK"})
    plan = Planner(lowered, lambda e: host_code(e, names)).plan()
    return lowered, plan, names


def check_live_sizes(spec: OpenSpec, lowered: Lowered) -> None:
    """Refuse a trace that bakes a size the target says changes between calls, or that cannot
    compute one of the live calls (a dim of a later input traced as following another input's
    where a live call broadcasts it): the kernel would be wrong there, not merely slow."""
    if spec.variable_dims is not None:
        for inp, dims in zip(lowered.inputs, spec.variable_dims):
            for d in dims:
                if d < len(inp.shape) and literal(inp.shape[d]) is not None:
                    raise Unsupported(
                        f"dim {d} of input {inp.name} changes between calls, but the traced computation "
                        f"fixes it at {literal(inp.shape[d])}"
                    )
    for call in spec.calls:
        if len(call) != len(lowered.inputs):
            raise Unsupported(f"a live call passes {len(call)} inputs, the forward takes {len(lowered.inputs)}")
        shapes = {inp.name: tuple(int(d) for d in shape) for inp, shape in zip(lowered.inputs, call)}
        values = {sym: shapes[name][dim] for sym, (name, dim) in lowered.symbols.items() if dim < len(shapes[name])}
        for inp in lowered.inputs:
            got = shapes[inp.name]
            want = [sympy.sympify(e).subs(values) for e in inp.shape]
            if len(got) != len(want) or any(literal(w) != g for w, g in zip(want, got)):
                raise Unsupported(
                    f"a live call passes {inp.name} of shape {list(got)}, which the traced computation "
                    f"cannot take (it computes {inp.name} of shape {[str(w) for w in want]})"
                )


RESERVED = frozenset({"torch", "triton", "tl", "math", "entry", "OP", "ADAPTER"})


def write_open_source(spec: OpenSpec, strategy: dict[str, Any] | None = None) -> str:
    """A candidate file computing the spec's module (see the package docstring). Raises Unsupported."""
    names_used = list(spec.input_names) + spec.keywords
    for name in names_used:
        if not name.isidentifier() or name in RESERVED or name.startswith("_"):
            raise Unsupported(f"entry parameter name {name!r} would shadow the file's own names")
    if len(set(names_used)) != len(names_used):
        raise Unsupported("entry parameter names repeat")
    lowered, plan, names = analyse(spec)
    return _File(spec, lowered, plan, names, normalize(strategy)).render()


class _File:
    def __init__(
        self, spec: OpenSpec, lowered: Lowered, plan: Plan, names: dict[sympy.Symbol, str], strategy: dict[str, Any]
    ):
        self.spec = spec
        self.lowered = lowered
        self.plan = plan
        self.names = names
        self.strategy = strategy
        self.helpers: set[str] = set()
        self.kernels: list[str] = []
        self.launches: list[str] = []
        self.buffers = {id(b.node): b for b in plan.temps if b.node is not None}
        self.has_matmul = False

    def size(self, expr: sympy.Expr) -> str:
        return host_code(expr, self.names)

    def buffer_of(self, node: ir.Node) -> Buffer:
        buf = self.buffers.get(id(node))
        if buf is None:
            raise Unsupported("internal: a kernel reads a value no earlier kernel writes")
        return buf

    # --- kernels --------------------------------------------------------------------------------
    def _emit(self, kp: KernelPlan, variant: str, name: str) -> KernelEmitter:
        em = make_emitter(name, kp.domain, kp.stores, variant, self.buffer_of, self.size)
        self.kernels.append(em.build())
        self.helpers |= em.helpers
        return em

    def _kernel(self, kp: KernelPlan) -> None:
        what = ", ".join(f"{s.buffer.name} ({s.mode})" for s in kp.stores)
        if kp.domain.mm is not None:
            self._matmul_kernel(kp, kp.domain.mm, what)
            return
        if kp.domain.flat:
            em = self._emit(kp, "flat", kp.name)
            n = self.size(product(kp.domain.shape))
            gathers = kp.gathers
            window = gathers >= WINDOW_GATHERS
            block = "FLAT_BLOCK"
            if window:
                block = "max(16, GATHER_BLOCK // 4)" if gathers >= LARGE_WINDOW else "GATHER_BLOCK"
            warps = "NUM_WARPS or max(1, min(8, _blk // 128))" if window else "_warps(_blk)"
            self.launches += [
                f"# {kp.name}: elementwise over {_shape_text(kp.domain.shape)} -> {what}",
                f"_n = {n}",
                f"_blk = min({block}, triton.next_power_of_2(max(_n, 1)))",
                f"{kp.name}[(triton.cdiv(max(_n, 1), _blk),)](",
                *self._args(em, "1", "_blk", warps),
                ")",
            ]
            return
        single = self._emit(kp, "single", f"{kp.name}_single")
        chunked = self._emit(kp, "chunked", f"{kp.name}_chunked")
        folded = [_shape_text(kp.domain.shape), str(list(kp.domain.rdims))]
        head = [
            f"# {kp.name}: rows of {folded[0]} folding dims {folded[1]} -> {what}",
            f"_m = {self.size(kp.domain.rows())}",
            f"_r = {self.size(kp.domain.cols())}",
            "_blk = triton.next_power_of_2(max(_r, 1))",
        ]
        if kp.domain.inner_tiled:
            # Rows are INNER_ROWS consecutive indices of the contiguous last kept dim (coalesced
            # loads down each reduced column), times one index of the other kept dims.
            inner = self.size(kp.domain.inner())
            grid = f"({self.size(kp.domain.outer())} * triton.cdiv(max({inner}, 1), _rows),)"
            choose = [
                f"_rows = max(1, min(INNER_ROWS, triton.next_power_of_2(max({inner}, 1))))",
                "if _blk * _rows <= TILE:",
            ]
            chunk = "max(1, TILE // _rows)"
        else:
            grid = "(triton.cdiv(max(_m, 1), _rows),)"
            choose = [
                "if _blk <= BLOCK_R_MAX:",
                "    _rows = max(1, min(TILE // _blk, triton.next_power_of_2(max(_m, 1))))",
            ]
            chunk = "SCAN_CHUNK" if kp.scans else "CHUNK"
        tile = "SCAN_TILE" if kp.scans else "TILE"
        tail = (
            []
            if kp.domain.inner_tiled
            else [f"    _rows = max(1, min({tile} // {chunk}, triton.next_power_of_2(max(_m, 1))))"]
        )
        self.launches += [
            *head,
            *choose,
            f"    {kp.name}_single[{grid}](",
            *["    " + a for a in self._args(single, "_rows", "_blk", "_warps(_rows * _blk)")],
            "    )",
            "else:",
            *tail,
            f"    {kp.name}_chunked[{grid}](",
            *["    " + a for a in self._args(chunked, "_rows", chunk, f"_warps(_rows * {chunk})")],
            "    )",
        ]

    def _matmul_kernel(self, kp: KernelPlan, mm: ir.MatMul, what: str) -> None:
        """Tile sizes, path (tl.dot or GEMV) and K slices from the run-time sizes (`_mm_plan`); with
        K slices, a partials launch (mode 1) then the epilogue launch (mode 2)."""
        em = self._emit(kp, "matmul", kp.name)
        assert isinstance(em, MatmulEmitter)  # a matmul domain's emitter
        loads = em.loop_loads()
        pipelined = not em.gathers_along_k()
        dims = [self.size(product(mm.shape[:-2])), self.size(mm.shape[-2]), self.size(mm.shape[-1])]
        dims.append(self.size(mm.a.shape[-1]))
        names = _inputs_read(mm)
        floating = [i.name for i in self.lowered.inputs if i.kind == "f" and i.name in names]
        dtype = "torch.float32"
        for name in floating:
            dtype = f"{name}.dtype" if dtype == "torch.float32" else f"torch.promote_types({dtype}, {name}.dtype)"
        p = em.params
        args = [*p.pointers.values(), *p.scalars.values(), "_part", "_kps", "_split"]
        kw = [f"{k}={v}" for k, v in p.flags.items()]
        kw += [
            "MODE=_mode", "USE_DOT=not _gemv", "DOT=_dot", "BLOCK_M=_bm", "BLOCK_N=_bn", "BLOCK_K=_bk",
            "GROUP_M=MM_GROUP_M", "I64=_wide", "num_warps=_mw", "num_stages=_stages", "**_exact_mm",
        ]  # fmt: skip
        # Operand b's inputs K-major for float32 tensor-core products (`_k_major`): the launch reads
        # a copy where the input is not, same values, its own strides.
        k_major = [f"_km_{name} = _k_major({name}, {d}) if _dot == 3 and not _gemv and _mm_m >= 512 else {name}"
                   for name, d in sorted(em.b_k_dims.items())]  # fmt: skip
        for name in sorted(em.b_k_dims):
            args = [re.sub(rf"\b{name}\b", f"_km_{name}", a) for a in args]
            kw = [re.sub(rf"\b{name}\b", f"_km_{name}", a) for a in kw]
        self.launches += [
            f"# {kp.name}: matmul of {_shape_text(mm.a.shape)} by {_shape_text(mm.b.shape)} -> {what}",
            f"_bt, _mm_m, _mm_n, _mm_k = {', '.join(dims)}",
            f"_plan = _mm_plan(_bt, _mm_m, _mm_n, _mm_k, {dtype}, _dev.type != 'cuda', {loads}, {pipelined})",
            "_gemv, _dot, _bm, _bn, _bk, _mw, _stages, _split, _kps = _plan",
            *k_major,
            "_total = _bt * _mm_m * _mm_n",
            "_part = torch.empty((_split * _total if _split > 1 else 1,), dtype=torch.float32, device=_dev)",
            "_wide = _i64 or _split * _total >= 2**31",
            "_tiles = max(1, _bt * triton.cdiv(_mm_m, _bm) * triton.cdiv(_mm_n, _bn))",
            "for _mode in (1, 2) if _split > 1 else (0,):",
            f"    {kp.name}[(_tiles * (_split if _mode == 1 else 1),)](",
            *[f"        {a}," for a in args + kw],
            "    )",
        ]
        self.has_matmul = True

    def _args(self, em: KernelEmitter, rows: str, block: str, warps: str) -> list[str]:
        p = em.params
        args = [*p.pointers.values(), *p.scalars.values()]
        kw = [f"{k}={v}" for k, v in p.flags.items()]
        kw += [f"ROWS={rows}", f"BLOCK={block}", "I64=_i64", f"num_warps={warps}", "**_exact"]
        return [f"    {a}," for a in args + kw]

    # --- entry ------------------------------------------------------------------------------------
    def _entry(self) -> list[str]:
        spec = self.spec
        positional = ", ".join(spec.input_names)
        keywords = spec.keywords
        sig = positional + (", *, " + ", ".join(keywords) if keywords else "")
        lines = [f"def entry({sig}):"]
        body: list[str] = []
        for name, _, live in spec.arguments:
            if not isinstance(live, float):
                # An int or bool argument selects behaviour: the kernels are written for its live value.
                body += [
                    f"if {name} != {live!r}:",
                    f"    raise ValueError(f'{name}={{{name}!r}}: this kernel is written for {name}={live!r}')",
                ]
        for sym, var in sorted(self.names.items(), key=lambda kv: kv[1]):
            if sym in self.lowered.symbols:
                name, dim = self.lowered.symbols[sym]
                body.append(f"{var} = {name}.shape[{dim}]")
        for sym, definition in self.lowered.derived:  # partial counts of split full reductions
            body.append(f"{self.names[sym]} = {self.size(definition)}")
        for inp in self.lowered.inputs:
            # Sizes the trace fixed (or tied to another input's) are checked, never assumed: a call
            # of another shape raises instead of computing a wrong result.
            want = _shape_tuple(inp.shape, self.size)
            body += [
                f"if tuple({inp.name}.shape) != {want}:",
                f"    raise ValueError(f'{inp.name}: shape {{list({inp.name}.shape)}}, this kernel takes {{{want}}}')",
            ]
        body.append(f"_dev = {spec.input_names[0]}.device")
        for buf in self._allocated():
            body.append(
                f"{buf.name} = torch.empty({_shape_tuple(buf.shape, self.size)}, dtype={self._dtype(buf)}, device=_dev)"
            )
        spans = [f"_span({t})" for t in spec.input_names] + [f"{b.name}.numel()" for b in self._allocated()]
        body.append("_i64 = max(" + ", ".join(spans) + ") >= 2**31  # int64 offsets past 2^31 elements")
        for kp in self.plan.kernels:
            self._kernel(kp)
        if any(kp.domain.mm is None for kp in self.plan.kernels):
            body.append("_exact = _numerics(_dev, False)  # launch options: torch's rounding")
        if self.has_matmul:
            body.append("_exact_mm = _numerics(_dev, True)")
        body += self.launches
        outs = [b.name for b in self.plan.outputs]
        if self.lowered.structure == "single":
            body.append(f"return {outs[0]}")
        elif self.lowered.structure == "list":
            body.append("return [" + ", ".join(outs) + "]")
        else:
            body.append("return (" + ", ".join(outs) + ("," if len(outs) == 1 else "") + ")")
        return lines + ["    " + line for line in body]

    def _allocated(self) -> list[Buffer]:
        seen: list[Buffer] = []
        for buf in [*self.plan.outputs, *self.plan.temps]:
            if all(buf is not b for b in seen):
                seen.append(buf)
        return seen

    def _dtype(self, buf: Buffer) -> str:
        outs = self.plan.outputs
        if any(buf is b for b in outs):
            k = next(i for i, b in enumerate(outs) if b is buf)
            traced = self.lowered.out_dtypes[k]
            follows = k < len(self.lowered.follows_input_dtype) and self.lowered.follows_input_dtype[k]
            if follows and traced.is_floating_point:
                return self._follow_dtype(buf)
            return dtype_code(traced)
        return dtype_code(_TEMP_DTYPES[buf.kind])

    def _follow_dtype(self, buf: Buffer) -> str:
        """Floating outputs take the promoted dtype of the floating inputs they read."""
        read = _inputs_read(buf.node) if buf.node is not None else set()
        floating = [i.name for i in self.lowered.inputs if i.kind == "f"]
        names = [n for n in floating if n in read] or floating
        if not names:
            return "torch.float32"
        code = f"{names[0]}.dtype"
        for n in names[1:]:
            code = f"torch.promote_types({code}, {n}.dtype)"
        return code

    # --- the file ---------------------------------------------------------------------------------
    def render(self) -> str:
        entry = self._entry()  # emits the kernels too
        adapter = "ADAPTER = [\n" + "".join(f"    {json.dumps(b)},\n" for b in self.spec.adapter) + "]\n"
        knobs = {k: v for k, v in self.strategy.items() if self.has_matmul or k not in MATMUL_KNOBS}
        strategy = "".join(f"{k} = {v!r}  # {COMMENTS[k]}\n" for k, v in knobs.items())
        helpers = [HELPERS[h] for h in sorted(self.helpers)]
        warps = (
            NUMERICS + "\n\n"
            "def _warps(elems):\n"
            "    # NUM_WARPS, or one warp per 256 elements of the tile (1 to 8)\n"
            "    return NUM_WARPS or max(1, min(8, elems // 256))\n"
            "\n\n"
            "def _span(t):\n"
            "    # elements from the first to the last one a view addresses (a slice of a larger tensor)\n"
            "    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))\n"
        )
        if self.has_matmul:
            warps += "\n\n" + MM_PLAN
        doc = (
            f'"""Open target {self.spec.op}: written by the open author from the traced module.\n\n'
            f"{_describe(self.plan)}\n"
            '"""\n'
        )
        parts = [
            doc,
            "import torch\nimport triton\nimport triton.language as tl\n"
            + ("from triton.language.extra import libdevice\n" if self.helpers & LIBDEVICE_HELPERS else ""),
            f"OP = {json.dumps(self.spec.op)}\n" + adapter,
            "# strategy:begin\n" + strategy + "# strategy:end\n",
            *helpers,
            *self.kernels,
            warps,
            "\n".join(entry) + "\n",
        ]
        return "\n\n".join(p.rstrip("\n") + "\n" for p in parts)


def _inputs_read(node: ir.Node) -> set[str]:
    return {n.name for n in ir.nodes_from(node) if isinstance(n, ir.Input)}


def _shape_text(shape: Sequence[sympy.Expr]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _shape_tuple(shape: Sequence[sympy.Expr], size: Any) -> str:
    items = [size(s) for s in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _describe(plan: Plan) -> str:
    lines = []
    for kp in plan.kernels:
        kind = "elementwise" if kp.domain.flat else f"row kernel folding dims {list(kp.domain.rdims)}"
        if kp.domain.mm is not None:
            kind = "matmul (tiles of the product, epilogue fused)"
        stores = ", ".join(f"{s.buffer.name}" for s in kp.stores)
        lines.append(f"- {kp.name}: {kind} over {_shape_text(kp.domain.shape)} -> {stores}")
    return "Kernels, in launch order:\n" + "\n".join(lines)
