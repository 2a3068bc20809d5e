"""LayerNorm over the last dimension, normalized in float32 and rounded once to x's dtype.

entry(x, *, weight, bias, eps) -> y with
    y = layer_norm(x.float(), (H,), weight.float(), bias.float(), eps).to(x.dtype)
`weight` and `bias` may be None (a LayerNorm without affine parameters or without bias). Binds
`torch.nn.LayerNorm` over one trailing dimension (GPT-2's `ln_1`, `ln_2`, `ln_f`).
"""

from __future__ import annotations

from typing import cast

import torch

from gpuyantra.ops._error_model import layer_norm_error_bound
from gpuyantra.ops._rows import (
    call_module,
    compute_dtype,
    forward_with_entry,
    has_vector_weight,
    make_x,
    norm_bytes,
    per_element_flops,
)
from gpuyantra.ops.base import OpFamily, ParamSpec, Tensor, randn
from gpuyantra.ops.registry import register


def reference(x: Tensor, *, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    ct = compute_dtype(x)
    w = weight.to(ct) if weight is not None else None
    b = bias.to(ct) if bias is not None else None
    return torch.nn.functional.layer_norm(x.to(ct), (x.shape[-1],), w, b, eps).to(x.dtype)


def eager(x: Tensor, *, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    """What `nn.LayerNorm` runs: one fused kernel on x as it is (float32 statistics inside)."""
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def make_params(hidden: int, dtype: torch.dtype, device, generator: torch.Generator) -> dict:
    return {
        "weight": randn((hidden,), dtype, device, generator, 0.5) + 1.0,
        "bias": randn((hidden,), dtype, device, generator, 0.5),
        "eps": 1e-5,
    }


def hidden_of(module: torch.nn.Module) -> int:
    shape = getattr(module, "normalized_shape", None)
    if shape:
        return int(shape[-1])
    return int(cast(Tensor, module.weight).shape[-1])


def _is_layer_norm_like(module: torch.nn.Module) -> bool:
    return bool(getattr(module, "normalized_shape", None)) or has_vector_weight(module)


FAMILY = register(
    OpFamily(
        name="layer_norm",
        activations=("x",),
        params=(
            ParamSpec("weight", ("weight",)),
            ParamSpec("bias", ("bias",)),
            ParamSpec("eps", ("eps", "variance_epsilon", "epsilon", "layer_norm_eps"), kind="float"),
        ),
        default_module="torch.nn.LayerNorm",
        reference=reference,
        eager=eager,
        make_activations=make_x,
        module_call=call_module,
        replacement_forward=forward_with_entry,
        bytes_moved=norm_bytes(n_vectors=2, n_row_streams=2),
        flops=per_element_flops(7),
        known_modules=("torch.nn.LayerNorm",),
        hidden_of=hidden_of,
        module_filter=_is_layer_norm_like,
        param_factory=make_params,
        error_bound=layer_norm_error_bound,
        tolerances={
            torch.float32: (1e-4, 1e-4),
            torch.float16: (4e-3, 2e-3),
            torch.bfloat16: (3e-2, 1.6e-2),
            torch.float64: (1e-9, 1e-9),
        },
    )
)
