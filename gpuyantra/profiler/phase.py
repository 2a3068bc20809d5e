"""One phase of a profile: step time, a profiled run with labelled module ranges, per-target and
per-class breakdowns, and the phase's regime."""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from gpuyantra.binding import ModuleGroup
from gpuyantra.hardware import HardwareSpec
from gpuyantra.profiler.events import (
    _attribute,
    _duration,
    _is_device_event,
    _median_per_step,
    _remove_profiler_overhead,
    profiler_overhead,
)
from gpuyantra.profiler.hooks import (
    STEP_LABEL,
    _capture_activation_shapes,
    _close_open_ranges,
    _install_hooks,
    _profiler,
)
from gpuyantra.profiler.targets import _function_targets, _PhaseContext, _target_metrics


def _profile_phase(
    model, modules, groups, fn, device, spec: HardwareSpec, warmup, repeat, profile_steps, sites=(), graphed=False
):
    cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)

    with torch.no_grad():
        for _ in range(max(warmup, 0)):
            fn()
        sync()
        samples = []
        for _ in range(max(repeat, 1)):
            t0 = time.perf_counter()
            fn()
            sync()
            samples.append((time.perf_counter() - t0) * 1e6)
    step_us = statistics.median(samples)

    group_of: dict[int, int] = {}
    index_of_name = {name: i for i, (name, _) in enumerate(modules)}
    for gi, group in enumerate(groups):
        for name in group.names:
            if name in index_of_name:
                group_of[index_of_name[name]] = gi
    capture_idx = set(group_of) | {i for i, (_, m) in enumerate(modules) if isinstance(m, torch.nn.Linear)}
    captured: dict[int, Counter] = defaultdict(Counter)
    # Families whose module input is not their first activation (gated MLPs: x in, (gate, up) to the
    # op) get their real activation shapes from one shadow call through `replacement_forward`.
    layouts: dict[int, Counter] = defaultdict(Counter)  # strided or offset activations (`layout_of`)
    shadow = _capture_activation_shapes(modules, groups, group_of, fn, layouts)
    capture_idx -= set(shadow)
    handles = _install_hooks(modules, capture_idx, captured, layouts)

    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    steps = max(profile_steps, 1)
    try:
        with torch.no_grad(), _profiler(activities) as prof:
            for _ in range(steps):
                with torch.profiler.record_function(STEP_LABEL):
                    fn()
                    sync()
        events = list(prof.events())
    finally:
        for handle in handles:
            handle.remove()
        _close_open_ranges(modules)

    for idx, counts in shadow.items():
        for key, n in counts.items():
            captured[idx][key] += n * steps  # one shadow call stands for each profiled call
    stats = [st for st in _attribute(events) if st.step is not None]
    steps = max(len({st.step for st in stats}), 1)
    profiled_step_us = statistics.median([st.incl_host for st in stats if st.index == "step"] or [step_us])
    per_event, per_call = profiler_overhead(device)
    _remove_profiler_overhead(stats, per_event, per_call)
    # What the calibration leaves (a busy machine, CUPTI costs it did not see) is spread in
    # proportion, so that a step's host timeline spans the unprofiled step time.
    host_per_step: dict[int, float] = defaultdict(float)
    for st in stats:
        assert st.step is not None  # stats holds only events of a step (filtered above)
        host_per_step[st.step] += st.host
    corrected_step = statistics.median(host_per_step.values()) if host_per_step else 0.0
    residual_scale = min(max(step_us / corrected_step, 0.25), 4.0) if corrected_step > 0 else 1.0
    for st in stats:
        st.host *= residual_scale
        st.op_time *= residual_scale
        for entry in st.op_names.values():
            entry[1] *= residual_scale

    # Per step: device time (kernels; on CPU time inside aten ops), launches (kernels; on CPU
    # dispatched ops), syncs. Medians over steps.
    per_step: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for st in stats:
        assert st.step is not None  # as above
        row = per_step[st.step]
        row[0] += st.dev if cuda else st.op_time
        row[1] += st.kernels if cuda else st.ops
        row[2] += st.syncs
    device_total, launches_total, syncs = _median_per_step(per_step, steps, 3)
    # GPU waits issued inside the step, less the one synchronize per step the profiler adds itself.
    syncs = max(syncs - (1 if cuda else 0), 0.0)
    busy = min(device_total / step_us, 1.0) if step_us > 0 else 0.0
    if cuda:
        all_kernels = sum(_duration(e) for e in events if _is_device_event(e))
        attributed = sum(st.dev for st in stats) / all_kernels if all_kernels else None
    else:
        attributed = 1.0
    by_index = defaultdict(list)
    for st in stats:
        if st.index != "step":
            by_index[st.index].append(st)

    graphed = graphed and cuda
    # Replayed as CUDA graphs, a step lasts as long as its GPU work: shares are of that.
    ctx = _PhaseContext(
        cuda=cuda, spec=spec, step_us=device_total if graphed else step_us, busy=busy, steps=steps, graphed=graphed
    )
    targets = [
        _target_metrics(ctx, group, modules, group_of, gi, by_index, captured, layouts)
        for gi, group in enumerate(groups)
    ]
    targets.extend(_function_targets(ctx, sites, fn, sync))
    targets.sort(key=lambda t: (-t["est_gain_us"], -t["share"], t["op"], t["qualified_class"]))
    for rank, t in enumerate(targets, 1):
        t["rank"] = rank
    classes, matmul = _class_breakdown(ctx, modules, by_index, captured)
    _mark_coverage(classes, groups, modules)
    regime = _phase_regime(ctx, matmul)
    return {
        "step_ms": round(step_us / 1e3, 4),
        "step_ms_samples": [round(s / 1e3, 4) for s in samples],
        "profiled_step_ms": round(profiled_step_us / 1e3, 4),
        "profiler_overhead_us": {
            "per_op_event": round(per_event, 3),
            "per_module_call": round(per_call, 3),
            "residual_scale": round(residual_scale, 4),
        },
        "busy_fraction": round(busy, 4),
        "cuda_graphs": graphed,
        "device_ms": round(device_total / 1e3, 4),
        "launches_per_step": round(launches_total, 1),
        "syncs_per_step": round(syncs, 2),
        "attributed_fraction": round(min(attributed, 1.0), 4) if attributed is not None else None,
        "regime": regime,
        "matmul_arithmetic_intensity": matmul.get("arithmetic_intensity"),
        "profiled_steps": steps,
        "targets": targets,
        "classes": classes,
    }


def _class_breakdown(ctx: _PhaseContext, modules, by_index, captured):
    """Self time per module class (every module, matched or not), and the matmul roofline of Linear."""
    rows: dict[str, dict[str, Any]] = {}
    steps = ctx.steps
    fields_ = ("host_us", "device_us", "launches", "syncs", "ops_host_us")
    for idx, stats_list in by_index.items():
        _, module = modules[idx]
        cls = type(module)
        key = f"{cls.__module__}.{cls.__qualname__}"
        row = rows.setdefault(
            key,
            {
                "module_class": cls.__name__,
                "qualified_class": key,
                "modules": set(),
                "_steps": defaultdict(lambda: [0.0] * len(fields_)),
                "_ops": defaultdict(lambda: [0.0, 0.0]),
            },
        )
        row["modules"].add(idx)
        for st in stats_list:
            acc = row["_steps"][st.step]
            for j, value in enumerate(
                (st.host, st.dev if ctx.cuda else st.op_time, st.kernels if ctx.cuda else st.ops, st.syncs, st.op_time)
            ):
                acc[j] += value
            for name, (n, t, _events) in st.op_names.items():
                top = row["_ops"][name]
                top[0] += n / steps
                top[1] += t / steps
    out = []
    costs = []
    for row in rows.values():
        row["modules"] = len(row["modules"])
        for name, value in zip(fields_, _median_per_step(row.pop("_steps"), steps, len(fields_))):
            row[name] = value
        top = sorted(row.pop("_ops").items(), key=lambda kv: -kv[1][1])[:4]
        row["top_ops"] = [{"name": name, "calls": round(n, 1), "host_us": round(t, 1)} for name, (n, t) in top]
        row["syncs"] = round(row["syncs"], 2)
        costs.append(
            max(row["host_us"], row["device_us"])
            if ctx.host_bound
            else (row["device_us"] if ctx.cuda else row["host_us"])
        )
        out.append(row)
    # Self times partition the step, so their shares cannot add up to more than one step. When a
    # busy machine left more profiler cost than the calibration removes, they are read as shares of
    # their own sum.
    whole = max(ctx.step_us, sum(costs))
    for row, cost in zip(out, costs):
        row["share"] = round(cost / whole, 5) if whole else 0.0
        for k in ("host_us", "ops_host_us", "device_us", "launches"):
            row[k] = round(row[k], 2)
    out.sort(key=lambda r: -r["share"])

    flops = nbytes = 0.0
    for idx, counts in captured.items():
        module = modules[idx][1]
        if not isinstance(module, torch.nn.Linear):
            continue
        for (shape, dtype), n in counts.items():
            rows_n = math.prod(shape[:-1]) if len(shape) > 1 else 1
            size = torch.empty((), dtype=getattr(torch, dtype, torch.float32)).element_size()
            k_in, k_out = module.in_features, module.out_features
            flops += 2.0 * rows_n * k_in * k_out * n
            nbytes += (k_in * k_out + rows_n * (k_in + k_out)) * size * n
    matmul = {"arithmetic_intensity": round(flops / nbytes, 3)} if nbytes else {}
    return out, matmul


def _mark_coverage(classes: list[dict[str, Any]], groups: Sequence[ModuleGroup], modules) -> None:
    """Say for each module class what could replace it: a registered family (`family:<op>`, its
    tuned templates), an open target made for it (`open:<op>`), a leaf class an open target could
    be made for (`open`), or nothing (`none`: containers, whose time is the glue between children,
    and leaves with nothing to compute)."""
    from gpuyantra.binding import NO_COMPUTE

    by_class = {g.qualified_class: g.op for g in groups}
    leaves = {
        f"{type(m).__module__}.{type(m).__qualname__}"
        for _, m in modules
        if not any(True for _ in m.children()) and not isinstance(m, NO_COMPUTE)
    }
    for row in classes:
        key = row["qualified_class"]
        op = by_class.get(key)
        if op is not None:
            row["covered_by"] = f"open:{op}" if op.startswith("open.") else f"family:{op}"
        else:
            row["covered_by"] = "open" if key in leaves else "none"


def _phase_regime(ctx: _PhaseContext, matmul) -> str:
    if ctx.host_bound:
        return "launch-bound"
    ai = matmul.get("arithmetic_intensity")
    if ai is None:
        return "memory-bound"
    return ctx.spec.regime(ai)
