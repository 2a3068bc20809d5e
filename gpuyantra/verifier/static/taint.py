"""Tensor taint in host code: which names hold tensors, and operators applied to them.

entry's tensor parameters seed the taint; it flows through assignments, views, unpacking, loops and
calls of the file's own helpers. Arithmetic, comparisons, augmented assignments and math builtins on
a tainted value compute in torch on the host and fail `torch-compute`. The propagation reads which
helpers return fresh or kernel-written buffers, so it runs after the launch fixpoint (launches.py).
"""

from __future__ import annotations

import ast

from gpuyantra.verifier.static.base import _CheckerBase
from gpuyantra.verifier.static.scopes import _Func
from gpuyantra.verifier.static.tables import (
    TENSOR_ATTRS,
    TENSOR_BUILTINS,
    TENSOR_RETURNING,
    TENSOR_SEQUENCE_METHODS,
    TORCH_ALLOC,
)


class _TaintRules(_CheckerBase):
    """Which host names hold tensors, and the operators that would compute on them in torch."""

    def _is_tensor(self, expr: ast.AST, func: _Func) -> bool:
        if isinstance(expr, ast.Name):
            return expr.id in func.tainted
        if isinstance(expr, ast.Call):
            path = self._resolve(expr.func)
            if path in TORCH_ALLOC:
                return True
            if isinstance(expr.func, ast.Attribute) and path is None:
                return expr.func.attr in TENSOR_RETURNING and self._is_tensor(expr.func.value, func)
            if isinstance(expr.func, ast.Name) and expr.func.id in self.funcs:
                return self.funcs[expr.func.id].returns_fresh or self.funcs[expr.func.id].returns_kernel_output
            return False
        if isinstance(expr, ast.Subscript):
            return self._is_tensor(expr.value, func)
        if isinstance(expr, ast.Attribute):
            return expr.attr in TENSOR_ATTRS and self._is_tensor(expr.value, func)
        if isinstance(expr, ast.IfExp):
            return self._is_tensor(expr.body, func) or self._is_tensor(expr.orelse, func)
        if isinstance(expr, ast.BinOp):
            return self._is_tensor(expr.left, func) or self._is_tensor(expr.right, func)
        if isinstance(expr, ast.UnaryOp):
            return self._is_tensor(expr.operand, func)
        if isinstance(expr, ast.NamedExpr):
            return self._is_tensor(expr.value, func)
        return False

    def _seed_taint(self) -> None:
        entry = self.funcs.get("entry")
        if entry is None or isinstance(entry.node, ast.Lambda):
            return
        args = entry.node.args
        entry.tainted.update(a.arg for a in args.posonlyargs + args.args)
        if args.vararg:
            entry.tainted.add(args.vararg.arg)
        kinds = {}
        if self.family is not None:
            kinds = {p.name: p.kind for p in self.family.params}
        for a in args.kwonlyargs:
            if kinds.get(a.arg, "tensor") == "tensor":
                entry.tainted.add(a.arg)

    def _propagate_taint(self) -> None:
        changed = True
        rounds = 0
        while changed and rounds < 20:
            changed = False
            rounds += 1
            for f in self.all_host_funcs:
                for sub in f.body:
                    names: list[str] = []
                    if isinstance(sub, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and sub.value is not None:
                        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                        for target in targets:
                            if isinstance(target, ast.Name) and self._is_tensor(sub.value, f):
                                names.append(target.id)
                            elif isinstance(target, (ast.Tuple, ast.List)):
                                seq = (
                                    isinstance(sub.value, ast.Call)
                                    and isinstance(sub.value.func, ast.Attribute)
                                    and sub.value.func.attr in TENSOR_SEQUENCE_METHODS
                                    and self._is_tensor(sub.value.func.value, f)
                                )
                                for i, elt in enumerate(target.elts):
                                    if not isinstance(elt, ast.Name):
                                        continue
                                    if seq or (
                                        isinstance(sub.value, (ast.Tuple, ast.List))
                                        and i < len(sub.value.elts)
                                        and self._is_tensor(sub.value.elts[i], f)
                                    ):
                                        names.append(elt.id)
                    elif isinstance(sub, ast.For) and isinstance(sub.target, ast.Name) and self._is_tensor(sub.iter, f):
                        names.append(sub.target.id)
                    elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in self.funcs:
                        callee = self.funcs[sub.func.id]
                        cargs = callee.node.args
                        positional = [a.arg for a in cargs.posonlyargs + cargs.args]
                        for i, arg in enumerate(sub.args):
                            if i < len(positional) and self._is_tensor(arg, f) and positional[i] not in callee.tainted:
                                callee.tainted.add(positional[i])
                                changed = True
                        for kw in sub.keywords:
                            if kw.arg and self._is_tensor(kw.value, f) and kw.arg not in callee.tainted:
                                callee.tainted.add(kw.arg)
                                changed = True
                    for name in names:
                        if name not in f.tainted:
                            f.tainted.add(name)
                            changed = True

    def _operator_rules(self) -> None:
        """Operators, augmented assignments and math builtins on tensors in host code."""
        for f in self.all_host_funcs:
            for sub in f.body:
                if (
                    isinstance(sub, ast.BinOp)
                    and not isinstance(sub.op, ast.MatMult)
                    and (self._is_tensor(sub.left, f) or self._is_tensor(sub.right, f))
                ):
                    self.fail(
                        "torch-compute",
                        sub,
                        f"operator {type(sub.op).__name__} on a tensor "
                        f"({ast.unparse(sub)}) computes in torch on the host",
                    )
                elif (
                    isinstance(sub, ast.UnaryOp)
                    and isinstance(sub.op, (ast.USub, ast.UAdd, ast.Invert))
                    and self._is_tensor(sub.operand, f)
                ):
                    self.fail("torch-compute", sub, f"unary {type(sub.op).__name__} on a tensor computes in torch")
                elif (
                    isinstance(sub, ast.Compare)
                    and any(not isinstance(op, (ast.Is, ast.IsNot)) for op in sub.ops)
                    and any(self._is_tensor(e, f) for e in [sub.left, *sub.comparators])
                ):
                    self.fail("torch-compute", sub, f"comparison on a tensor ({ast.unparse(sub)}) computes in torch")
                elif isinstance(sub, ast.AugAssign) and (
                    self._is_tensor(sub.target, f) or self._is_tensor(sub.value, f)
                ):
                    self.fail(
                        "torch-compute",
                        sub,
                        f"augmented assignment {type(sub.op).__name__} on a tensor "
                        f"({ast.unparse(sub.target)}) computes in torch",
                    )
                elif (
                    isinstance(sub, ast.Call)
                    and isinstance(sub.func, ast.Name)
                    and sub.func.id in TENSOR_BUILTINS
                    and sub.func.id not in self.module_kinds
                    and any(self._is_tensor(a, f) for a in sub.args)
                ):
                    self.fail("torch-compute", sub, f"{sub.func.id}() on a tensor computes in torch")
