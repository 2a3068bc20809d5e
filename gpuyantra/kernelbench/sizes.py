"""Size caps on CPU, where kernels run in Triton's interpreter: how a problem too large for it is run
at reduced sizes of itself (its own `get_inputs()` drawing smaller shapes)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from gpuyantra.ops.base import numel
from gpuyantra.ops.open.spec import halve, with_arguments

# On CPU, kernels run in Triton's interpreter: inputs above this many elements are reduced (the
# same problem with its variable dims halved down to REDUCED_ELEMENTS per input), or skipped.
CPU_MAX_ELEMENTS = 4 * 1024 * 1024
REDUCED_ELEMENTS = 1 << 16
# ...and the reduced problem's outputs at most this many (an outer product or a matmul's output
# grows with the product of its inputs' dims).
REDUCED_OUTPUT_ELEMENTS = 1 << 20


def plan_reduced_sizes(
    module: ModuleType, model: torch.nn.Module, cap: int
) -> tuple[dict[tuple[int, ...], tuple[int, ...]] | None, str]:
    """({live shape: reduced shape}, why) for a problem whose inputs are too large for the CPU
    interpreter: the dims the Model accepts changing are halved until each input holds at most
    `cap` elements. (None, why not) when that cannot be done."""
    from gpuyantra.ops.open import OpenInput, dim_links, reduced_shapes

    try:
        with torch.device("meta"):
            meta_inputs, arguments = _split(list(module.get_inputs()))
    except Exception as exc:  # noqa: BLE001
        return None, f"get_inputs() cannot run on the meta device to read its shapes ({type(exc).__name__})"
    if not meta_inputs:
        return None, "the problem has no tensor inputs, or inputs other than tensors and numbers"
    model = with_arguments(model, arguments)  # the sizes are the tensors' (numbers kept at their values)
    specs = [OpenInput(f"x{i}", tuple(t.shape), str(t.dtype).replace("torch.", "")) for i, t in enumerate(meta_inputs)]
    links = dim_links(model, specs)
    live = [s.shape for s in specs]
    shapes = reduced_shapes(live, links, cap)
    if shapes is None:
        dims = [[own for own, _ in pairs] for pairs in links]
        return None, f"its fixed dims alone exceed {cap:,} elements (variable dims per input: {dims})"
    dtypes = [t.dtype for t in meta_inputs]
    meta_model = _meta_copy(model)
    if meta_model is not None:
        shapes = _outputs_kept(meta_model, live, shapes, links, dtypes, cap)
    shapes = _same_live_same_reduced(live, shapes, links, cap)
    if meta_model is not None:
        shapes = _outputs_bounded(meta_model, live, shapes, links, dtypes)
    sizes = {tuple(a): tuple(b) for a, b in zip(live, shapes) if tuple(a) != tuple(b)}
    return sizes, ", ".join(f"{list(a)} -> {list(b)}" for a, b in sizes.items())


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module | None:
    """The Model on the meta device (forwards read shapes only), or None where it cannot move."""
    try:
        return copy.deepcopy(model).to("meta")
    except Exception:  # noqa: BLE001 - the inputs' bounds stand alone
        return None


def _output_shapes(
    meta_model: torch.nn.Module, shapes: Sequence[Sequence[int]], dtypes: Sequence[torch.dtype]
) -> list[tuple[int, ...]] | None:
    """The shapes of the Model's tensor outputs on inputs of `shapes`; None where it refuses them."""
    try:
        with torch.no_grad():
            outputs = meta_model(*[torch.empty(tuple(s), dtype=dt, device="meta") for s, dt in zip(shapes, dtypes)])
    except Exception:  # noqa: BLE001 - a kernel larger than the input, and the like
        return None
    items = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    return [tuple(t.shape) for t in items if isinstance(t, torch.Tensor)]


def _degenerate(live: list[tuple[int, ...]] | None, reduced: list[tuple[int, ...]] | None) -> bool:
    """Whether the reduced outputs lost what the live ones have: the Model refuses the inputs, or an
    output dim of 2 or more at live sizes is down to 0 or 1 (one window of a pool, which the trace
    would bake as a constant)."""
    if reduced is None:
        return True
    if live is None or len(live) != len(reduced):
        return live is not None
    return any(len(a) != len(b) or any(x >= 2 > y for x, y in zip(a, b)) for a, b in zip(live, reduced))


def _outputs_kept(
    meta_model: torch.nn.Module,
    live: Sequence[Sequence[int]],
    shapes: list[tuple[int, ...]],
    links: Sequence[Sequence[tuple[int, int]]],
    dtypes: Sequence[torch.dtype],
    cap: int,
) -> list[tuple[int, ...]]:
    """`shapes`, or, where the Model refuses them or they leave an output dim of at most one
    position (an 11-wide pool over planes halved to 17: one window), a reduction that halves at
    each step the largest of input 0's variable dims whose halving keeps the outputs whole. A
    pooling problem then keeps its planes and loses batch and channels instead."""
    from gpuyantra.ops.open.spec import follow_shapes

    live_out = _output_shapes(meta_model, live, dtypes)
    if not _degenerate(live_out, _output_shapes(meta_model, shapes, dtypes)):
        return shapes
    dims0 = [own for own, _ in links[0]] if links else []
    first = [int(d) for d in live[0]]
    while True:
        trial = follow_shapes(live, links, first)
        if all(numel(s) <= cap for s in trial):
            return trial
        for d in sorted((d for d in dims0 if first[d] > 1), key=lambda i: -first[i]):
            halved = [halve(n) if i == d else n for i, n in enumerate(first)]
            if not _degenerate(live_out, _output_shapes(meta_model, follow_shapes(live, links, halved), dtypes)):
                first = halved
                break
        else:
            return shapes  # no halving keeps the outputs: the plain reduction stands


def _outputs_bounded(
    meta_model: torch.nn.Module,
    live: Sequence[Sequence[int]],
    shapes: list[tuple[int, ...]],
    links: Sequence[Sequence[tuple[int, int]]],
    dtypes: Sequence[torch.dtype],
) -> list[tuple[int, ...]]:
    """`shapes` with input 0's variable dims halved further (the others follow) while the Model's
    outputs on them (a forward on the meta device) hold more than REDUCED_OUTPUT_ELEMENTS."""
    from gpuyantra.ops.open.spec import follow_shapes

    dims0 = [own for own, _ in links[0]] if links else []
    first = [int(d) for d in shapes[0]]
    # Outputs unknown (data-dependent ops): the inputs' bound stands alone.
    while sum(numel(s) for s in _output_shapes(meta_model, shapes, dtypes) or []) > REDUCED_OUTPUT_ELEMENTS:
        movable = [d for d in dims0 if first[d] > 1]
        if not movable:
            break
        d = max(movable, key=lambda i: first[i])
        first[d] = halve(first[d])
        shapes = [tuple(s) for s in follow_shapes(live, links, first)]
    return shapes


def _same_live_same_reduced(
    live: Sequence[Sequence[int]],
    shapes: Sequence[Sequence[int]],
    links: Sequence[Sequence[tuple[int, int]]],
    cap: int,
) -> list[tuple[int, ...]]:
    """The factories are resized by the shape they were asked for, so inputs drawn with the same
    live shape (a square matmul's A and B) get one reduced shape: when the per-input reductions
    differ, every variable dim of the group is halved together until each holds at most `cap`."""
    out = [tuple(int(d) for d in s) for s in shapes]
    for shape in {tuple(s) for s in live}:
        group = [i for i, s in enumerate(live) if tuple(s) == shape]
        if len({out[i] for i in group}) <= 1:
            continue
        dims = sorted({own for i in group for own, _ in links[i]} | {d for i in group for d in _moved(live[i], out[i])})
        common = [int(d) for d in shape]
        while numel(common) > cap and any(common[d] > 1 for d in dims):
            common = [halve(n) if d in dims else n for d, n in enumerate(common)]
        for i in group:
            out[i] = tuple(common)
    return out


def _moved(live: Sequence[int], reduced: Sequence[int]) -> list[int]:
    return [d for d, (a, b) in enumerate(zip(live, reduced)) if a != b]


# ---------------------------------------------------------------------------------------------
# Reduced Models: a Model whose parameters are too large for the interpreter is built from reduced
# get_init_inputs(), its dimension integers scaled down together.

# The reduced Model's parameters and buffers hold at most this many elements (a 64 x 64 Linear),
# unless a constraint of the Model (GroupNorm's groups dividing its channels...) keeps them larger.
REDUCED_PARAMETERS = 1 << 13
# Integers at or below this size are never reduced (kernel sizes, dims, small counts), nor is a
# dimension reduced below it.
MIN_REDUCED_DIM = 16
# When the Model refuses smaller sizes, the reduced dimensions stay this factor above the smallest
# it accepts where the cap allows (GroupNorm(512, 2048), not GroupNorm(512, 512)).
CONSTRAINT_MARGIN = 4

Shapes = dict[tuple[int, ...], tuple[int, ...]]


@dataclass
class ModelReduction:
    """How a problem runs at reduced sizes of itself on CPU: the reduced init inputs, {live input
    shape: reduced shape}, and the two in words for the report."""

    init: list[Any]
    sizes: Shapes
    how: str


def plan_reduced_model(module: ModuleType, cap: int) -> tuple[ModelReduction | None, str]:
    """(reduction, "") for a problem whose Model is too large for the CPU interpreter, else (None, why).

    The *dimension values* are the integers of get_init_inputs() (tuples and lists included) that
    size the Model's parameters or buffers: changing one, everywhere it occurs, changes their shapes
    (on the meta device). Every occurrence of such a value, in the init inputs and in the input
    shapes (`in_features` is the input's last dim), is divided by the same power of two, down to
    MIN_REDUCED_DIM; floats, other integers (group counts, kernel sizes, dims) and other arguments
    are kept. Each candidate is checked by building the reduced Model on the meta device and running
    its forward on meta tensors of the reduced input shapes. The least reduced candidate whose
    parameters hold at most REDUCED_PARAMETERS is taken, else the smallest within `cap`; but when
    the Model refuses smaller sizes (a GroupNorm's group count must divide its channels), candidates
    within a factor CONSTRAINT_MARGIN of the smallest size it accepts come last (one channel per
    group is a degenerate instance of the problem). The inputs are then reduced further as
    `plan_reduced_sizes` does, to REDUCED_ELEMENTS each."""
    try:
        init = list(module.get_init_inputs())
        with torch.device("meta"):
            meta_inputs, arguments = _split(list(module.get_inputs()))
    except Exception as exc:  # noqa: BLE001
        return None, f"get_inputs() / get_init_inputs() cannot run to read the sizes ({type(exc).__name__})"
    if not meta_inputs:
        return None, "the problem has no tensor inputs, or inputs other than tensors and numbers"
    live_params = _meta_parameter_shapes(module, init)
    if live_params is None:
        return None, "its Model cannot be built on the meta device"
    values = dimension_values(module, init, live_params)
    if not values:
        return None, "no integer of get_init_inputs() sizes the Model's parameters"
    live = [tuple(int(d) for d in t.shape) for t in meta_inputs]
    dtypes = [t.dtype for t in meta_inputs]
    candidates: list[_Candidate] = []
    tried: list[str] = []
    shift, previous = 1, None
    while True:
        mapping = {v: max(v >> shift, MIN_REDUCED_DIM) for v in values}
        if mapping == previous:
            break
        small_init = substitute(init, mapping)
        shapes = [tuple(mapping.get(d, d) for d in s) for s in live]
        checked = _check_reduced(module, small_init, shapes, dtypes, arguments)
        if isinstance(checked, str):
            tried.append(f"{_changed(init, small_init)}: {checked}")
            candidates.append(_Candidate(shift, small_init, shapes))
        else:
            candidates.append(_Candidate(shift, small_init, shapes, *checked))
        previous, shift = mapping, shift + 1
    for candidate in _preferred(candidates, cap):
        assert candidate.meta_model is not None  # only candidates that build and run are preferred
        sizes, why = _reduce_inputs(candidate.meta_model, live, candidate.shapes, dtypes)
        if sizes is None:
            tried.append(f"{_changed(init, candidate.init)}: {why}")
            continue
        how = f"init {_changed(init, candidate.init)}"
        if sizes:
            how += "; " + ", ".join(f"{list(a)} -> {list(b)}" for a, b in sizes.items())
        return ModelReduction(candidate.init, sizes, how), ""
    why = f"no reduced size of its init inputs builds and runs within {cap:,} parameter elements"
    return None, why + (f" ({'; '.join(tried[-2:])})" if tried else "")


@dataclass
class _Candidate:
    shift: int  # dimension values divided by 2**shift
    init: list[Any]
    shapes: list[tuple[int, ...]]
    params: int = -1  # the reduced Model's parameter and buffer elements; -1: it fails to build or run
    meta_model: torch.nn.Module | None = None


def _preferred(candidates: Sequence[_Candidate], cap: int) -> list[_Candidate]:
    """The candidates that build and run within `cap`, best first (see plan_reduced_model)."""
    runs = [c for c in candidates if c.meta_model is not None]
    fails = [c.shift for c in candidates if c.meta_model is None]
    smallest = max((c.shift for c in runs), default=None)
    limit = None  # the Model refuses smaller sizes: keep a margin above the smallest it accepts
    if smallest is not None and any(f > smallest for f in fails):
        limit = smallest - (CONSTRAINT_MARGIN.bit_length() - 1)  # shifts of the margin: log2
    fits = [c for c in runs if c.params <= cap]
    clear = [c for c in fits if limit is None or c.shift <= limit]
    near = [c for c in fits if limit is not None and c.shift > limit]
    target = min(REDUCED_PARAMETERS, cap)
    first = sorted((c for c in clear if c.params <= target), key=lambda c: c.shift)
    then = sorted((c for c in clear if c.params > target), key=lambda c: c.params)
    return first + then + sorted(near, key=lambda c: c.shift)


def dimension_values(
    module: ModuleType, init: Sequence[Any], live_params: list[tuple[int, ...]] | None = None
) -> list[int]:
    """The integers of `init` (above MIN_REDUCED_DIM, nested ones included) whose change, wherever
    they occur, changes the shapes of the Model's parameters and buffers (built on the meta device)."""
    if live_params is None:
        live_params = _meta_parameter_shapes(module, init)
    if live_params is None:
        return []
    found = []
    for value in sorted(set(_ints(init))):
        if value <= MIN_REDUCED_DIM:
            continue
        for other in (value // 2, value * 2):
            shapes = _meta_parameter_shapes(module, substitute(init, {value: other}))
            if shapes is not None and shapes != live_params:
                found.append(value)
                break
    return found


def substitute(value: Any, mapping: dict[int, int]) -> Any:
    """`value` with every int in `mapping` replaced, inside lists and tuples too (bools kept)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return mapping.get(value, value)
    if isinstance(value, list):
        return [substitute(v, mapping) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(substitute(v, mapping) for v in value)
    return value


def _ints(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in _ints(v)]
    return []


def _changed(init: Sequence[Any], small: Sequence[Any]) -> str:
    """The init inputs that differ, as `[8192, 8192] -> [64, 64]`."""
    pairs = [(a, b) for a, b in zip(init, small) if a != b]
    return f"[{', '.join(repr(a) for a, _ in pairs)}] -> [{', '.join(repr(b) for _, b in pairs)}]"


def _split(inputs: list[Any]) -> tuple[list[torch.Tensor], list[tuple[int, Any]]]:
    """(the tensors of get_inputs(), (position, value) of its numbers); no tensors when it holds
    anything else."""
    from gpuyantra.ops.open import OpenTargetError, split_arguments

    try:
        return split_arguments(inputs)
    except OpenTargetError:
        return [], []


def _meta_model(module: ModuleType, init: Sequence[Any]) -> torch.nn.Module | None:
    try:
        with torch.device("meta"):
            return module.Model(*copy.deepcopy(list(init)))
    except Exception:  # noqa: BLE001 - these init inputs do not build the Model
        return None


def _meta_parameter_shapes(module: ModuleType, init: Sequence[Any]) -> list[tuple[int, ...]] | None:
    model = _meta_model(module, init)
    if model is None:
        return None
    return [tuple(t.shape) for t in [*model.parameters(), *model.buffers()]]


def _check_reduced(
    module: ModuleType,
    init: Sequence[Any],
    shapes: Sequence[tuple[int, ...]],
    dtypes: Sequence[torch.dtype],
    arguments: Sequence[tuple[int, Any]] = (),
) -> tuple[int, torch.nn.Module] | str:
    """(parameter elements, the meta Model) when the Model builds from `init` and its forward runs
    on meta inputs of `shapes` (and the number `arguments` at their positions); else why not. The
    Model returned takes the tensors alone."""
    built = _meta_model(module, init)
    if built is None:
        return "the Model does not build"
    model = with_arguments(built, arguments)
    args = [torch.empty(s, dtype=dt, device="meta") for s, dt in zip(shapes, dtypes)]
    try:
        with torch.no_grad():
            copy.deepcopy(model)(*args)
    except Exception as exc:  # noqa: BLE001 - the forward refuses these sizes
        return f"its forward refuses inputs {[list(s) for s in shapes]} ({type(exc).__name__})"
    return sum(t.numel() for t in [*model.parameters(), *model.buffers()]), model


def _reduce_inputs(
    meta_model: torch.nn.Module,
    live: Sequence[tuple[int, ...]],
    shapes: Sequence[tuple[int, ...]],
    dtypes: Sequence[torch.dtype],
) -> tuple[Shapes | None, str]:
    """{live shape: reduced shape} from the inputs at the reduced Model's sizes (`shapes`), their
    variable dims halved further until each holds at most REDUCED_ELEMENTS."""
    from gpuyantra.ops.open import OpenInput, dim_links, reduced_shapes

    specs = [OpenInput(f"x{i}", s, str(dt).replace("torch.", "")) for i, (s, dt) in enumerate(zip(shapes, dtypes))]
    links = dim_links(meta_model, specs)
    final = reduced_shapes(shapes, links, REDUCED_ELEMENTS)
    if final is None:
        return None, f"its fixed dims alone exceed {REDUCED_ELEMENTS:,} elements"
    final = _same_live_same_reduced(shapes, final, links, REDUCED_ELEMENTS)
    return {tuple(a): tuple(b) for a, b in zip(live, final) if tuple(a) != tuple(b)}, ""
