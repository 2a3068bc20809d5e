"""Lowering of matrix products: mm, bmm, mv, dot/vdot and the add* forms (beta * input + alpha *
product), which is what matmul, Linear and einsum contractions trace to, as one MatMul node
(mv and dot as products with a unit dim, addbmm as one product over (batch, K)).
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.construct import make_broadcast, make_matmul, make_pointwise, make_reshape
from gpuyantra.authors.opengen.lower_args import FxArgs, Handler, check_broadcastable, schema_name
from gpuyantra.authors.opengen.spec import Unsupported

# Matrix products the lowering writes (matmul, linear and einsum reach the graph as these), with
# their tensor arguments' schema names.
_MATMUL_ARGS = {
    "mm": ("self", "mat2"), "bmm": ("self", "mat2"), "mv": ("self", "vec"), "dot": ("self", "tensor"),
    "vdot": ("self", "other"), "addmm": ("self", "mat1", "mat2"), "baddbmm": ("self", "batch1", "batch2"),
    "addbmm": ("self", "batch1", "batch2"), "addmv": ("self", "mat", "vec"),
}  # fmt: skip
MATMULS = tuple(_MATMUL_ARGS)


def _matmul(lw: FxArgs, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
    """mm, bmm, mv, dot and their add* forms (beta * input + alpha * product) as a MatMul."""
    name = schema_name(node)
    names = _MATMUL_ARGS[name]
    first = len(names) - 2  # the add* forms take the added input first
    a = lw.tensor(node, first, names[first])
    b = lw.tensor(node, first + 1, names[first + 1])
    if a.kind != "f" or b.kind != "f" or kind != "f":
        raise Unsupported(f"{name} on integer or bool tensors: not supported by the open author")
    if name in ("mv", "addmv"):
        product = make_reshape(make_matmul(a, make_reshape(b, (b.shape[0], sympy.Integer(1))), dtype), shape)
    elif name in ("dot", "vdot"):
        one = sympy.Integer(1)
        product = make_reshape(
            make_matmul(make_reshape(a, (one, a.shape[0])), make_reshape(b, (b.shape[0], one)), dtype), ()
        )
    elif name == "addbmm":  # sum over the batch of a_i @ b_i: one product over (batch, K)
        rows = make_reshape(
            ir.Permute((a.shape[1], a.shape[0], a.shape[2]), a.kind, a.dtype, a, (1, 0, 2)),
            (a.shape[1], a.shape[0] * a.shape[2]),
        )
        product = make_matmul(rows, make_reshape(b, (b.shape[0] * b.shape[1], b.shape[2])), dtype)
    else:
        product = make_matmul(a, b, dtype)
    if not first:
        return product
    return _add_scaled(lw, node, shape, dtype, product)


def _add_scaled(lw: FxArgs, node: torch.fx.Node, shape: Any, dtype: torch.dtype, product: ir.Node) -> ir.Node:
    """beta * input + alpha * product (addmm's bias; beta 0 ignores the input, NaNs included)."""
    beta = lw.arg(node, 3, "beta", 1)
    alpha = lw.arg(node, 4, "alpha", 1)
    if alpha != 1:
        scale = lw.as_node(alpha, (node.name, lw.site(node, 4, "alpha")))
        product = make_pointwise(shape, "f", dtype, "mul", (product, scale))
    if beta == 0 and (node.name, lw.site(node, 3, "beta")) not in lw.traced.float_sites:
        return product
    bias = lw.tensor(node, 0, "self")
    check_broadcastable(bias.shape, shape, schema_name(node))
    bias = make_broadcast(bias, shape, tuple(range(len(shape) - bias.rank, len(shape))))
    if beta != 1:
        weight = lw.as_node(beta, (node.name, lw.site(node, 3, "beta")))
        bias = make_pointwise(shape, "f", dtype, "mul", (bias, weight))
    return make_pointwise(shape, "f", dtype, "add", (bias, product))


MATMUL_OPS: dict[str, Handler] = {n: _matmul for n in MATMULS}
