"""The shapes each target sees under a workload that is not timed: a server's decode at each batch
it serves, besides the one batch the profile times. A target's `shapes` are what the verifier checks
and times a kernel at, so they must hold every row count the server runs: a kernel tuned for one
batch can be slower at another.

`capture_target_shapes(model, groups, fn)` runs `fn` with the same shape capture as a profiled phase
(module pre-hooks; a shadow call for families whose module input is not their first activation;
function sites wrapped) and keys the shapes as profile targets are keyed (`target_key`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpuyantra.binding import ModuleGroup
from gpuyantra.profile_targets import TargetKey
from gpuyantra.profiler.hooks import _capture_activation_shapes, _dtype_name, _first_tensor
from gpuyantra.profiler.targets import _activation_counts


def capture_target_shapes(
    model: torch.nn.Module,
    groups: Sequence[ModuleGroup],
    fn: Callable[[], Any],
    function_sites: Sequence[Any] = (),
) -> dict[TargetKey, list[list[int]]]:
    """The first-activation shapes each target sees in one call of `fn`, most frequent first, keyed
    (op, qualified_class, variant) as profile targets are. `fn` runs once or twice (twice when a
    family needs the shadow call); nothing is timed and the model is left as it was."""
    modules = list(model.named_modules())
    index_of_name = {name: i for i, (name, _) in enumerate(modules)}
    group_of = {index_of_name[name]: gi for gi, g in enumerate(groups) for name in g.names if name in index_of_name}
    captured: dict[int, Counter] = defaultdict(Counter)
    captured.update(_capture_activation_shapes(modules, groups, group_of, fn))
    plain = [i for i in group_of if i not in captured]
    seen_by_site = _run_recording(modules, plain, function_sites, fn, captured)

    from gpuyantra.ops import get_op

    out: dict[TargetKey, list[list[int]]] = {}
    for gi, group in enumerate(groups):
        indices = [i for i, g in group_of.items() if g == gi]
        seen = _activation_counts(get_op(group.op), modules, indices, captured)
        if seen:
            out[(group.op, group.qualified_class, group.variant)] = _most_frequent_first(seen)
    for op in dict.fromkeys(s.op for s in function_sites):
        seen = sum((seen_by_site[s.dotted] for s in function_sites if s.op == op), Counter())
        if seen:
            out[(op, get_op(op).default_module or "", "")] = _most_frequent_first(seen)
    return out


def _run_recording(
    modules: list[tuple[str, torch.nn.Module]],
    indices: Sequence[int],
    function_sites: Sequence[Any],
    fn: Callable[[], Any],
    captured: dict[int, Counter],
) -> dict[str, Counter]:
    """One call of `fn` recording the input shape of each module in `indices` (into `captured`) and
    the first tensor each function site gets (returned, by site); hooks and sites restored after."""
    by_site: dict[str, Counter] = {s.dotted: Counter() for s in function_sites}
    originals = {s.dotted: s.current() for s in function_sites}
    handles = [modules[i][1].register_forward_pre_hook(_recorder(captured[i]), with_kwargs=True) for i in indices]
    try:
        for site in function_sites:
            site.set(_site_recorder(originals[site.dotted], by_site[site.dotted]))
        with torch.no_grad():
            fn()
    finally:
        for handle in handles:
            handle.remove()
        for site in function_sites:
            site.set(originals[site.dotted])
    return by_site


def _recorder(counts: Counter) -> Callable[..., None]:
    def pre(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        tensor = _first_tensor(args, kwargs)
        if tensor is not None:
            counts[(tuple(tensor.shape), _dtype_name(tensor.dtype))] += 1

    return pre


def _site_recorder(original: Callable[..., Any], counts: Counter) -> Callable[..., Any]:
    def recorded(*args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(first, torch.Tensor):
            counts[(tuple(first.shape), _dtype_name(first.dtype))] += 1
        return original(*args, **kwargs)

    return recorded


def _most_frequent_first(seen: Counter) -> list[list[int]]:
    by_shape: Counter = Counter()
    for (shape, _dtype), n in seen.items():
        by_shape[tuple(shape)] += n
    return [list(shape) for shape, _ in sorted(by_shape.items(), key=lambda kv: (-kv[1], kv[0]))]
