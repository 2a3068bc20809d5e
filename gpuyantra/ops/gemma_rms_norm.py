"""Gemma's RMSNorm: the weight is stored as an offset from 1 and applied in float32 before rounding.

entry(x, *, weight, eps) -> y with
    y = (xf * rsqrt(mean(xf**2, -1) + eps) * (1 + weight.float())).to(x.dtype),  xf = x.float()
exactly as `GemmaRMSNorm`, `Gemma2RMSNorm` and `Gemma3RMSNorm` (transformers 5.x) compute it: the
output has x's dtype (`type_as(x)`), whatever the weight's dtype. Plain `rms_norm` differs in two
places (weight vs 1 + weight; rounding before vs after the weight), so binding by computation never
gives a Gemma norm the `rms_norm` kernel, nor a Llama norm this one.
"""

from __future__ import annotations

import torch

from gpuyantra.ops._error_model import gemma_rms_norm_error_bound
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


def reference(x: Tensor, *, weight: Tensor, eps: float) -> Tensor:
    ct = compute_dtype(x)
    xf = x.to(ct)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.to(ct))).to(x.dtype)


def make_params(hidden: int, dtype: torch.dtype, device, generator: torch.Generator) -> dict:
    # Gemma checkpoints store weights around 0 (the scale is 1 + weight).
    return {"weight": randn((hidden,), dtype, device, generator, 0.5), "eps": 1e-6}


FAMILY = register(
    OpFamily(
        name="gemma_rms_norm",
        activations=("x",),
        params=(
            ParamSpec("weight", ("weight",)),
            ParamSpec("eps", ("eps", "variance_epsilon", "epsilon"), kind="float"),
        ),
        default_module="transformers.models.gemma.modeling_gemma.GemmaRMSNorm",
        reference=reference,
        make_activations=make_x,
        module_call=call_module,
        replacement_forward=forward_with_entry,
        bytes_moved=norm_bytes(n_vectors=1, n_row_streams=2),
        flops=per_element_flops(5),
        known_modules=(
            "transformers.models.gemma.modeling_gemma.GemmaRMSNorm",
            "transformers.models.gemma2.modeling_gemma2.Gemma2RMSNorm",
            "transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm",
        ),
        module_filter=has_vector_weight,
        param_factory=make_params,
        error_bound=gemma_rms_norm_error_bound,
    )
)
