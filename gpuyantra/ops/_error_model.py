"""What a correct float32 computation of a row op may differ by from the float64 reference.

The verifier judges outputs against float64 and allows, per element, the family's (atol, rtol) for
the output's rounding plus what `error_bound` returns here: the forward error of a correct kernel
computing in float32, whatever order it sums in (two-pass, Welford, chunked, tree). The bound
follows numerical analysis, not any one implementation: a float32 sum of n terms errs by at most
LAMBDA sqrt(n) u32 times the sum of |terms| with probability 1 - 2 exp(-LAMBDA^2 / 2) for any
order (rounding errors as mean-independent variables, Azuma; `linear` derives the same bound), and
each elementwise operation adds one unit roundoff of its result. A one-pass variance E[x^2] - E[x]^2
on rows far from zero, or a sum of squares kept in 16 bits, errs by orders of magnitude more.

Each bound is per output element, in float64, and depends on the inputs alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gpuyantra.ops.base import Tensor

U32 = 2.0**-24
U64 = 2.0**-53
LAMBDA = 8.0  # tail factor of the sqrt(n) bound: exceeded with probability 3e-14 per sum
ELEMENTWISE_OPS = 4  # roundings of the elementwise steps after a reduction (subtract, scale, weight, bias)


def sum_error(n: int, out_dtype: torch.dtype) -> float:
    """Relative (to the sum of |terms|) error of an honest sum of `n` terms in the compute dtype.
    Each addition errs by at most u times its partial sum. For terms of one size the squared partial
    sums add up to about n/3 squared totals summed in order (a tree: 2), hence sqrt(n/3) where
    Azuma's bound for any sum has sqrt(n); where one term dominates from the start they reach n, and
    the bound is still LAMBDA / sqrt(3), 4.6, times Azuma's width (rounding errors as independent
    uniform variables: 16 standard deviations)."""
    unit = U64 if out_dtype == torch.float64 else U32
    return LAMBDA * math.sqrt(n / 3 + 2) * unit


def _unit(out_dtype: torch.dtype) -> float:
    return U64 if out_dtype == torch.float64 else U32


def _wide(t: Any) -> Any:
    return t.detach().to(torch.float64) if isinstance(t, Tensor) and t.is_floating_point() else t


def rms_norm_bound(x: Tensor, scale: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """y = scale * x * rsqrt(mean(x^2) + eps): the sum of squares (positive terms) errs relatively
    by `sum_error`, the rsqrt halves it, the elementwise steps add a few roundings."""
    xd = _wide(x)
    with torch.no_grad():
        ms = xd.square().mean(dim=-1, keepdim=True)
        normed = xd * torch.rsqrt(ms.clamp_min(torch.finfo(torch.float64).tiny))
        magnitude = normed.abs() if scale is None else (normed * _wide(scale)).abs()
    relative = sum_error(int(x.shape[-1]), out_dtype) + ELEMENTWISE_OPS * _unit(out_dtype)
    return magnitude.mul_(relative)


def layer_norm_bound(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float, out_dtype: torch.dtype
) -> Tensor:
    """y = (x - mean) * rstd * weight + bias. The mean errs by `sum_error` x mean|x|, which the
    normalization divides by the row's spread (rows far from zero: this is what a correct float32
    kernel pays on them); the variance, a sum of positive squares, errs relatively by `sum_error`."""
    xd = _wide(x)
    n = int(x.shape[-1])
    g = sum_error(n, out_dtype)
    unit = _unit(out_dtype)
    with torch.no_grad():
        mean = xd.mean(dim=-1, keepdim=True)
        rstd = torch.rsqrt(xd.sub(mean).square().mean(dim=-1, keepdim=True) + float(eps))
        w = _wide(weight).abs() if isinstance(weight, Tensor) else torch.ones((), dtype=torch.float64, device=xd.device)
        mean_error = xd.abs().mean(dim=-1, keepdim=True).mul_(g).mul_(rstd)
        normed = xd.sub(mean).mul_(rstd).abs_()
        bound = (mean_error + normed.mul_(g + ELEMENTWISE_OPS * unit)) * w
        if isinstance(bias, Tensor):
            bound = bound + _wide(bias).abs() * unit
    return bound


def softmax_bound(x: Tensor, out_dtype: torch.dtype) -> Tensor:
    """p = exp(x - max) / sum: the sum (positive terms) errs relatively by `sum_error`; exp of a
    rounded x - max errs by |x - max| u. Masked (-inf) elements have p = 0 and no error."""
    xd = _wide(x)
    unit = _unit(out_dtype)
    with torch.no_grad():
        shifted = xd - xd.amax(dim=-1, keepdim=True)
        p = torch.softmax(xd, dim=-1)
        relative = (
            shifted.abs()
            .nan_to_num_(0.0, 0.0, 0.0)
            .mul_(unit)
            .add_(sum_error(int(x.shape[-1]), out_dtype) + ELEMENTWISE_OPS * unit)
        )
        bound = torch.where(p > 0, p * relative, torch.zeros_like(p))
    return bound.nan_to_num_(0.0, 0.0, 0.0)


def rms_norm_error_bound(
    activations: Sequence[Tensor], params: Mapping[str, Any], out_dtype: torch.dtype
) -> Tensor | None:
    """`error_bound` hook of rms_norm: the weight scales the normalized row."""
    return rms_norm_bound(activations[0], params.get("weight"), out_dtype)


def gemma_rms_norm_error_bound(
    activations: Sequence[Tensor], params: Mapping[str, Any], out_dtype: torch.dtype
) -> Tensor | None:
    """`error_bound` hook of gemma_rms_norm: the scale is 1 + weight."""
    weight = params.get("weight")
    scale = 1.0 + _wide(weight) if isinstance(weight, Tensor) else None
    return rms_norm_bound(activations[0], scale, out_dtype)


def add_rms_norm_error_bound(
    activations: Sequence[Tensor], params: Mapping[str, Any], out_dtype: torch.dtype
) -> Tensor | None:
    """`error_bound` hook of add_rms_norm (its first output): the norm of x + residual."""
    summed = _wide(activations[0]) + _wide(activations[1])
    return rms_norm_bound(summed, params.get("weight"), out_dtype)


def layer_norm_error_bound(
    activations: Sequence[Tensor], params: Mapping[str, Any], out_dtype: torch.dtype
) -> Tensor | None:
    """`error_bound` hook of layer_norm."""
    return layer_norm_bound(activations[0], params.get("weight"), params.get("bias"), params["eps"], out_dtype)


def softmax_error_bound(
    activations: Sequence[Tensor], params: Mapping[str, Any], out_dtype: torch.dtype
) -> Tensor | None:
    """`error_bound` hook of softmax."""
    return softmax_bound(activations[0], out_dtype)
