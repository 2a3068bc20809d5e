"""The lowering's state (the traced graph, its inputs and size symbols, each fx node's lowered
value) and its reading of an fx node's arguments as IR nodes, sizes or python values: what every
family of the lowering (lower_pointwise.py, lower_views.py, lower_reduce.py, lower_matmul.py)
needs, kept apart from the driver (lower.py) that dispatches to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.spec import OpenSpec, Unsupported
from gpuyantra.authors.opengen.symbolic import as_expr, same
from gpuyantra.authors.opengen.trace import Site, Traced


class FxArgs:
    """One lowering's state and its reading of fx arguments (the driver, lower.py, extends it)."""

    def __init__(self, traced: Traced, spec: OpenSpec):
        self.traced = traced
        self.spec = spec
        self.env: dict[torch.fx.Node, Any] = {}
        self.inputs: list[ir.Input] = []
        self.symbols: dict[sympy.Symbol, tuple[str, int]] = {}
        self.updates: dict[str, ir.Node] = {}  # updated buffer's kernel param -> its new value
        self.written: dict[str, ir.Node] = {}  # get_attr target -> the value the forward wrote into it

    # --- argument access --------------------------------------------------------------------------
    def arg(self, node: torch.fx.Node, i: int, name: str, default: Any = None) -> Any:
        if len(node.args) > i:
            return node.args[i]
        return node.kwargs.get(name, default)

    def site(self, node: torch.fx.Node, i: int, name: str) -> tuple[Any, ...]:
        return ("args", i) if len(node.args) > i else ("kwargs", name)

    def value(self, a: Any) -> Any:
        """An fx argument with nodes replaced by their lowered values (sizes as sympy)."""
        if isinstance(a, torch.fx.Node):
            if a not in self.env:
                raise Unsupported(f"{a.name} is used before it is computed")
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self.value(x) for x in a)
        return a

    def ints(self, a: Any) -> list[int]:
        values = self.value(a)
        if values is None:
            return []
        if isinstance(values, (int, sympy.Integer)):
            return [int(values)]
        return [int(v) for v in values]

    def tensor(self, node: torch.fx.Node, i: int, name: str, path: tuple[Any, ...] | None = None) -> ir.Node:
        """Argument i as an IR node (python numbers become scalars or bound float params)."""
        a = self.arg(node, i, name)
        site = path or self.site(node, i, name)
        return self.as_node(a, (node.name, site))

    def as_node(self, a: Any, site: Site) -> ir.Node:
        if isinstance(a, torch.fx.Node):
            v = self.value(a)
            if isinstance(v, ir.Node):
                return v
            if isinstance(v, sympy.Basic):
                is_float = isinstance(a.meta.get("val"), torch.SymFloat)
                return ir.SizeValue((), "f" if is_float else "i", torch.float32 if is_float else torch.int64, v)
            raise Unsupported(f"argument {a.name} is not a tensor")
        found = self.traced.float_sites.get(site)
        if found is not None:
            return ir.FloatParam((), "f", torch.float32, found.kernel_param, found.scale, found.offset, found.power)
        if isinstance(a, bool):
            return ir.Scalar((), "b", torch.bool, a)
        if isinstance(a, int):
            return ir.Scalar((), "i", torch.int64, a)
        if isinstance(a, float):
            return ir.Scalar((), "f", torch.float32, a)
        if isinstance(a, (torch.SymInt, torch.SymFloat)):
            return ir.SizeValue((), "i", torch.int64, as_expr(a))
        raise Unsupported(f"argument {a!r} is not a tensor or a number")


# A family's handler: (lowering, fx node, result shape, result kind, result dtype) -> lowered value.
Handler = Callable[[FxArgs, torch.fx.Node, Any, str, torch.dtype], Any]


def check_broadcastable(src: Sequence[sympy.Expr], dst: Sequence[sympy.Expr], name: str) -> None:
    if len(src) > len(dst):
        raise Unsupported(f"{name}: an operand has more dims than the result")
    for s, d in zip(reversed(src), reversed(dst)):
        if s != 1 and not same(s, d):
            raise Unsupported(f"{name}: operand dims {list(src)} do not broadcast to {list(dst)}")


def schema_name(node: torch.fx.Node) -> str:
    """The op's schema name without namespace ("sum" for prims.sum.default), "" for non-ops."""
    schema = getattr(node.target, "_schema", None)
    return str(getattr(schema, "name", "")).split("::")[-1]
