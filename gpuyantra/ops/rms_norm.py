"""RMSNorm as Llama, Qwen2, Mistral compute it: normalize in float32, round, then scale by weight.

entry(x, *, weight, eps) -> y, with y = weight * (xf * rsqrt(mean(xf**2, -1) + eps)).to(x.dtype) and
xf = x.float(); y's dtype is promote(x.dtype, weight.dtype) exactly as `weight * h.to(x.dtype)`.

Binds (numerically checked): LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm,
Qwen2MoeRMSNorm, MixtralRMSNorm, Phi3RMSNorm, GraniteRMSNorm, and Olmo2RMSNorm (which multiplies by
the weight before rounding: equal in float64, within one rounding in 16-bit types). Never Gemma's
`(1 + weight)` norms: those are `gemma_rms_norm`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpuyantra.ops._error_model import rms_norm_error_bound
from gpuyantra.ops._rows import has_vector_weight
from gpuyantra.ops.base import OpFamily, ParamSpec, Tensor, adapter_kwargs, randn
from gpuyantra.ops.registry import register


def reference(x: Tensor, *, weight: Tensor, eps: float) -> Tensor:
    xf = x.float() if x.dtype != torch.float64 else x
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def make_activations(
    rows: Sequence[int], hidden: int, dtype: torch.dtype, device, generator: torch.Generator, scale: float = 1.0
) -> tuple[Tensor, ...]:
    return (randn((*rows, hidden), dtype, device, generator, scale),)


def module_call(module: torch.nn.Module, x: Tensor) -> Tensor:
    return module(x)


def replacement_forward(
    module: torch.nn.Module, entry: Callable[..., Tensor], adapter: Sequence[dict[str, str]]
) -> Callable[..., Any]:
    def forward(self: torch.nn.Module, hidden_states: Tensor) -> Tensor:
        return entry(hidden_states, **adapter_kwargs(self, adapter))

    return forward


def bytes_moved(shape: Sequence[int], dtype: torch.dtype) -> int:
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    hidden = shape[-1]
    size = torch.empty((), dtype=dtype).element_size()
    return (2 * rows * hidden + hidden) * size  # read x, write y, read weight once


def flops(shape: Sequence[int]) -> int:
    numel = 1
    for dim in shape:
        numel *= dim
    return 4 * numel  # square, sum, scale, weight


FAMILY = register(
    OpFamily(
        name="rms_norm",
        activations=("x",),
        params=(
            ParamSpec("weight", ("weight",)),
            ParamSpec("eps", ("variance_epsilon", "eps", "epsilon"), kind="float"),
        ),
        default_module="transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm",
        reference=reference,
        make_activations=make_activations,
        module_call=module_call,
        replacement_forward=replacement_forward,
        bytes_moved=bytes_moved,
        flops=flops,
        known_modules=(
            "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm",
            "transformers.models.llama.modeling_llama.LlamaRMSNorm",
            "transformers.models.mistral.modeling_mistral.MistralRMSNorm",
            "transformers.models.qwen3.modeling_qwen3.Qwen3RMSNorm",
            "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeRMSNorm",
            "transformers.models.mixtral.modeling_mixtral.MixtralRMSNorm",
            "transformers.models.phi3.modeling_phi3.Phi3RMSNorm",
            "transformers.models.granite.modeling_granite.GraniteRMSNorm",
            "transformers.models.olmo2.modeling_olmo2.Olmo2RMSNorm",
        ),
        module_filter=has_vector_weight,
        error_bound=rms_norm_error_bound,
    )
)
