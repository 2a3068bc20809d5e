"""Library primitives an open target's candidate may call: convolution, GEMM and attention.

cuDNN's convolutions and cuBLAS's products are hard to beat in Triton; what follows them (bias,
activations, norms, reductions) is where a fused kernel wins. A candidate for an open target
(a KernelBench problem) may therefore call these torch entry points and fuse the rest in Triton,
but only the kinds the target's own forward computes: a GEMM cannot stand in for a sum reduction
of a target that has no product. Everything else torch computes stays a cheat.

`ENTRY_POINTS` is what the static rules accept (dotted paths as candidates write them),
`ATEN_KINDS` what the runtime host-op recorder accepts outside kernel launches (the aten ops those
entry points dispatch to, on CUDA and on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

CONVOLUTION, GEMM, ATTENTION = "convolution", "gemm", "attention"
KINDS = (CONVOLUTION, GEMM, ATTENTION)

_CONV_NAMES = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_GEMM_TORCH = ("matmul", "mm", "bmm", "addmm", "baddbmm")

ENTRY_POINTS: dict[str, str] = {
    **{f"torch.nn.functional.{name}": CONVOLUTION for name in _CONV_NAMES},
    **{f"torch.{name}": CONVOLUTION for name in _CONV_NAMES},
    **{f"torch.{name}": GEMM for name in _GEMM_TORCH},
    "torch.nn.functional.linear": GEMM,
    "torch.nn.functional.scaled_dot_product_attention": ATTENTION,
}

# The aten ops the entry points reach below autograd (torch.matmul and F.linear are composite:
# they arrive as mm/bmm/addmm plus views, which are allowed anyway). Attention is its fused
# kernels only: the math fallback (bmm, softmax) would be torch computing the softmax.
ATEN_KINDS: dict[str, str] = {
    "convolution": CONVOLUTION,
    "_convolution": CONVOLUTION,
    "cudnn_convolution": CONVOLUTION,
    "cudnn_convolution_transpose": CONVOLUTION,
    "mkldnn_convolution": CONVOLUTION,
    "mm": GEMM,
    "bmm": GEMM,
    "addmm": GEMM,
    "baddbmm": GEMM,
    "_scaled_dot_product_flash_attention": ATTENTION,
    "_scaled_dot_product_efficient_attention": ATTENTION,
    "_scaled_dot_product_cudnn_attention": ATTENTION,
    "_scaled_dot_product_flash_attention_for_cpu": ATTENTION,
}

# Functions seen while the target's forward runs that show it computes a kind (module calls reach
# torch through these: nn.Conv2d -> conv2d, nn.Linear -> linear, nn.MultiheadAttention -> its own).
_FORWARD_KINDS: dict[str, str] = {
    **{name: CONVOLUTION for name in (*_CONV_NAMES, "convolution")},
    **{name: GEMM for name in (*_GEMM_TORCH, "linear", "bilinear", "einsum", "__matmul__", "__rmatmul__")},
    "scaled_dot_product_attention": ATTENTION,
    "multi_head_attention_forward": ATTENTION,
}


def kind_of_call(path: str) -> str | None:
    """The library kind of a dotted entry point a candidate calls, else None."""
    return ENTRY_POINTS.get(path)


def kinds_in_forward(run: Callable[[], Any]) -> frozenset[str]:
    """The library kinds `run` (a forward, usually on meta tensors) calls torch for."""
    seen: set[str] = set()

    class _Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
            kind = _FORWARD_KINDS.get(getattr(func, "__name__", ""))
            if kind is not None:
                seen.add(kind)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), _Record():
        run()
    return frozenset(seen)


def permitted_kinds(family: Any) -> frozenset[str]:
    """The library kinds a candidate for `family` may call: those its open target's forward computes;
    none for a registered family (its kernel is the whole op) or when the forward cannot be run."""
    target = getattr(family, "open_target", None)
    probe = getattr(target, "library_kinds", None)
    return frozenset(probe()) if callable(probe) else frozenset()


def describe(calls: Iterable[str]) -> str:
    """`torch.nn.functional.conv2d (convolution)`, ... for a verdict's reason."""
    return ", ".join(f"{c} ({ENTRY_POINTS.get(c) or ATEN_KINDS.get(c, '?')})" for c in sorted(set(calls)))
