"""What an open target is made of: its inputs, parameters and the shapes and values a case draws."""

from __future__ import annotations

import types
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
# The plan classes' sizes along an open target's variable dims (`OpenTarget.class_keys`): a width
# between tile sizes, a prefill row count, a size no tile divides (a GEMM's K), past a persistent
# loop's reach (2^20 elements on CUDA). The CPU case cap (2^15 elements) shrinks them there.
OPEN_CLASS_SIZES = {"cpu": (5120, 130, 203, 1 << 16), "cuda": (5120, 2053, 1003, (1 << 20) + 7)}


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
    # Dotted path on the module ("weight", "ln.weight"); for a forward argument, its name in the forward.
    module_attr: str
    kind: str  # "tensor" | "float"; a forward argument: "float" | "int" | "bool" (see ARGUMENT_KINDS)
    shape: tuple[int, ...] = ()
    dtype: str = ""
    value: float = 0.0  # a forward argument's live value keeps its type (an int, a bool)
    positive: bool = False  # every live value >= 0 (running variances, scales): drawn positive
    # A number the forward takes as its positional argument at this index (`forward(self, A, s)`:
    # s at 1), which every call passes and entry takes as a keyword; -1: read from the module.
    argument: int = -1


# Kinds of the numbers a forward may take as positional arguments besides its tensors. A float is
# a value of each call: the verifier draws it around the live one, so a kernel that bakes it fails.
# An int or a bool selects behaviour (a dim, a flag), as an integer attribute does: the verifier
# keeps it live, and a kernel written for the live value must refuse any other.
ARGUMENT_KINDS = ("float", "int", "bool")


def argument_kind(value: Any) -> str | None:
    """The kind of a number forward argument (see ARGUMENT_KINDS), None for anything else."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return None


def split_arguments(inputs: Sequence[Any]) -> tuple[list[Tensor], list[tuple[int, Any]]]:
    """(the tensors among a forward's positional arguments, (position, value) of each number
    among them). Raises OpenTargetError for any other kind of argument."""
    tensors: list[Tensor] = []
    arguments: list[tuple[int, Any]] = []
    for position, value in enumerate(inputs):
        if isinstance(value, Tensor):
            tensors.append(value)
        elif argument_kind(value) is not None:
            arguments.append((position, value))
        else:
            raise OpenTargetError(
                f"forward argument {position} is a {type(value).__name__}: an open target takes tensors "
                "and numbers (float, int, bool)"
            )
    return tensors, arguments


def forward_args(tensors: Sequence[Any], arguments: Sequence[tuple[int, Any]]) -> list[Any]:
    """The forward's positional arguments: `tensors` in order, each (position, value) of
    `arguments` at its position."""
    args = list(tensors)
    for position, value in sorted(arguments, key=lambda item: item[0]):
        args.insert(position, value)
    return args


class WithArguments(torch.nn.Module):
    """`module` called with its number forward arguments filled in: its forward takes the tensors
    only. `arguments`: (name, position in the forward, value); each value is the attribute `name`
    of `self.values`, which a caller may set (the open author traces a float at other values)."""

    def __init__(self, module: torch.nn.Module, arguments: Sequence[tuple[str, int, Any]]):
        super().__init__()
        self.inner = module
        self.positions = tuple((name, int(position)) for name, position, _ in arguments)
        self.values = types.SimpleNamespace(**{name: value for name, _, value in arguments})

    def forward(self, *tensors: Any) -> Any:
        return self.inner(*forward_args(tensors, [(p, getattr(self.values, n)) for n, p in self.positions]))


def with_arguments(module: torch.nn.Module, arguments: Sequence[tuple[int, Any]]) -> torch.nn.Module:
    """`module` itself when its forward takes tensors only, else a WithArguments of the live values."""
    if not arguments:
        return module
    return WithArguments(module, [(f"arg{position}", position, value) for position, value in arguments])


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
