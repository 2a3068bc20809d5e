"""Hooks that label every module call with a `record_function` range and record activation shapes."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict

import torch

LABEL = "gy#"
STEP_LABEL = LABEL + "step"


def _profiler(activities):
    try:  # acc_events keeps every step's events (and silences a torch 2.11 warning)
        return torch.profiler.profile(activities=activities, acc_events=True)
    except TypeError:
        return torch.profiler.profile(activities=activities)


# Open record_function ranges per (thread, module): the probe may run its forward on any thread.
# The server should keep other traffic off the model while it profiles (it would be counted too).
_OPEN_RANGES: dict[tuple[int, int], list] = {}


# (input index, shape, strides, storage offset) of an activation that is not a fresh contiguous tensor.
Layout = tuple[int, tuple[int, ...], tuple[int, ...], int]


def layout_of(index: int, tensor: torch.Tensor) -> Layout | None:
    """The layout of activation `index` where a kernel could get it wrong: strided (a slice of a wider
    buffer: Phi-3's chunked gate/up, `h[:, -1:, :]`) or at a storage offset. None for a contiguous
    tensor at offset 0 (what the plan's other cases hand a kernel)."""
    offset = int(tensor.storage_offset())
    if tensor.is_contiguous() and offset == 0:
        return None
    return (index, tuple(int(d) for d in tensor.shape), tuple(int(s) for s in tensor.stride()), offset)


def record_layouts(counts: Counter, tensors) -> None:
    """Count each of `tensors`' layouts that is not plain (`layout_of`)."""
    for index, tensor in enumerate(tensors):
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            layout = layout_of(index, tensor)
            if layout is not None:
                counts[layout] += 1


def _install_hooks(modules, capture_idx, captured, layouts=None):
    handles = []
    for idx, (_, module) in enumerate(modules):
        label = f"{LABEL}{idx}"

        def pre(mod, args, kwargs, _label=label, _idx=idx):
            if _idx in capture_idx:
                tensor = _first_tensor(args, kwargs)
                if tensor is not None:
                    captured[_idx][(tuple(tensor.shape), _dtype_name(tensor.dtype))] += 1
                    if layouts is not None:
                        record_layouts(layouts[_idx], [tensor])
            rf = torch.profiler.record_function(_label)
            rf.__enter__()
            _OPEN_RANGES.setdefault((threading.get_ident(), id(mod)), []).append(rf)

        def post(mod, args, kwargs, output):
            stack = _OPEN_RANGES.get((threading.get_ident(), id(mod)))
            if stack:
                stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre, prepend=True, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True, always_call=True))
    return handles


def _close_open_ranges(modules):
    ids = {id(module) for _, module in modules}
    for key in [k for k in _OPEN_RANGES if k[1] in ids]:
        stack = _OPEN_RANGES.pop(key, None)
        while stack:
            try:
                stack.pop().__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - a range left open by a failed forward
                pass


_MISSING = object()


def _capture_activation_shapes(modules, groups, group_of, fn, layouts=None) -> dict[int, Counter]:
    """Run `fn` once with each module of a `module_activations` family bound through the family's
    `replacement_forward` to a recording entry that computes the family reference; restore after."""
    import types

    from gpuyantra.ops import get_op

    bound = []
    recorded: dict[int, Counter] = defaultdict(Counter)
    try:
        for idx, gi in group_of.items():
            group = groups[gi]
            family = get_op(group.op)
            if family.module_activations is None:
                continue
            _, module = modules[idx]

            def entry(*acts, _idx=idx, _family=family, **params):
                first = acts[0] if acts else None
                if isinstance(first, torch.Tensor):
                    recorded[_idx][(_case_shape(_family, acts), _dtype_name(first.dtype))] += 1
                    if layouts is not None:
                        record_layouts(layouts[_idx], acts)
                return _family.reference(*acts, **params)

            forward = family.replacement_forward(module, entry, group.adapter)
            bound.append((module, module.__dict__.get("forward", _MISSING)))
            module.forward = types.MethodType(forward, module)
        if bound:
            with torch.no_grad():
                fn()
    finally:
        for module, original in reversed(bound):
            if original is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.forward = original
    return {idx: counts for idx, counts in recorded.items() if counts}


def _case_shape(family, acts) -> tuple[int, ...]:
    """The shape a target's cases name a call by: the first activation's, or for an open target its
    case key (every input's shape where the later inputs do not follow input 0's)."""
    target = getattr(family, "open_target", None)
    if target is not None:
        try:
            return tuple(target.case_key([tuple(a.shape) for a in acts]))
        except ValueError:
            pass
    return tuple(acts[0].shape)


def _first_tensor(args, kwargs):
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")
