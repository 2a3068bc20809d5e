"""Residual add fused with the RMSNorm that follows it (Llama-style decoder layers).

entry(x, residual, *, weight, eps) -> (normed, new_residual) with
    new_residual = (x + residual) rounded to x's dtype      (the decoder's `residual + hidden_states`)
    normed       = rms_norm(new_residual, weight=weight, eps=eps)   (Llama semantics, see rms_norm)

One pass reads x and residual once and writes both outputs, where eager runs an add kernel and the
norm's kernels. No single transformers module computes this (the add lives in the decoder layer's
forward), so no HF class binds and `known_modules` is empty: the family is used by kernels,
benchmarks and by `AddRMSNorm` below, its module form and default module (weight and
`variance_epsilon` like LlamaRMSNorm, `forward(x, residual)`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import gpuyantra.ops.rms_norm as _rms
from gpuyantra.ops._error_model import add_rms_norm_error_bound
from gpuyantra.ops._rows import call_module, forward_with_entry, has_vector_weight, norm_bytes, per_element_flops
from gpuyantra.ops.base import OpFamily, ParamSpec, Tensor, randn
from gpuyantra.ops.registry import register


def reference(x: Tensor, residual: Tensor, *, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    if x.dtype == torch.float64:
        summed = x + residual.to(torch.float64)
    else:
        summed = (x.float() + residual.float()).to(x.dtype)
    return _rms.reference(summed, weight=weight, eps=eps), summed


def eager(x: Tensor, residual: Tensor, *, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """What the decoder layer runs: `residual + x` in x's dtype (one rounding, as the reference), then the norm."""
    summed = x + residual
    return _rms.reference(summed, weight=weight, eps=eps), summed


class AddRMSNorm(torch.nn.Module):
    """`h = residual + x; return (LlamaRMSNorm(h), h)`: the module form of the family."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        return reference(x, residual, weight=self.weight, eps=self.variance_epsilon)


def make_activations(
    rows: Sequence[int], hidden: int, dtype: torch.dtype, device, generator: torch.Generator, scale: float = 1.0
) -> tuple[Tensor, ...]:
    x = randn((*rows, hidden), dtype, device, generator, scale)
    residual = randn((*rows, hidden), dtype, device, generator, scale)
    return x, residual


FAMILY = register(
    OpFamily(
        name="add_rms_norm",
        activations=("x", "residual"),
        params=(
            ParamSpec("weight", ("weight",)),
            ParamSpec("eps", ("variance_epsilon", "eps", "epsilon"), kind="float"),
        ),
        default_module="gpuyantra.ops.add_rms_norm.AddRMSNorm",
        reference=reference,
        eager=eager,
        make_activations=make_activations,
        module_call=call_module,
        replacement_forward=forward_with_entry,
        bytes_moved=norm_bytes(n_vectors=1, n_row_streams=4),
        flops=per_element_flops(5),
        known_modules=(),
        module_filter=has_vector_weight,
        error_bound=add_rms_norm_error_bound,
        n_outputs=2,
    )
)
