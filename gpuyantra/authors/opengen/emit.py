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

The emitter is a class per concern: emit_tile.py (regions, sizes, index arithmetic, the tile's
indices, loads and stores), emit_values.py (leaves, elementwise and view nodes), emit_folds.py
(reductions, products, scans); the data it works on is in kernel.py. This module assembles them
into KernelEmitter (stores, the kernel's source) with the node-type handler table.
"""

from __future__ import annotations

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.emit_folds import FoldEmitter
from gpuyantra.authors.opengen.emit_values import ValueEmitter
from gpuyantra.authors.opengen.kernel import ZERO
from gpuyantra.authors.opengen.symbolic import product


class KernelEmitter(ValueEmitter, FoldEmitter):
    """Writes one @triton.jit function computing `stores` over `domain` (see module docstring)."""

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
                if region.reverse:  # slices from the last to the first (a reverse scan's carry)
                    body.append(f"for step{k} in range(0, ({r_code} + BLOCK - 1) // BLOCK):")
                    first = [f"start{k} = (({r_code} + BLOCK - 1) // BLOCK - 1 - step{k}) * BLOCK"]
                else:
                    body.append(f"for start{k} in range(0, {r_code}, BLOCK):")
                    first = []
                loop_body = [
                    *first,
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


KernelEmitter._HANDLERS = {
    ir.Input: lambda em, node, idx, lin: em._load_input(node, idx, lin),  # subclasses note their inputs
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
