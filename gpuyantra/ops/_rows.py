"""Shared pieces for families whose activation is one `(..., H)` tensor and whose module is called
as `module(x)`: norms and softmax. Kept private; each family file states its own semantics."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpuyantra.ops.base import Tensor, adapter_kwargs, itemsize, numel, randn


def compute_dtype(x: Tensor) -> torch.dtype:
    """float64 stays float64 (the verifier's gold reference); everything else computes in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def make_x(
    rows: Sequence[int], hidden: int, dtype: torch.dtype, device, generator: torch.Generator, scale: float = 1.0
) -> tuple[Tensor, ...]:
    return (randn((*rows, hidden), dtype, device, generator, scale),)


def call_module(module: torch.nn.Module, *activations: Tensor) -> Any:
    return module(*activations)


def forward_with_entry(
    module: torch.nn.Module, entry: Callable[..., Any], adapter: Sequence[dict[str, str]]
) -> Callable[..., Any]:
    """`forward(self, *activations)` that reads the ADAPTER's attributes live and calls `entry`."""

    def forward(self: torch.nn.Module, *activations: Tensor) -> Any:
        return entry(*activations, **adapter_kwargs(self, adapter))

    return forward


def rows_and_hidden(shape: Sequence[int]) -> tuple[int, int]:
    return numel(shape[:-1]), int(shape[-1])


def norm_bytes(n_vectors: int, n_row_streams: int) -> Callable[[Sequence[int], torch.dtype], int]:
    """bytes_moved for `n_row_streams` (..., H) tensors read or written once plus `n_vectors` (H,)
    parameter vectors read once."""

    def bytes_moved(shape: Sequence[int], dtype: torch.dtype) -> int:
        rows, hidden = rows_and_hidden(shape)
        return (n_row_streams * rows * hidden + n_vectors * hidden) * itemsize(dtype)

    return bytes_moved


def per_element_flops(n: int) -> Callable[[Sequence[int]], int]:
    def flops(shape: Sequence[int]) -> int:
        return n * numel(shape)

    return flops


def is_parameterless_leaf(module: torch.nn.Module) -> bool:
    """Modules with no children and no parameters (softmax, rotary application, activations)."""
    return next(module.children(), None) is None and next(module.parameters(), None) is None


def has_vector_weight(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 1
