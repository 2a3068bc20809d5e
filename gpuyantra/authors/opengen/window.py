"""Window geometry shared by pooling (pooling.py) and convolution (convolution.py): the output
sizes of a window op over the last n dims, and per window offset the gather of the input each output
reads there (index clamped into range, value masked where it falls in the padding, or between a
transposed convolution's strided positions). Sizes stay symbolic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch

from gpuyantra.authors.opengen.spec import Unsupported


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
    return out


def _at_least_two(out: Any, size: Any) -> Any:
    # One output position along a symbolic dim would be specialized by the trace (sizes 0 and 1
    # are), and a graph traced at such sizes differs from the general one: refused.
    if isinstance(out, torch.SymInt) and out < 2:
        raise Unsupported(f"a window op to {out} output position(s) along a dim of {size}")
    return out


def _axis(values: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """A 1-D tensor shaped to broadcast along pooled dim `dim` of n."""
    shape = [1] * n
    shape[dim] = -1
    return values.reshape(shape)


class Window:
    """The windowed dims' geometry (the last n of x): output sizes and, per window offset, where
    each output reads (pooling and convolution)."""

    def __init__(self, x: torch.Tensor, n: int, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil: bool):
        self._setup(x, n, kernel, stride, padding, dilation)
        self.out = [
            _at_least_two(_out_size(size, k, s, p, d, ceil), size)
            for size, k, s, p, d in zip(self.sizes, self.kernel, self.stride, self.padding, self.dilation)
        ]

    def _setup(self, x: torch.Tensor, n: int, kernel: Any, stride: Any, padding: Any, dilation: Any) -> None:
        if not x.is_floating_point():
            raise Unsupported("a window op over a non-floating tensor")
        self.x, self.n = x, n
        self.kernel = _per_dim(kernel, n)
        self.stride = _per_dim(stride, n, self.kernel)
        self.padding = _per_dim(padding, n)
        self.dilation = _per_dim(dilation, n)
        self.sizes = list(x.shape[-n:])

    def outputs(self, dim: int) -> torch.Tensor:
        """0 .. out - 1 along dim; prims.iota keeps a symbolic length (aten.arange's decomposition
        would pin it to an int)."""
        return torch.ops.prims.iota(
            self.out[dim], start=0, step=1, dtype=torch.int64, device=self.x.device, requires_grad=False
        )

    def starts(self, dim: int) -> torch.Tensor:
        """Where each output's window starts along dim (in input coordinates: may be negative)."""
        return self.outputs(dim) * self.stride[dim] - self.padding[dim]

    def position(self, dim: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input position, whether it lies inside the input) each output reads at offset j of dim."""
        pos = self.starts(dim) + j * self.dilation[dim]
        return pos, (pos >= 0) & (pos < self.sizes[dim])

    def offsets(self) -> Any:
        return itertools.product(*(range(k) for k in self.kernel))

    def read(self, offset: Sequence[int], fill: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, flat index over the pooled dims) at one window offset; padding reads `fill`."""
        reads = [self._placed_read(dim, j) for dim, j in enumerate(offset)]
        values = self._gather(reads, fill)
        flat = reads[0][0]
        for dim in range(1, self.n):
            flat = flat * self.sizes[dim] + reads[dim][0]
        return values, flat

    def read_values(self, offset: Sequence[int], fill: float) -> torch.Tensor:
        """`read`'s values alone (average pooling needs no index)."""
        return self._gather([self._placed_read(dim, j) for dim, j in enumerate(offset)], fill)

    def _placed_read(self, dim: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(clamped index, inside) of offset j along dim, shaped to broadcast there; made once per
        (dim, j): a k x k window reads k^2 offsets but has 2k distinct positions, and an op made again
        is traced again (symbolic sizes: hundreds of nodes each) and written again into the kernel."""
        placed: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = self.__dict__.setdefault("_placed", {})
        if (dim, j) not in placed:
            pos, inside = (_axis(t, dim, self.n) for t in self.position(dim, j))
            placed[(dim, j)] = (self._clamped(dim, pos), inside)
        return placed[(dim, j)]

    def _clamped(self, dim: int, pos: torch.Tensor) -> torch.Tensor:
        return pos.clamp(0, self.sizes[dim] - 1)

    def read_all(self, fill: float) -> torch.Tensor:
        """Every window offset at once: values [..., offsets, *out] (offsets in `offsets()` order),
        padding reading `fill`. One gather whose index has an offsets axis, where a stack of
        `read`s would become one load per offset in a kernel."""
        count = math.prod(self.kernel)
        flat = torch.ops.prims.iota(
            count, start=0, step=1, dtype=torch.int64, device=self.x.device, requires_grad=False
        )
        reads = []
        below = count
        for dim, k in enumerate(self.kernel):
            below //= k
            j = (flat // below % k).reshape(-1, 1)  # this dim's offset of each flat offset, [offsets, 1]
            shape = [count] + [1] * self.n
            shape[1 + dim] = -1
            pos, inside = (t.reshape(shape) for t in self.position(dim, j))  # [offsets, out] placed
            reads.append((self._clamped(dim, pos), inside))
        return self._gather(reads, fill)

    def _gather(self, reads: Sequence[tuple[torch.Tensor, torch.Tensor]], fill: float) -> torch.Tensor:
        """The values of one gather: `reads` holds per window dim its (clamped index, inside), shaped
        to broadcast; outside the input reads `fill`."""
        valid = reads[0][1]
        for _, inside in reads[1:]:
            valid = valid & inside
        where: tuple[Any, ...] = (Ellipsis, *(index for index, _ in reads))
        return torch.where(valid, self.x[where], fill)

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


class TransposedWindow(Window):
    """A transposed convolution's window: output position o reads input position
    (o + padding - j * dilation) / stride where that divides exactly."""

    def __init__(self, x: torch.Tensor, n: int, kernel: Any, stride: Any, padding: Any, dilation: Any, extra: Any):
        self._setup(x, n, kernel, stride, padding, dilation)
        self.out = [
            _at_least_two((size - 1) * s - 2 * p + d * (k - 1) + e + 1, size)
            for size, k, s, p, d, e in zip(
                self.sizes, self.kernel, self.stride, self.padding, self.dilation, _per_dim(extra, n)
            )
        ]

    def position(self, dim: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        shifted = self.outputs(dim) + self.padding[dim] - j * self.dilation[dim]
        pos = torch.div(shifted, self.stride[dim], rounding_mode="floor")
        inside = (shifted >= 0) & (pos < self.sizes[dim])
        if self.stride[dim] > 1:
            inside = inside & (shifted - pos * self.stride[dim] == 0)
        return pos, inside
