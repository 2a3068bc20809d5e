"""Sizes as sympy expressions over the input dims, and their Python spelling for entry.

The trace runs with symbolic sizes, so every size in the graph is an expression over symbols that
stand for the inputs' dims (s0 = x.shape[0], ...). Kernels receive sizes as runtime arguments that
entry computes from the actual inputs: nothing about the example's sizes is baked, except dims that
are structural (size 1 in the example, or tied to a parameter's size).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch
from torch.utils._sympy import functions as sf

from gpuyantra.authors.opengen.spec import Unsupported

Shape = tuple[sympy.Expr, ...]


def as_expr(value: Any) -> sympy.Expr:
    """A size (int, SymInt, SymFloat, sympy expression) as a sympy expression."""
    if isinstance(value, sympy.Basic):
        return sympy.sympify(value)
    if isinstance(value, bool):
        return sympy.Integer(int(value))
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        node = value.node
        expr = node.expr
        env = getattr(node, "shape_env", None)
        return sympy.sympify(env.replace(expr) if env is not None else expr)
    if isinstance(value, float):
        return sympy.Float(value)
    raise Unsupported(f"size {value!r} of type {type(value).__name__} is not an integer expression")


def as_shape(values: Sequence[Any]) -> Shape:
    return tuple(as_expr(v) for v in values)


def same(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether two size expressions are equal for every value of the symbols."""
    if a == b:
        return True
    try:
        return bool(sympy.expand(a - b) == 0)
    except (TypeError, ValueError):
        return False


def same_shape(a: Sequence[sympy.Expr], b: Sequence[sympy.Expr]) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def is_one(e: sympy.Expr) -> bool:
    return e == 1


def product(sizes: Sequence[sympy.Expr]) -> sympy.Expr:
    out: sympy.Expr = sympy.Integer(1)
    for s in sizes:
        out = out * s
    return out


def contiguous_strides(shape: Sequence[sympy.Expr]) -> Shape:
    strides: list[sympy.Expr] = []
    acc: sympy.Expr = sympy.Integer(1)
    for size in reversed(shape):
        strides.append(acc)
        acc = acc * size
    return tuple(reversed(strides))


def literal(expr: sympy.Expr) -> int | None:
    """The expression's value when it is a plain integer, else None."""
    if isinstance(expr, sympy.Integer) or (isinstance(expr, sympy.Number) and expr == int(expr)):
        return int(expr)
    return None


def host_code(expr: sympy.Expr, names: Mapping[sympy.Symbol, str]) -> str:
    """Python source computing `expr` from the variables `names` gives each symbol."""
    return _Printer(names).code(sympy.sympify(expr))


class _Printer:
    def __init__(self, names: Mapping[sympy.Symbol, str]):
        self.names = names

    def code(self, e: sympy.Expr) -> str:
        if isinstance(e, sympy.Integer):
            return str(int(e))
        if isinstance(e, sympy.Float):
            return repr(float(e))
        if isinstance(e, sympy.Rational):
            return f"({int(e.p)} / {int(e.q)})"
        if isinstance(e, sympy.Symbol):
            if e not in self.names:
                raise Unsupported(f"size symbol {e} is not any input's dim")
            return self.names[e]
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(self.code(a) for a in e.args) + ")"
        if isinstance(e, sympy.Mul):
            return "(" + " * ".join(self.code(a) for a in e.args) + ")"
        if isinstance(e, (sympy.Pow, sf.PowByNatural)):
            base, exp = e.args
            if isinstance(exp, sympy.Integer) and int(exp) >= 0:
                return f"({self.code(base)} ** {int(exp)})"
            if isinstance(exp, sympy.Integer):
                return f"(1 / ({self.code(base)} ** {-int(exp)}))"
        two: dict[type, str] = {
            sf.FloorDiv: "//",
            sf.CleanDiv: "//",
            sf.Mod: "%",
            sf.PythonMod: "%",
            sf.IntTrueDiv: "/",
            sf.FloatTrueDiv: "/",
        }
        for cls, op in two.items():
            if isinstance(e, cls):
                a, b = e.args  # type: ignore[attr-defined]
                return f"({self.code(a)} {op} {self.code(b)})"
        if isinstance(e, sympy.Mod):
            a, b = e.args
            return f"({self.code(a)} % {self.code(b)})"
        if isinstance(e, sf.CeilDiv):
            a, b = e.args
            return f"(-((-{self.code(a)}) // {self.code(b)}))"
        if isinstance(e, sf.ModularIndexing):
            x, d, m = e.args
            return f"(({self.code(x)} // {self.code(d)}) % {self.code(m)})"
        if isinstance(e, (sympy.Max, sf.Max)):
            return "max(" + ", ".join(self.code(a) for a in e.args) + ")"
        if isinstance(e, (sympy.Min, sf.Min)):
            return "min(" + ", ".join(self.code(a) for a in e.args) + ")"
        if isinstance(e, sf.ToFloat):
            return f"float({self.code(e.args[0])})"
        if isinstance(e, (sf.TruncToInt, sf.FloorToInt)):
            return f"int({self.code(e.args[0])})"
        raise Unsupported(f"size expression {e} ({type(e).__name__}) has no host spelling")
