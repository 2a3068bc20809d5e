"""What an open target is made of: its inputs, parameters and the shapes and values a case draws."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gpuyantra.ops.base import Tensor, numel, resolve_attr

OPEN_PREFIX = "open."


DOMAINS = ("real", "positive", "unit", "simplex", "int", "bool")


# Floats a probe moves to see whether an attribute changes the output.
_PROBE_FACTOR, _PROBE_SHIFT = 1.37, 0.11


# Element caps for the verifier's correctness cases (the parent keeps a float64 reference of each).
CPU_CASE_ELEMENTS = 1 << 15


CUDA_CASE_ELEMENTS = 1 << 24


# Stress sizes along the largest variable dim: past a 1024-program grid on the CPU interpreter, past
# a 65,535 grid dimension and a 16,384-wide tile on CUDA.
STRESS_SIZE = {"cpu": 1031, "cuda": 70001}


class CaseKey(tuple):
    """A case key (`OpenTarget.case_key`: every input's shapes of one call) passed where a family
    takes leading dims (`activations_for_module`): an open target draws that call's inputs."""

    __slots__ = ()


class OpenTargetError(ValueError):
    """The module and inputs cannot make an open target (one-line reason)."""


@dataclass(frozen=True)
class OpenInput:
    name: str
    shape: tuple[int, ...]
    dtype: str
    domain: str = "real"  # see DOMAINS
    high: int = 0  # integer inputs: values in [0, high)
    # Integer inputs that index a dim of input 0 (class ids of a cross-entropy): values in
    # [0, size of that dim) whatever size the case gives it. -1: `high` is fixed.
    high_dim: int = -1


@dataclass(frozen=True)
class OpenParam:
    kernel_param: str
    module_attr: str  # dotted path on the module: "weight", "ln.weight"
    kind: str  # "tensor" | "float"
    shape: tuple[int, ...] = ()
    dtype: str = ""
    value: float = 0.0
    positive: bool = False  # every live value >= 0 (running variances, scales): drawn positive


def draw_input(
    spec: OpenInput,
    shape: tuple[int, ...],
    dtype: torch.dtype | None,
    device: torch.device | str,
    generator: torch.Generator,
    scale: float,
    first: Sequence[int] | None = None,
) -> Tensor:
    """One activation drawn in its domain (a dtype given overrides a floating input's own);
    `first` is input 0's shape, which an index input's range may follow."""
    where = generator.device
    own = _dtype(spec.dtype)
    if spec.domain == "int":
        high = spec.high if spec.high_dim < 0 or first is None else int(first[spec.high_dim])
        values = torch.randint(0, max(1, high), shape, generator=generator, device=where)
        if len(shape) >= 1 and shape[0] > 1 and high >= 2:
            # Rows never all alike (a position per batch row): a kernel that reads row 0 for
            # every row must fail, whatever the draw.
            rows = values.reshape(shape[0], -1)
            if bool((rows == rows[:1]).all()):
                step = torch.arange(shape[0], device=where).reshape(-1, *([1] * (len(shape) - 1)))
                values = (values + step) % high
        return values.to(device=device, dtype=own)
    if spec.domain == "bool":
        return (torch.rand(shape, generator=generator, device=where) < 0.5).to(device)
    out_dtype = dtype if dtype is not None and own.is_floating_point else own
    if spec.domain == "unit":
        values = torch.rand(shape, generator=generator, device=where)
    elif spec.domain == "positive":
        values = torch.randn(shape, generator=generator, device=where).abs() * abs(scale) + 1e-3
    elif spec.domain == "simplex":
        values = torch.randn(shape, generator=generator, device=where).softmax(dim=-1)
    else:
        values = torch.randn(shape, generator=generator, device=where) * scale
    return values.to(device=device, dtype=out_dtype)


def follow_shapes(
    live: Sequence[Sequence[int]], links: Sequence[Sequence[tuple[int, int]]], first: Sequence[int]
) -> list[tuple[int, ...]]:
    """Every input's shape when input 0 takes shape `first`: each linked dim takes the size of
    the input-0 dim it follows; every other dim keeps its live size."""
    out: list[tuple[int, ...]] = [tuple(int(d) for d in first)]
    for index, shape_live in enumerate(live[1:], start=1):
        shape = [int(d) for d in shape_live]
        for own, dim0 in links[index] if index < len(links) else ():
            if dim0 < len(first):
                shape[own] = int(first[dim0])
        out.append(tuple(shape))
    return out


def reduced_shapes(
    live: Sequence[Sequence[int]], links: Sequence[Sequence[tuple[int, int]]], cap: int
) -> list[tuple[int, ...]] | None:
    """Smaller shapes of the same problem: input 0's variable dims halved until every input holds
    at most `cap` elements (the others follow). None when the fixed dims alone are too large."""
    dims0 = [own for own, _ in links[0]] if links else []
    first = [int(d) for d in live[0]]
    while True:
        shapes = follow_shapes(live, links, first)
        if all(numel(s) <= cap for s in shapes):
            return shapes
        movable = [d for d in dims0 if first[d] > 1]
        if not movable:
            return None
        d = max(movable, key=lambda i: first[i])
        first[d] = halve(first[d])


def shrink(shape: list[int], dims: Sequence[int], cap: int) -> list[int]:
    """Halve the largest variable dims until the shape holds at most `cap` elements."""
    shape = list(shape)
    while numel(shape) > cap:
        movable = [d for d in dims if shape[d] > 1]
        if not movable:
            break
        d = max(movable, key=lambda i: shape[i])
        shape[d] = halve(shape[d])
    return shape


TRACE_KEEP = 32  # variable dims are halved below this only when the others are already down to it


def trace_sizes(shape: Sequence[int], dims: Sequence[int], max_elements: int) -> list[int]:
    """Input 0's shape to trace at: its variable dims (largest first) halved to about
    `max_elements`, none below TRACE_KEEP while another is above it (a pooled dim must keep a few
    windows), and each at least 2 (a size-1 dim would trace as a broadcast dim, baked)."""
    first = [int(d) for d in shape]
    for floor in (TRACE_KEEP, 2):
        while numel(first) > max_elements and any(first[d] > floor for d in dims):
            d = max(dims, key=lambda k: first[k])
            first[d] = max(floor, first[d] // 2)
    for d in dims:
        first[d] = max(first[d], 2)
    return first


def halve(size: int) -> int:
    """About half of `size`, odd (sizes the kernel never saw as powers of two)."""
    return max(1, (size // 2) | 1) if size > 3 else 1


def _tensors(out: Any) -> list[Tensor]:
    items = out if isinstance(out, (tuple, list)) else [out]
    return [o for o in items if isinstance(o, Tensor)]


def _owner(module: torch.nn.Module, dotted: str) -> tuple[Any, str, str]:
    parent, _, attr = dotted.rpartition(".")
    return (resolve_attr(module, parent) if parent else module), parent, attr


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise OpenTargetError(f"unknown dtype {name!r}")
    return value


def is_open(name: str | None) -> bool:
    return bool(name) and str(name).startswith(OPEN_PREFIX)
