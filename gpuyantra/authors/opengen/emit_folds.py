"""Kernel emission of reductions, products and scans. A reduction whose source has the domain's
shape and folds exactly the reduced dims, read at the current row, is computed inline as a pass
over the row (in the chunked variant: a loop over column slices with its accumulators, then the
row's result); a scan along the reduced dim runs inline in the loop that stores full tiles,
carrying its running total between slices. Any other reduction, scan or product is read from the
buffer another kernel wrote.
"""

from __future__ import annotations

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.emit_tile import TileEmitter
from gpuyantra.authors.opengen.kernel import Region, Val
from gpuyantra.authors.opengen.spec import Unsupported
from gpuyantra.authors.opengen.symbolic import same_shape


class FoldEmitter(TileEmitter):
    """The handlers of reductions, products and scans (see the module docstring)."""

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

    def _pass_regions(self, node: ir.Reduce) -> tuple[Region, Region]:
        """A loop + post region placed before the code that needs their result. Folds computed
        from the inputs alone (no other fold's result) share one loop, so slices they both read
        are loaded once (a triplet loss's anchor, two distances from it)."""
        if self.variant != "chunked":
            return self.main, self.main
        at = self._pos(self.cur) if self.cur.kind == "loop" else self._pos(self.tail)
        independent = not any(isinstance(n, (ir.Reduce, ir.Scan, ir.MatMul)) for n in ir.nodes_from(node.src))
        shared = self.shared_pass
        if independent and shared is not None and shared[1] in self.regions and self._pos(shared[1]) < at:
            return shared
        loop, post = self._region("loop"), self._region("post")
        self.regions[at:at] = [loop, post]
        if independent and shared is None:
            self.shared_pass = (loop, post)
        return loop, post

    def _reduce_pass(self, node: ir.Reduce) -> Val:
        loop, post = self._pass_regions(node)
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
        if self.variant == "chunked" and self.cur.reverse not in (None, node.reverse):
            return False  # the loop already runs the other way for another scan: this one from a buffer
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
        reverse = ", reverse=True" if node.reverse else ""
        if node.op == "sum":
            scan = f"tl.cumsum({masked.code}, axis=1{reverse})"
            total = f"tl.sum({masked.code}, axis=1, keep_dims=True)"
        else:
            fn = "_mul_combine" if node.op == "prod" else "_logaddexp_combine"
            self.helpers.add(fn)
            scan = f"tl.associative_scan({masked.code}, 1, {fn}{reverse})"
            total = f"tl.reduce({masked.code}, 1, {fn}, keep_dims=True)"
        if self.variant != "chunked":
            return self.emit(scan, "f", node.kind, [masked])
        self.cur.reverse = node.reverse  # a reverse scan carries from the last slice to the first
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
