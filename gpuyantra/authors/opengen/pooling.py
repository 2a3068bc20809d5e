"""Max and average pooling (1-D, 2-D, 3-D) as ops the author already writes.

Each position of the window is a gather of the input at `o * stride - padding + j * dilation` along
every pooled dim (the index clamped into range, the value masked where it falls in the padding),
and the positions are folded in ATen's order:
- max pooling: `maximum` over the positions (NaN propagates, as ATen's `val > max || isnan(val)`),
  padding reads -inf; the indices output (flat over the pooled dims) keeps the first position that
  wins, as ATen's loop does;
- average pooling: the sum over the positions (padding reads 0, which leaves a float sum exact),
  divided by ATen's divisor: `divisor_override`, else the window clipped to the padded input
  (`count_include_pad`) or to the input itself.
Output sizes follow ATen's `pooling_output_shape` (ceil_mode included). The functions below are
registered as decompositions of the trace (trace.py), so the graph holds only iotas, gathers,
wheres and pointwise ops; the sizes stay symbolic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from gpuyantra.authors.opengen.window import Window

aten = torch.ops.aten


def _max_pool(n: int) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    def max_pool_with_indices(
        x: torch.Tensor,
        kernel_size: Any,
        stride: Any = (),
        padding: Any = 0,
        dilation: Any = 1,
        ceil_mode: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        window = Window(x, n, kernel_size, stride, padding, dilation, ceil_mode)
        best: torch.Tensor | None = None
        best_index: torch.Tensor | None = None
        for offset in window.offsets():
            values, flat = window.read(offset, float("-inf"))
            if best is None or best_index is None:
                best, best_index = values, flat.expand(values.shape)
                continue
            take = (values > best) | torch.isnan(values)
            best_index = torch.where(take, flat, best_index)
            best = torch.maximum(best, values)
        assert best is not None and best_index is not None
        return best, best_index

    return max_pool_with_indices


def _avg_pool(n: int) -> Callable[..., torch.Tensor]:
    def avg_pool(
        x: torch.Tensor,
        kernel_size: Any,
        stride: Any = (),
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> torch.Tensor:
        window = Window(x, n, kernel_size, stride, padding, 1, ceil_mode)
        total: torch.Tensor | None = None
        for offset in window.offsets():
            values = window.read_values(offset, 0.0)
            total = values if total is None else total + values
        assert total is not None
        if divisor_override:
            return total / float(divisor_override)
        return total / window.divisor(count_include_pad)

    return avg_pool


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    aten.max_pool2d_with_indices.default: _max_pool(2),
    aten.max_pool3d_with_indices.default: _max_pool(3),
    aten.avg_pool2d.default: _avg_pool(2),
    aten.avg_pool3d.default: _avg_pool(3),
}


def _functional_max_pool1d(
    x: torch.Tensor,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    values, indices = _max_pool(1)(x, kernel_size, stride or (), padding, dilation, ceil_mode)
    return (values, indices) if return_indices else values


class CompositePooling(TorchFunctionMode):
    """Routes 1-D max pooling to the decomposition above: torch.max_pool1d is a composite ATen op
    that the trace never sees as itself (its C++ checks sizes as ints, pinning the pooled dim)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.max_pool1d or func is torch.max_pool1d:
            return _functional_max_pool1d(*args, **kwargs)
        if func is torch.nn.functional.max_pool1d_with_indices or func is torch.max_pool1d_with_indices:
            return _functional_max_pool1d(*args, **{**kwargs, "return_indices": True})
        return func(*args, **kwargs)
