"""The identity fields of a profile target (`POST /admin/profile`, docs/CONTRACTS.md section 5): which
modules or module globals a swap would replace. One place for the profiler (`gpuyantra.profiler`)
and the serving engine's fallback profile (`serving.profiling`), so both name a target alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuyantra.binding import ModuleGroup
from gpuyantra.function_sites import FunctionSite

TargetKey = tuple[str, str, str]  # (op, qualified_class, variant): one profile target
MAX_LAYOUTS = 8  # the most frequent strided/offset layouts a target keeps


def group_target_fields(group: ModuleGroup) -> dict[str, Any]:
    """A module-class target: its op, class, module count and the ADAPTER its modules take."""
    return {
        "op": group.op,
        "module_class": group.module_class,
        "qualified_class": group.qualified_class,
        "modules": group.count,
        "adapter": [dict(b) for b in group.adapter],
    }


def param_shape_fields(group: ModuleGroup) -> dict[str, Any]:
    """Linear: one target per projection shape, verified and swapped at it ({} for other families)."""
    if not group.param_shapes:
        return {}
    return {
        "param_shapes": {k: None if v is None else list(v) for k, v in group.param_shapes.items()},
        "variant": group.variant,
    }


def function_target_fields(op: str, sites: Sequence[FunctionSite]) -> dict[str, Any]:
    """A function-level target (rope's `apply_rotary_pos_emb` globals): `modules` counts the modules
    calling the functions; `qualified_class` is what verify --module and swap(module_class=...) accept."""
    from gpuyantra.ops import get_op

    return {
        "op": op,
        "module_class": ",".join(dict.fromkeys(s.attr for s in sites)),
        "qualified_class": get_op(op).default_module,
        "modules": sum(s.count for s in sites),
        "adapter": [],
        "binding": "function",
        "functions": [s.dotted for s in sites],
    }


def target_key(target: Mapping[str, Any]) -> TargetKey:
    """What names one profile target: op, qualified class and (linear) variant."""
    return (str(target.get("op")), str(target.get("qualified_class") or ""), str(target.get("variant") or ""))


def add_served_shapes(
    targets: Sequence[dict[str, Any]], served: Mapping[str, Mapping[TargetKey, list[list[int]]]]
) -> None:
    """Complete each target's `shapes` with those it takes in the served workloads (`served`:
    workload name -> target -> shapes): the shapes it already has stay first, in their order, the
    missing ones follow. `served_shapes` records which workload gave which shapes."""
    for target in targets:
        key = target_key(target)
        by_workload = {name: [list(s) for s in shapes[key]] for name, shapes in served.items() if shapes.get(key)}
        if not by_workload:
            continue
        shapes = [list(s) for s in target.get("shapes") or []]
        for workload_shapes in by_workload.values():
            shapes += [s for s in workload_shapes if s not in shapes]
        target["shapes"] = shapes
        target["served_shapes"] = by_workload
        merge_live_inputs(target, {"row_counts": live_input_fields(shapes)["row_counts"]})


def live_input_fields(shapes: Sequence[Sequence[int]], layouts: Mapping[Any, int] | None = None) -> dict[str, Any]:
    """What the verifier's plan draws from the served model beside the shapes (docs/CONTRACTS.md
    section 5, optional fields): `row_counts`, every row count the target ran (decode batch sizes,
    prefill lengths), and `layouts`, its activations that were strided or at a storage offset (most
    frequent first): `{"input", "shape", "stride", "offset"}`. `layouts` counts
    `gpuyantra.profiler.hooks.Layout` tuples."""
    rows = set()
    for shape in shapes:
        count = 1
        for dim in list(shape)[:-1]:
            count *= int(dim)
        rows.add(count)
    fields: dict[str, Any] = {"row_counts": sorted(rows)}
    ranked = sorted((layouts or {}).items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_LAYOUTS]
    fields["layouts"] = [
        {"input": int(i), "shape": list(shape), "stride": list(stride), "offset": int(offset)}
        for (i, shape, stride, offset), _ in ranked
    ]
    return fields


def merge_live_inputs(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Add another phase's `row_counts` and `layouts` to a target's (`live_input_fields`)."""
    if "row_counts" in other:
        into["row_counts"] = sorted(set(into.get("row_counts") or []) | set(other["row_counts"]))
    layouts = list(into.get("layouts") or [])
    for layout in other.get("layouts") or []:
        if layout not in layouts and len(layouts) < MAX_LAYOUTS:
            layouts.append(layout)
    if layouts or "layouts" in into:
        into["layouts"] = layouts
