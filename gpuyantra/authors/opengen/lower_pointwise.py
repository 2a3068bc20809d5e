"""Lowering of elementwise ops and constant fills: unary and binary pointwise ops and where (with
add/sub's alpha), dtype conversions, identities (clone, contiguous, ...), full/zeros/ones and iota.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.construct import cast_to, make_broadcast, make_pointwise, retype
from gpuyantra.authors.opengen.lower_args import FxArgs, Handler, check_broadcastable, schema_name
from gpuyantra.authors.opengen.spec import Unsupported

UNARY = {
    "abs": "abs", "neg": "neg", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log1p": "log1p",
    "log2": "log2", "log10": "log10", "sqrt": "sqrt", "rsqrt": "rsqrt", "reciprocal": "reciprocal", "sin": "sin",
    "cos": "cos", "tan": "tan", "tanh": "tanh", "erf": "erf", "erfc": "erfc", "floor": "floor", "ceil": "ceil",
    "round": "round", "trunc": "trunc", "sign": "sign", "signbit": "signbit", "isfinite": "isfinite",
    "bitwise_not": "not", "logical_not": "not", "sigmoid": "sigmoid", "sinh": "sinh", "cosh": "cosh",
    "atan": "atan", "relu": "relu", "square": "square",
}  # fmt: skip
BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "true_divide": "div", "pow": "pow",
    "maximum": "maximum", "minimum": "minimum", "fmax": "maximum", "fmin": "minimum", "fmod": "fmod",
    "remainder": "remainder", "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
    "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "logical_and": "and", "logical_or": "or",
    "logical_xor": "xor", "atan2": "atan2",
}  # fmt: skip
IDENTITY = ("clone", "view_of", "alias", "detach", "lift_fresh_copy", "contiguous", "copy", "_to_copy_identity")


def pointwise(lw: FxArgs, node: torch.fx.Node, name: str, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    if name == "where":
        args = tuple(lw.tensor(node, i, n) for i, n in enumerate(("pred", "a", "b")))
        op = "where"
    elif name in BINARY:
        args = (lw.tensor(node, 0, "self"), lw.tensor(node, 1, "other"))
        op = BINARY[name]
        if name in ("add", "sub") and lw.arg(node, 2, "alpha") not in (None, 1):
            alpha = lw.as_node(lw.arg(node, 2, "alpha"), (node.name, lw.site(node, 2, "alpha")))
            args = (args[0], ir.Pointwise(args[1].shape, args[1].kind, args[1].dtype, "mul", (args[1], alpha)))
    else:
        args = (lw.tensor(node, 0, "self"),)
        op = UNARY[name]
    for a in args:
        check_broadcastable(a.shape, shape, name)
    return make_pointwise(shape, kind, dtype, op, args)


def _convert(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    src = lw.tensor(node, 0, "a")
    if src.kind == kind:
        return retype(src, dtype)
    return make_pointwise(shape, kind, dtype, "cast", (src,))


def _identity(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    return lw.tensor(node, 0, "a")


def _iota(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    start = lw.value(node.kwargs.get("start", 0))
    step = lw.value(node.kwargs.get("step", 1))
    if not (_is_int(start) and _is_int(step)):
        raise Unsupported("iota with a symbolic start or step")
    return ir.Iota(shape, kind, dtype, int(start), int(step))


def _full(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    name = schema_name(node)
    if name in ("zeros_like", "zeros"):
        value: ir.Node = ir.Scalar((), kind, dtype, 0)
    elif name in ("ones_like", "ones"):
        value = ir.Scalar((), kind, dtype, 1)
    elif name == "scalar_tensor":
        value = lw.tensor(node, 0, "s")
    elif name == "full_like":
        value = lw.tensor(node, 1, "fill_value")
    else:  # prims.full / aten.full(shape, value)
        value = lw.tensor(node, 1, "fill_value")
    value = cast_to(value, kind, dtype)
    return make_broadcast(value, shape, ()) if shape else value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) or (isinstance(v, sympy.Integer))


POINTWISE_OPS: dict[str, Handler] = {
    **{n: _identity for n in IDENTITY},
    "iota": _iota,
    "full": _full,
    "full_like": _full,
    "scalar_tensor": _full,
    "zeros_like": _full,
    "ones_like": _full,
    "zeros": _full,
    "ones": _full,
    "convert_element_type": _convert,
    "_to_copy": _convert,
    "to": _convert,
}
