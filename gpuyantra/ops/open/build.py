"""Building an open target from a live module and the inputs it was called with."""

from __future__ import annotations

import copy
import hashlib
import inspect
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpuyantra.ops.base import Tensor, numel
from gpuyantra.ops.open.spec import (
    _PROBE_FACTOR,
    _PROBE_SHIFT,
    OPEN_PREFIX,
    OpenInput,
    OpenParam,
    OpenTargetError,
    _dtype,
    _owner,
    _tensors,
    argument_kind,
    follow_shapes,
    split_arguments,
    with_arguments,
)
from gpuyantra.ops.open.target import OpenTarget


def build_open_target(
    module: torch.nn.Module,
    inputs: Sequence[Any],
    *,
    name_hint: str | None = None,
    source_file: str | None = None,
    source_module: str | None = None,
    calls: Sequence[Sequence[Sequence[int]]] = (),
) -> OpenTarget:
    """An open target for `module` called as `module(*inputs)`. `calls`: every input's shapes in
    the other live calls seen (prefill, decode at each batch), the evidence of which sizes change
    and which follow each other. Raises OpenTargetError."""
    tensors, arguments = split_arguments(inputs)
    if not tensors:
        raise OpenTargetError("an open target needs tensor inputs")
    module = _cpu_copy(module)
    names = _input_names(module, len(inputs))
    specs = tuple(_input_spec(name, t) for name, t in zip(names, inputs) if isinstance(t, Tensor))
    if specs[0].domain in ("int", "bool") or not specs[0].shape:
        raise OpenTargetError("the first input must be a floating tensor with at least one dim")
    seen = _live_calls(specs, calls)
    # The probes call the forward with its number arguments at their live values: `call` takes the
    # tensors alone (the module itself when there are no numbers).
    call = with_arguments(module, arguments)
    probe = [
        t.detach().to("cpu") if isinstance(t, Tensor) else t for t in rows_the_forward_accepts(module, inputs, 1 << 20)
    ]
    probe_tensors = tuple(t for t in probe if isinstance(t, Tensor))
    specs = _link_index_ranges(specs, call, probe_tensors)
    tensor_params = _tensor_params(module)
    updated, steps, returns_tuple = buffer_updates(module, probe, tensor_params)
    params = tensor_params + _float_params(module, probe)
    params += _argument_params(names, arguments, {p.kernel_param for p in params} | {s.name for s in specs})
    links = dim_links(call, specs, seen)
    free = free_dims(specs, links, seen)
    cls = type(module)
    dotted = f"{cls.__module__}.{cls.__qualname__}"
    # Several inputs: how their sizes relate is part of the name (a kernel verified under other
    # relations is not one for this target).
    dims = (links[1:], free) if len(specs) > 1 else None
    digest = _digest(dotted, specs, params, source_file, (updated, steps), dims)
    slug = re.sub(r"[^a-z0-9]+", "_", (name_hint or cls.__name__).lower()).strip("_")[:40] or "module"
    return OpenTarget(
        op=f"{OPEN_PREFIX}{slug}_{digest}",
        module_class=dotted,
        inputs=specs,
        params=params,
        links=links,
        module=module,
        source_file=source_file,
        source_module=source_module,
        updated_buffers=updated,
        buffer_steps=steps,
        forward_returns_tuple=returns_tuple,
        free=free,
        calls=tuple(seen),
    )


Call = tuple[tuple[int, ...], ...]


def _live_calls(specs: Sequence[OpenInput], calls: Sequence[Sequence[Sequence[int]]]) -> list[Call]:
    """The build call's shapes, then the other live calls' (without repeats). Every call must pass
    each input at the build call's rank: a target describes one way of calling the module."""
    out: list[Call] = [tuple(tuple(int(d) for d in s.shape) for s in specs)]
    for call in calls:
        shapes = tuple(tuple(int(d) for d in shape) for shape in call)
        if len(shapes) != len(specs) or any(len(a) != len(s.shape) for a, s in zip(shapes, specs)):
            raise OpenTargetError(
                f"the module is called with inputs of shapes {[list(a) for a in shapes]} and "
                f"{[list(s.shape) for s in specs]}: other counts or ranks of inputs, which one target cannot describe"
            )
        if shapes not in out:
            out.append(shapes)
    return out


def _run_restoring(module: torch.nn.Module, inputs: Sequence[Any]) -> tuple[list[Tensor], dict[str, Tensor], bool]:
    """(outputs, every buffer after the call, whether the forward returned a tuple) of one forward
    under no_grad; the module's buffers are restored afterwards, so every probe starts alike."""
    saved = {path: b.clone() for path, b in module.named_buffers()}
    try:
        with torch.no_grad():
            out = module(*inputs)
            outputs = [o.clone() for o in _tensors(out)]
            after = {path: b.clone() for path, b in module.named_buffers()}
    finally:
        with torch.no_grad():
            for path, b in module.named_buffers():
                if path in saved:
                    b.copy_(saved[path])
    return outputs, after, isinstance(out, (tuple, list))


def buffer_updates(
    module: torch.nn.Module, inputs: Sequence[Any], tensor_params: Sequence[OpenParam]
) -> tuple[tuple[str, ...], tuple[tuple[str, int], ...], bool]:
    """(kernel params of the floating buffers the forward writes new values into, (attr, step) of
    the integer buffers it advances by a fixed step, whether the forward returns a tuple): found by
    running the forward twice on the probe inputs and comparing the buffers before and after.
    Parameters and inputs the forward writes into are left to the authors, which refuse them."""
    before = {path: b.detach().clone() for path, b in module.named_buffers()}
    if not before:
        return (), (), False  # nothing to update: no probe run
    try:
        _, first, returns_tuple = _run_restoring(module, inputs)
    except Exception:  # noqa: BLE001 - the forward fails: _float_params says why
        return (), (), False
    changed = [p for p, b in before.items() if p in first and not torch.equal(first[p], b)]
    if not changed:
        return (), (), returns_tuple
    kernel = {p.module_attr: p.kernel_param for p in tensor_params}
    updated = tuple(kernel[p] for p in changed if p in kernel)
    steps: list[tuple[str, int]] = []
    for path in changed:
        if path in kernel:
            continue
        delta = first[path] - before[path]
        if before[path].is_floating_point() or delta.numel() != 1:
            raise OpenTargetError(f"the forward updates buffer {path}, which is not a bound parameter")
        # The step must not depend on the values: one more call from the updated state moves it alike.
        owner, _, attr = _owner(module, path)
        with torch.no_grad():
            getattr(owner, attr).copy_(first[path])
        try:
            _, second, _ = _run_restoring(module, inputs)
        finally:
            with torch.no_grad():
                getattr(owner, attr).copy_(before[path])
        if not torch.equal(second[path] - first[path], delta):
            raise OpenTargetError(f"the forward updates integer buffer {path} by a step that is not fixed")
        steps.append((path, int(delta.item())))
    return updated, tuple(steps), returns_tuple


def _cpu_copy(module: torch.nn.Module) -> torch.nn.Module:
    # The training flag is kept: a KernelBench Model runs in training mode (a BatchNorm normalizes
    # with the batch's statistics there), a served model in eval mode; the reference is the module as used.
    copied = copy.deepcopy(module).to("cpu")
    for p in copied.parameters():
        p.requires_grad_(False)
    return copied


def _input_names(module: torch.nn.Module, n: int) -> list[str]:
    try:
        names = [
            p.name
            for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        names = []
    names = (names + [f"x{i}" for i in range(len(names), n)])[:n]
    out: list[str] = []
    for i, name in enumerate(names):
        name = name if name.isidentifier() and name not in out else f"x{i}"
        out.append(name)
    return out


def _input_spec(name: str, t: Tensor) -> OpenInput:
    dtype = str(t.dtype).replace("torch.", "")
    shape = tuple(int(d) for d in t.shape)
    if t.dtype == torch.bool:
        return OpenInput(name, shape, dtype, "bool")
    if not t.is_floating_point():
        bound = int(t.max().item()) + 1 if t.numel() and not t.is_meta else 2
        return OpenInput(name, shape, dtype, "int", max(2, bound))
    if t.is_meta or t.numel() == 0:
        return OpenInput(name, shape, dtype)
    values = t.detach().float()
    low, high = float(values.min()), float(values.max())
    if low >= 0 and t.dim() >= 1 and bool(torch.allclose(values.sum(-1), torch.ones(()), atol=1e-3)):
        return OpenInput(name, shape, dtype, "simplex")
    if low >= 0 and high <= 1:
        return OpenInput(name, shape, dtype, "unit")
    if low >= 0:
        return OpenInput(name, shape, dtype, "positive")
    return OpenInput(name, shape, dtype)


def _link_index_ranges(
    specs: tuple[OpenInput, ...], module: torch.nn.Module | None = None, probe: Sequence[Tensor] = ()
) -> tuple[OpenInput, ...]:
    """An integer input whose values cover most of a dim of input 0 and that the forward refuses
    past that dim's size indexes that dim (class ids): its range follows that dim's size (the
    smallest such dim). Values the forward takes past it (positions, which only happen to start
    at 0 in a prefill) keep their live range: a range tied to a dim of size 1 would draw zeros only."""
    first = specs[0].shape
    out = [specs[0]]
    for index, spec in enumerate(specs[1:], start=1):
        dims = [d for d, size in enumerate(first) if spec.domain == "int" and size >= spec.high > size // 2]
        if dims and module is not None and len(probe) == len(specs):
            dims = [d for d in dims if _refuses_values_past(module, probe, index, int(probe[0].shape[d]))]
        out.append(replace(spec, high_dim=min(dims, key=lambda d: first[d])) if dims else spec)
    return tuple(out)


def _refuses_values_past(module: torch.nn.Module, probe: Sequence[Tensor], index: int, size: int) -> bool:
    """Whether the forward fails when integer input `index` holds `size` (one past the dim's last index)."""
    args = list(probe)
    args[index] = torch.full_like(probe[index], size)
    try:
        _run_restoring(module, args)
    except Exception:  # noqa: BLE001 - an index out of range: class ids of that dim
        return True
    return False


def _argument_params(
    names: Sequence[str], arguments: Sequence[tuple[int, Any]], taken: set[str]
) -> tuple[OpenParam, ...]:
    """A parameter for each number the forward takes as an argument, named after it (see OpenParam.argument)."""
    params = []
    for position, value in arguments:
        kind = str(argument_kind(value))
        live = float(value) if kind == "float" else value  # a numpy float as a plain one
        name = names[position]
        params.append(OpenParam(_kernel_name(name, taken), name, kind, value=live, argument=position))
    return tuple(params)


def _kernel_name(path: str, taken: set[str]) -> str:
    name = re.sub(r"\W", "_", path)
    name = name if name.isidentifier() else f"p_{name}"
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _tensor_params(module: torch.nn.Module) -> tuple[OpenParam, ...]:
    taken: set[str] = set()
    params: list[OpenParam] = []
    buffers = {path for path, _ in module.named_buffers()}
    for path, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        if not tensor.is_floating_point():
            continue  # integer buffers (num_batches_tracked) are bookkeeping, not values
        # Drawn positive only where the module keeps a nonnegative statistic (running variances):
        # a freshly initialized weight of ones is a weight, and weights get both signs.
        positive = path in buffers and bool(tensor.numel()) and not tensor.is_meta and bool((tensor >= 0).all())
        params.append(
            OpenParam(
                kernel_param=_kernel_name(path, taken),
                module_attr=path,
                kind="tensor",
                shape=tuple(int(d) for d in tensor.shape),
                dtype=str(tensor.dtype).replace("torch.", ""),
                positive=positive,
            )
        )
    return tuple(params)


def _float_attributes(module: torch.nn.Module) -> list[tuple[str, float]]:
    found = []
    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if attr.startswith("_") or attr == "training" or isinstance(value, bool) or not isinstance(value, float):
                continue
            found.append((f"{prefix}.{attr}" if prefix else attr, value))
    return found


def _float_params(module: torch.nn.Module, inputs: Sequence[Any]) -> tuple[OpenParam, ...]:
    """Float attributes whose value changes the output or the buffers the forward updates on the
    probe inputs (dropout's p in eval mode, momentum in eval mode: no effect, not bound; momentum
    in training mode moves the running statistics: bound)."""
    module = copy.deepcopy(module)

    def run(probe: Sequence[Any]) -> list[Tensor]:
        outputs, after, _ = _run_restoring(module, probe)  # buffers restored: every probe starts alike
        return outputs + list(after.values())

    probe = list(leading_rows(inputs, 1 << 16))
    try:
        before = run(probe)
    except Exception:  # noqa: BLE001 - dim 0 is not free: probe on the whole inputs
        probe = list(inputs)
        try:
            before = run(probe)
        except Exception as exc:  # noqa: BLE001 - the forward itself fails: nothing can be bound
            raise OpenTargetError(f"the module's forward fails on its inputs: {type(exc).__name__}: {exc}") from exc
    taken = {p.kernel_param for p in _tensor_params(module)}
    params = []
    for path, value in _float_attributes(module):
        owner, _, attr = _owner(module, path)
        setattr(owner, attr, value * _PROBE_FACTOR + _PROBE_SHIFT)
        try:
            after = run(probe)
            changed = any(not torch.equal(a, b) for a, b in zip(after, before))
        except Exception:  # noqa: BLE001 - another value breaks the forward: structural, not bound
            changed = False
        finally:
            setattr(owner, attr, value)
        if changed:
            params.append(
                OpenParam(kernel_param=_kernel_name(path, taken), module_attr=path, kind="float", value=value)
            )
    return tuple(params)


def leading_rows(inputs: Sequence[Any], max_elements: int) -> Sequence[Any]:
    """`inputs` cut to their first rows so input 0 holds about `max_elements`: every tensor whose
    dim 0 has input 0's size is cut alike (a batch shared by predictions and targets). The same
    sequence object when nothing needs cutting."""
    first = inputs[0] if inputs else None
    if not isinstance(first, Tensor) or first.dim() == 0 or first.numel() <= max_elements:
        return inputs
    rows = max(1, max_elements // max(1, numel(first.shape[1:])))
    if rows >= first.shape[0]:
        return inputs
    size = first.shape[0]
    return [t[:rows] if isinstance(t, Tensor) and t.dim() and t.shape[0] == size else t for t in inputs]


def rows_the_forward_accepts(module: torch.nn.Module, inputs: Sequence[Any], max_elements: int) -> Sequence[Any]:
    """`inputs` cut to their first rows for probing, the first way the forward accepts (checked on
    the meta device): every input sharing input 0's dim-0 size, else input 0 alone (a square
    matmul's B has that size by coincidence); else the inputs as they are."""
    together = leading_rows(inputs, max_elements)
    if together is inputs:
        return inputs
    alone = [together[0], *inputs[1:]]
    for cut in (together, alone):
        if _runs_on_meta(module, cut):
            return cut
    return inputs


class StrictMeta(TorchDispatchMode):
    """The checks real kernels make and meta kernels skip, so a size the module refuses on a device
    is refused on meta too: a transposed convolution's meta kernel takes any input channel count."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.convolution.default:
            x, weight, transposed, groups = args[0], args[1], args[6], args[8]
            expected = weight.shape[0] if transposed else weight.shape[1] * groups
            channels = x.shape[x.dim() - weight.dim() + 1]
            if channels != expected:
                raise RuntimeError(f"convolution: input has {channels} channels, the weight takes {expected}")
        return func(*args, **(kwargs or {}))


def _runs_on_meta(module: torch.nn.Module, inputs: Sequence[Any]) -> bool:
    try:
        meta = copy.deepcopy(module).to("meta")
        args = [torch.empty(t.shape, dtype=t.dtype, device="meta") if isinstance(t, Tensor) else t for t in inputs]
        with torch.no_grad(), StrictMeta():
            meta(*args)
    except Exception:  # noqa: BLE001 - any failure: the forward does not accept these shapes
        return False
    return True


def dim_links(
    module: torch.nn.Module, specs: Sequence[OpenInput], calls: Sequence[Sequence[Sequence[int]]] = ()
) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per input, (own dim, input 0's dim) for the dims whose size the forward accepts changing,
    found on the meta device (nothing allocated). Input 0's dim d grows by 3; each other input's
    dim of the same size (size 1 too: a batch of one) grows with it, aligned by leading dims first
    (a shared batch dim), else by trailing dims (broadcasting); a dim that cannot grow alone may
    grow with a same-size dim anywhere in the others (a matmul's contraction dim).

    `calls` (every input's shapes per live call) are evidence over the probe: a link some call
    breaks is dropped, a dim of input 0 whose size differs between calls is variable, and a later
    input's dim that changes between calls follows the dim of input 0 equal to it in every call."""
    links = _probed_links(module, specs)
    if len(calls) > 1:
        links = _links_from_calls(links, calls)
    return links


def _probed_links(module: torch.nn.Module, specs: Sequence[OpenInput]) -> tuple[tuple[tuple[int, int], ...], ...]:
    try:
        meta = copy.deepcopy(module).to("meta")
    except Exception:  # noqa: BLE001 - modules that cannot move to meta: only the live shapes
        return tuple(() for _ in specs)
    live = [s.shape for s in specs]

    def runs(shapes: Sequence[Sequence[int]]) -> bool:
        args = [torch.empty(tuple(s), dtype=_dtype(spec.dtype), device="meta") for s, spec in zip(shapes, specs)]
        try:
            with torch.no_grad(), StrictMeta():
                return bool(_tensors(meta(*args)))
        except Exception:  # noqa: BLE001 - the forward refuses the size: a fixed dim
            return False

    if not runs(live):
        return tuple(() for _ in specs)
    links: list[list[tuple[int, int]]] = [[] for _ in specs]
    for d in range(len(live[0])):
        for aligned in _alignments(live, d):
            grown = follow_shapes(live, aligned, [s + 3 if i == d else s for i, s in enumerate(live[0])])
            if runs(grown):
                for index, pairs in enumerate(aligned):
                    links[index] += pairs
                break
    return tuple(tuple(sorted(set(pairs))) for pairs in links)


def _links_from_calls(
    links: Sequence[Sequence[tuple[int, int]]], calls: Sequence[Sequence[Sequence[int]]]
) -> tuple[tuple[tuple[int, int], ...], ...]:
    def sizes(index: int, dim: int) -> list[int]:
        return [int(call[index][dim]) for call in calls]

    out = [list(links[0])] + [
        [(own, d) for own, d in pairs if sizes(i, own) == sizes(0, d)] for i, pairs in enumerate(links[1:], start=1)
    ]
    for d in range(len(calls[0][0])):
        if len(set(sizes(0, d))) > 1 and all(own != d for own, _ in out[0]):
            out[0].append((d, d))
    variable0 = [d for d, _ in out[0]]
    for index in range(1, len(calls[0])):
        for own in range(len(calls[0][index])):
            if any(o == own for o, _ in out[index]) or len(set(sizes(index, own))) == 1:
                continue
            same = [d for d in variable0 if sizes(0, d) == sizes(index, own)]
            if same:
                out[index].append((own, same[0]))
    return tuple(tuple(sorted(set(pairs))) for pairs in out)


def free_dims(
    specs: Sequence[OpenInput],
    links: Sequence[Sequence[tuple[int, int]]],
    calls: Sequence[Sequence[Sequence[int]]],
) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Groups of later inputs' dims whose size changes between the live calls without following
    input 0 (a cache length): the dims whose sizes are equal in every call form one group."""
    if len(calls) < 2:
        return ()
    groups: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for index in range(1, len(specs)):
        linked = {own for own, _ in links[index]}
        for own in range(len(specs[index].shape)):
            sizes = tuple(int(call[index][own]) for call in calls)
            if own not in linked and len(set(sizes)) > 1:
                groups.setdefault(sizes, []).append((index, own))
    return tuple(tuple(group) for group in groups.values())


def _alignments(live: Sequence[Sequence[int]], d: int) -> list[list[list[tuple[int, int]]]]:
    """Ways input 0's dim d can be shared by the other inputs: by leading position, by trailing
    position (equal sizes, 1 included: a batch or a sequence of one), not at all (the others keep
    their sizes), or, last, by any one dim of the same size per input (a matmul's K)."""
    size = live[0][d]
    ways: list[list[list[tuple[int, int]]]] = []
    for trailing in (False, True):
        way: list[list[tuple[int, int]]] = [[(d, d)]]
        for shape in live[1:]:
            own = d - (len(live[0]) - len(shape)) if trailing else d
            way.append([(own, d)] if 0 <= own < len(shape) and shape[own] == size else [])
        if way not in ways:
            ways.append(way)
    alone = [[(d, d)]] + [[] for _ in live[1:]]
    if alone not in ways:
        ways.append(alone)
    # A contraction dim (a matmul's K: A's last dim is B's first) sits elsewhere: one same-size
    # dim of each other input, tried after the dim alone fails.
    choices = [[None, *(k for k, s in enumerate(shape) if s == size and size != 1)] for shape in live[1:]]
    for picks in itertools.islice(itertools.product(*choices), 1, 17):
        way = [[(d, d)]] + [[(own, d)] if own is not None else [] for own in picks]
        if way not in ways:
            ways.append(way)
    return ways


def _digest(
    dotted: str,
    specs: Sequence[OpenInput],
    params: Sequence[OpenParam],
    source: str | None,
    updates: Any = None,
    dims: Any = None,
) -> str:
    parts: list[Any] = [dotted, [asdict(s) for s in specs], [(p.module_attr, p.kind, p.shape) for p in params], source]
    if updates and any(updates):
        parts.append(updates)  # only then: the names of targets without updated buffers stay as they were
    if dims is not None:
        parts.append(["dims", dims])
    arguments = [(p.argument, p.kind) for p in params if p.argument >= 0]
    if arguments:  # only then: the names of targets without number arguments stay as they were
        parts.append(["arguments", arguments])
    text = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


class ShrinkFactories(torch.overrides.TorchFunctionMode):
    """While active, tensor factories (`torch.randn(4096, 393216)`, `torch.randint(0, 10, (4096,))`)
    asked for a shape in `sizes` make the mapped smaller shape instead: a problem's own
    `get_inputs()` then draws reduced inputs with its own distributions (softmax, abs, rand...)."""

    FACTORIES = frozenset(
        {torch.randn, torch.rand, torch.randint, torch.zeros, torch.ones, torch.empty, torch.full, torch.normal}
    )

    def __init__(self, sizes: dict[tuple[int, ...], tuple[int, ...]]):
        super().__init__()
        self.sizes = sizes
        # randint's upper bound when it is a reduced dim's size (class ids of a reduced class dim).
        self.bounds = {a: b for live, small in sizes.items() for a, b in zip(live, small) if a != b}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in self.FACTORIES:
            args, kwargs = self._resize(func, tuple(args), kwargs)
        return func(*args, **kwargs)

    def _resize(self, func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if "size" in kwargs and tuple(kwargs["size"]) in self.sizes:
            kwargs["size"] = self.sizes[tuple(kwargs["size"])]
            return args, kwargs
        # randint(high, size) / randint(low, high, size): the size comes after the bounds.
        lead = (2 if len(args) >= 3 else 1) if func is torch.randint else 0
        if func is torch.randint and lead and isinstance(args[lead - 1], int) and args[lead - 1] in self.bounds:
            args = (*args[: lead - 1], self.bounds[args[lead - 1]], *args[lead:])
        rest = args[lead:]
        if rest and isinstance(rest[0], (tuple, list, torch.Size)) and tuple(rest[0]) in self.sizes:
            return (*args[:lead], self.sizes[tuple(rest[0])], *rest[1:]), kwargs
        ints = tuple(a for a in rest if isinstance(a, int) and not isinstance(a, bool))
        if func is not torch.full and ints and ints == tuple(rest[: len(ints)]) and ints in self.sizes:
            return (*args[:lead], *self.sizes[ints], *rest[len(ints) :]), kwargs
        return args, kwargs
