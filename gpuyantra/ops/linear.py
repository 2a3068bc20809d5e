"""Linear projection as `torch.nn.Linear` computes it: y = x Wᵀ + b, accumulated in float32.

entry(x, *, weight, bias) -> y of x's dtype, with x (..., K), weight (N, K), bias (N,) or None
(`nn.Linear(bias=False)` holds `bias = None`; the swap engine passes it as it is). The reference
is `F.linear` on float32 copies rounded once to x's dtype (what cuBLAS does for 16-bit inputs:
fp32 accumulation, one rounding); float64 stays float64 (the verifier's gold reference).

Binds (numerically checked) `torch.nn.Linear` and subclasses that keep its math (Falcon's
`FalconLinear`, every q/k/v/o, gate/up/down projection and `lm_head` of the decoder models).
Groups are split by live parameter shapes (`param_shapes_of`): a 2048x1536 q/k/v projection and a
151936x1536 lm_head are different targets, verified and swapped apart.

Shapes in the generic interface: hidden is K (in_features), rows the leading dims of x. N (out
features) is not part of an activation shape: it comes from the weight the verifier is told about
(`verify --param-shape weight=NxK`) or, by default, N = K.

Tolerance (derived, docs/ops.md "linear"): an honest kernel forms every product exactly (16-bit
inputs) or rounded once (float32), sums K of them in float32 in any order (loop, tree, split-K)
and rounds the sum once to the output dtype. The rounding is relative (rtol = 2 u_out). The sum's
error is a martingale of K rounding errors, each at most u32 |partial sum| <= u32 sum|x_k w_k|, so
by Azuma it stays under LAMBDA sqrt(K) u32 sum_k |x_k w_k| but with probability 2 exp(-LAMBDA²/2)
(LAMBDA = 8: 3e-14) whatever the order: `error_bound` hands the verifier that allowance per output
element. A kernel that accumulates in 16-bit errs by u16 / u32 = 8192 times more per step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from gpuyantra.ops._rows import call_module, forward_with_entry, make_x
from gpuyantra.ops.base import OpFamily, ParamSpec, Tensor, itemsize, numel, randn
from gpuyantra.ops.registry import register

# Unit roundoff (half an ulp at 1) of each output dtype and of the float32 accumulator.
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24, torch.float64: 2.0**-53}
LAMBDA = 8.0  # Azuma tail factor of the accumulation bound (see the module docstring)
# Verifier cases at most this many weight elements and output elements (the CPU interpreter runs
# each program in Python; CUDA keeps the float64 reference and every saved output small). CUDA's
# weight cap holds every decode projection of a 1.5B model in full (lm_head 151936 x 1536).
CASE_WEIGHT_ELEMENTS = {"cpu": 1 << 19, "cuda": 1 << 28}
CASE_OUTPUT_ELEMENTS = {"cpu": 1 << 16, "cuda": 1 << 24}
# Hidden shapes on top of the verifier's own: a long K in every dtype (16-bit accumulation and
# K-tile caps show there; the verifier's long-K stress shape runs in the first dtype only).
EXTRA_HIDDEN_SHAPES = {"cpu": [[2, 4099]], "cuda": [[5, 12289]]}


def reference(x: Tensor, *, weight: Tensor, bias: Tensor | None) -> Tensor:
    if x.dtype == torch.float64:
        return F.linear(x, weight.to(x.dtype), bias.to(x.dtype) if bias is not None else None)
    b = bias.float() if bias is not None else None
    return F.linear(x.float(), weight.float(), b).to(x.dtype)


def eager(x: Tensor, *, weight: Tensor, bias: Tensor | None) -> Tensor:
    """What `nn.Linear` runs: one cuBLAS GEMM in x's dtype (float32 accumulation inside)."""
    return F.linear(x, weight, bias)


def make_params(hidden: int, dtype: torch.dtype, device, generator: torch.Generator) -> dict[str, Any]:
    """Probe parameters: N = hidden + 3 (N != K, not a power of two), weights away from 0 and 1."""
    n = hidden + 3
    return {
        "weight": randn((n, hidden), dtype, device, generator, 0.5) + 0.3,
        "bias": randn((n,), dtype, device, generator, 0.5),
    }


def is_linear_like(module: torch.nn.Module) -> bool:
    """A 2-D `weight` and a `bias` attribute (tensor or None), as nn.Linear has, and a forward of
    its own: a sibling whose forward hands its work to a fused GEMM module (serving/fusion.py marks
    it `gpuyantra_delegates`) is not bound; the fused module is, so a swap keeps the fusion."""
    weight = getattr(module, "weight", None)
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2 and hasattr(module, "bias")):
        return False
    forward = module.__dict__.get("forward")
    return not getattr(getattr(forward, "__func__", forward), "gpuyantra_delegates", False)


def param_shapes_of(module: torch.nn.Module) -> dict[str, list[int] | None]:
    """{"weight": [N, K], "bias": [N] or None}: what makes two Linear modules different targets."""
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    if not isinstance(weight, torch.Tensor):
        return {}
    return {
        "weight": [int(d) for d in weight.shape],
        "bias": [int(d) for d in bias.shape] if isinstance(bias, torch.Tensor) else None,
    }


def _out_features(shape: Sequence[int], param_shapes: Mapping[str, Sequence[int] | None] | None) -> int:
    weight = (param_shapes or {}).get("weight")
    return int(weight[0]) if weight else int(shape[-1])  # default N = K


def param_cost(
    shape: Sequence[int], dtype: torch.dtype, param_shapes: Mapping[str, Sequence[int] | None] | None = None
) -> tuple[int, int]:
    """(bytes moved, flops) of one call on x of `shape`: x and the weight read once, y written once."""
    rows, k = numel(shape[:-1]), int(shape[-1])
    n = _out_features(shape, param_shapes)
    has_bias = not param_shapes or param_shapes.get("bias") is not None  # no live shapes: nn.Linear's bias
    nbytes = (rows * k + n * k + rows * n + (n if has_bias else 0)) * itemsize(dtype)
    return nbytes, 2 * rows * k * n


def bytes_moved(shape: Sequence[int], dtype: torch.dtype) -> int:
    return param_cost(shape, dtype)[0]


def flops(shape: Sequence[int]) -> int:
    return param_cost(shape, torch.float32)[1]


def fit_params(
    shape: Sequence[int], param_shapes: dict[str, list[int] | None], device: str
) -> dict[str, list[int] | None]:
    """Shrink N (weight rows, bias length) so one verifier case stays affordable on `device`.

    Output features are independent (y[:, n] reads only weight[n]), so fewer of them test the same
    math; a shrunk N is made odd so it never lands on a tile multiple."""
    weight = param_shapes.get("weight")
    if not weight:
        return param_shapes
    where = "cuda" if device.startswith("cuda") else "cpu"
    rows, k, n = max(1, numel(shape[:-1])), int(weight[-1]), int(weight[0])
    fitted = min(n, max(1, CASE_WEIGHT_ELEMENTS[where] // max(k, 1)), max(1, CASE_OUTPUT_ELEMENTS[where] // rows))
    if fitted == n:
        return param_shapes
    fitted = max(1, fitted - (1 - fitted % 2))
    out = dict(param_shapes)
    out["weight"] = [fitted, *weight[1:]]
    if out.get("bias") is not None:
        out["bias"] = [fitted]
    return out


def error_bound(activations: Sequence[Tensor], params: Mapping[str, Any], out_dtype: torch.dtype) -> Tensor | None:
    """Per-element allowance of an honest float32 accumulation (module docstring), in float64.

    float64 outputs accumulate in float64 (the verifier never asks a kernel for them)."""
    x, weight, bias = activations[0], params.get("weight"), params.get("bias")
    if not isinstance(weight, Tensor):
        return None
    k = int(x.shape[-1])
    unit = UNIT_ROUNDOFF[torch.float64 if out_dtype == torch.float64 else torch.float32]
    with torch.no_grad():
        magnitude = F.linear(x.detach().double().abs(), weight.detach().double().abs())
        if isinstance(bias, Tensor):
            magnitude = magnitude + bias.detach().double().abs()
    return LAMBDA * math.sqrt(k + 2) * unit * magnitude


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) = two output roundings (2 u_out, rounded up): the output's own rounding plus one
    ulp between two honest float32-accumulating implementations (the swap's parity against the
    module). The accumulation error itself depends on the inputs: `error_bound` adds it per element
    where outputs are judged against float64 (the verifier)."""
    return {
        torch.float32: (1e-5, 1e-5),  # 2 u32 = 1.2e-7; the floor keeps parity on unit-scale outputs
        torch.float16: (1e-3, 1e-3),  # 2 u16 = 9.8e-4
        torch.bfloat16: (8e-3, 8e-3),  # 2 ubf16 = 7.8e-3
        torch.float64: (1e-9, 1e-9),
    }[dtype]


FAMILY = register(
    OpFamily(
        name="linear",
        activations=("x",),
        params=(ParamSpec("weight", ("weight",)), ParamSpec("bias", ("bias",), kind="optional_tensor")),
        default_module="torch.nn.Linear",
        reference=reference,
        eager=eager,
        make_activations=make_x,
        module_call=call_module,
        replacement_forward=forward_with_entry,
        bytes_moved=bytes_moved,
        flops=flops,
        known_modules=("torch.nn.Linear", "transformers.models.falcon.modeling_falcon.FalconLinear"),
        module_filter=is_linear_like,
        param_factory=make_params,
        tolerances={dt: _tolerance(dt) for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64)},
        param_shapes_of=param_shapes_of,
        param_cost=param_cost,
        fit_params=fit_params,
        error_bound=error_bound,
        extra_hidden_shapes=EXTRA_HIDDEN_SHAPES,
    )
)
