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

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from gpuyantra.authors.opengen.spec import Unsupported

aten = torch.ops.aten


def _per_dim(value: Any, n: int, default: Sequence[int] | None = None) -> list[int]:
    """A pooling argument (int or list of 1 or n ints, or empty for the default) as n ints."""
    if isinstance(value, int):
        return [value] * n
    values = list(value)
    if not values and default is not None:
        return list(default)
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise Unsupported(f"a pooling argument of {len(values)} values over {n} dims")
    return [int(v) for v in values]


def _out_size(size: Any, k: int, s: int, p: int, d: int, ceil_mode: bool) -> Any:
    """ATen's pooling_output_shape."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside the input or left pad
        out = out - 1
    # One output position along a symbolic dim would be specialized by the trace (sizes 0 and 1
    # are), and a graph traced at such sizes differs from the general one: refused.
    if isinstance(out, torch.SymInt) and out < 2:
        raise Unsupported(f"pooling to {out} output position(s) along a dim of {size}")
    return out


def _axis(values: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """A 1-D tensor shaped to broadcast along pooled dim `dim` of n."""
    shape = [1] * n
    shape[dim] = -1
    return values.reshape(shape)


class _Window:
    """The pooled dims' geometry: output sizes and, per window offset, where each output reads."""

    def __init__(self, x: torch.Tensor, n: int, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil: bool):
        if not x.is_floating_point():
            raise Unsupported("pooling of a non-floating tensor")
        self.x, self.n = x, n
        self.kernel = _per_dim(kernel, n)
        self.stride = _per_dim(stride, n, self.kernel)
        self.padding = _per_dim(padding, n)
        self.dilation = _per_dim(dilation, n)
        self.sizes = list(x.shape[-n:])
        self.out = [
            _out_size(size, k, s, p, d, ceil)
            for size, k, s, p, d in zip(self.sizes, self.kernel, self.stride, self.padding, self.dilation)
        ]

    def starts(self, dim: int) -> torch.Tensor:
        """Where each output's window starts along dim (in input coordinates: may be negative)."""
        # prims.iota keeps a symbolic length (aten.arange's decomposition would pin it to an int).
        o = torch.ops.prims.iota(
            self.out[dim], start=0, step=1, dtype=torch.int64, device=self.x.device, requires_grad=False
        )
        return o * self.stride[dim] - self.padding[dim]

    def offsets(self) -> Any:
        return itertools.product(*(range(k) for k in self.kernel))

    def read(self, offset: Sequence[int], fill: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, flat index over the pooled dims) at one window offset; padding reads `fill`."""
        index: list[torch.Tensor] = []
        valid: torch.Tensor | None = None
        flat: torch.Tensor | None = None
        for dim, j in enumerate(offset):
            pos = self.starts(dim) + j * self.dilation[dim]
            inside = (pos >= 0) & (pos < self.sizes[dim])
            pos = pos.clamp(0, self.sizes[dim] - 1)
            index.append(_axis(pos, dim, self.n))
            valid = _axis(inside, dim, self.n) if valid is None else valid & _axis(inside, dim, self.n)
            flat = index[-1] if flat is None else flat * self.sizes[dim] + index[-1]
        assert valid is not None and flat is not None
        where: tuple[Any, ...] = (Ellipsis, *index)
        values = self.x[where]
        return torch.where(valid, values, fill), flat

    def divisor(self, count_include_pad: bool) -> torch.Tensor:
        """ATen's divide_factor per output position (float), without divisor_override."""
        total: torch.Tensor | None = None
        for dim in range(self.n):
            start = self.starts(dim)
            end = torch.clamp(start + self.kernel[dim], max=self.sizes[dim] + self.padding[dim])
            if not count_include_pad:
                end = torch.clamp(end, max=self.sizes[dim])
                start = torch.clamp(start, min=0)
            size = _axis(end - start, dim, self.n)
            total = size if total is None else total * size
        assert total is not None
        return total.to(self.x.dtype)


def _max_pool(n: int) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    def max_pool_with_indices(
        x: torch.Tensor,
        kernel_size: Any,
        stride: Any = (),
        padding: Any = 0,
        dilation: Any = 1,
        ceil_mode: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        window = _Window(x, n, kernel_size, stride, padding, dilation, ceil_mode)
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
        window = _Window(x, n, kernel_size, stride, padding, 1, ceil_mode)
        total: torch.Tensor | None = None
        for offset in window.offsets():
            values, _ = window.read(offset, 0.0)
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
