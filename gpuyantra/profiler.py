"""Profile a live model: where a served step's time goes, and which swap would shorten it.

`profile_model(model, run_probe, device)` runs a representative workload (a closure the server
builds from recent traffic, or a probe batch when idle) and returns the ranked optimization targets
of `POST /admin/profile` (docs/CONTRACTS.md section 5, ARCHITECTURE "Serving admin API").

What it measures, per phase (one phase per probe: "decode", "prefill", or "probe" for the
positional form):

* step time: median wall time of one probe call, unprofiled and without hooks (synchronized);
* device time, host time and launch counts per module class: `torch.profiler` (CPU activity
  always, CUDA activity on cuda) while forward pre/post hooks open a `record_function` range
  around every module call. A range's kernels are the kernels launched by the ops inside it but
  outside any nested module's range; host time is the range's wall time on the host minus nested
  ranges, scaled by unprofiled/profiled step time to remove the profiler's own overhead;
* GPU busy fraction: summed kernel time of a step / unprofiled wall time of a step. At batch-1
  decode of a 1.5B model on an H200 this is far below 1: the GPU waits for the host, and a
  faster kernel cannot help unless it also removes launches;
* shapes and dtypes: forward pre-hooks record the first activation each matched module sees
  (these feed the verifier's shapes);
* roofline: the op family's `bytes_moved`/`flops` on the observed shapes against the measured
  copy bandwidth and matmul rate of the device (`gpuyantra.hardware`).

Regime of a target: `launch-bound` when the GPU is idle most of the step (busy < 50%) and the
module's host time is at least its device time; otherwise `memory-bound` or `compute-bound` by
arithmetic intensity against the ridge point. On CPU there is no separate device: numbers are host
time, the regime comes from the roofline with the CPU constants, and speed is not judged.

Ranking (Amdahl): each target's cost on the critical path of a step (host-bound step:
max(host, device) time of the module; device-bound step: its device time) minus its estimated
cost after a swap (one Triton launch per call at the measured Triton call cost on the host; the
roofline floor at 80% efficiency on the device) is `est_gain_us`; `est_gain` is that as a fraction
of the step. In a launch-bound step a swap only helps by cutting launches (and host time), so a
module that already issues one launch per call ranks at or below zero whatever its kernel speed,
and its `why` says so. With several phases, the top-level ranking weighs each phase by how often a
request runs it (`weights`, default one prefill and `decode_steps` = 32 decode steps).

Note on hot-swapped modules: `find_module_groups` re-checks module math on CPU; after a swap the
server should pass the groups it already knows through `groups=`.
"""

from __future__ import annotations

import math
import re
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from gpuyantra.binding import ModuleGroup, find_module_groups
from gpuyantra.hardware import HardwareSpec, get_hardware

LABEL = "gy#"
STEP_LABEL = LABEL + "step"
HOST_BOUND_BUSY = 0.5  # below this GPU busy fraction the step waits on the host
KERNEL_EFFICIENCY = 0.8  # fraction of the roofline a good kernel reaches
# A Triton call inside a served forward costs more host time than in the warm micro-loop that
# `gpuyantra.hardware` times (cold caches, the replacement forward, reading the ADAPTER). On an H200
# (torch 2.11) a swapped-in RMSNorm saved 73 us/call in decode against 169 us of eager host time,
# i.e. ~96 us in situ vs 30 us in the loop; 2x keeps estimates on the conservative side.
IN_SITU_LAUNCH_FACTOR = 2.0
DEFAULT_DECODE_STEPS = 32


# --------------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------------


def profile_model(
    model: torch.nn.Module,
    run_probe: Callable[[], Any] | Mapping[str, Callable[[], Any]] | None = None,
    device: str | torch.device | None = None,
    *,
    probes: Mapping[str, Callable[[], Any]] | None = None,
    ops: Sequence[str] | None = None,
    groups: Sequence[ModuleGroup] | None = None,
    warmup: int = 1,
    repeat: int = 5,
    profile_steps: int = 2,
    weights: Mapping[str, float] | None = None,
    decode_steps: float = DEFAULT_DECODE_STEPS,
    hardware: HardwareSpec | None = None,
    function_sites: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """Profile `model` under each probe and rank its op-family targets by effect on served latency.

    `run_probe` runs one representative forward workload (the positional form; its phase is named
    "probe"). Alternatively `probes={"prefill": f, "decode": g}` (or a dict as `run_probe`) profiles
    each named phase. `ops` restricts the families; `groups` skips binding discovery.
    `function_sites` (`gpuyantra.swap.FunctionSite`, e.g. rope's `apply_rotary_pos_emb` globals) adds
    one function-level target per family; discovered with the groups when `groups` is None.
    """
    started = time.perf_counter()
    phase_fns = _phase_functions(run_probe, probes)
    if device is None:
        device = _model_device(model)
    device = str(device)
    spec = hardware or get_hardware(device)
    if groups is None:
        groups = find_module_groups(model, ops)
        if function_sites is None:
            from gpuyantra.swap import find_function_sites

            function_sites = find_function_sites(model, ops)
    groups = [g for g in groups if ops is None or g.op in ops]
    sites = [s for s in (function_sites or []) if ops is None or s.op in ops]

    modules = list(model.named_modules())
    phases: dict[str, dict[str, Any]] = {}
    for phase, fn in phase_fns.items():
        phases[phase] = _profile_phase(model, modules, groups, fn, device, spec, warmup, repeat, profile_steps, sites)

    phase_weights = _phase_weights(phases, weights, decode_steps)
    primary = _primary_phase(phases, phase_weights)
    targets = _combine_targets(phases, phase_weights, primary)
    head = phases[primary]
    return {
        "targets": targets,
        "device": device,
        "hardware": spec.name,
        "hardware_spec": spec.to_dict(),
        "primary_phase": primary,
        "regime": head["regime"],
        "busy_fraction": head["busy_fraction"],
        "step_ms": head["step_ms"],
        "launches_per_step": head["launches_per_step"],
        "weights": phase_weights,
        "phases": phases,
        "seconds": round(time.perf_counter() - started, 3),
        "notes": _notes(spec, phases, primary),
    }


# --------------------------------------------------------------------------------------------
# one phase
# --------------------------------------------------------------------------------------------


def _profile_phase(model, modules, groups, fn, device, spec: HardwareSpec, warmup, repeat, profile_steps, sites=()):
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
    shadow = _capture_activation_shapes(modules, groups, group_of, fn)
    capture_idx -= set(shadow)
    handles = _install_hooks(modules, capture_idx, captured)

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

    ctx = _PhaseContext(cuda=cuda, spec=spec, step_us=step_us, busy=busy, steps=steps)
    targets = [
        _target_metrics(ctx, group, modules, group_of, gi, by_index, captured) for gi, group in enumerate(groups)
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


def _profiler(activities):
    try:  # acc_events keeps every step's events (and silences a torch 2.11 warning)
        return torch.profiler.profile(activities=activities, acc_events=True)
    except TypeError:
        return torch.profiler.profile(activities=activities)


class _PhaseContext:
    def __init__(self, cuda, spec, step_us, busy, steps):
        self.cuda, self.spec, self.step_us, self.busy, self.steps = cuda, spec, step_us, busy, steps

    @property
    def host_bound(self) -> bool:
        return self.cuda and self.busy < HOST_BOUND_BUSY


# --------------------------------------------------------------------------------------------
# hooks
# --------------------------------------------------------------------------------------------


# Open record_function ranges per (thread, module): the probe may run its forward on any thread.
# The server should keep other traffic off the model while it profiles (it would be counted too).
_OPEN_RANGES: dict[tuple[int, int], list] = {}


def _install_hooks(modules, capture_idx, captured):
    handles = []
    for idx, (_, module) in enumerate(modules):
        label = f"{LABEL}{idx}"

        def pre(mod, args, kwargs, _label=label, _idx=idx):
            if _idx in capture_idx:
                tensor = _first_tensor(args, kwargs)
                if tensor is not None:
                    captured[_idx][(tuple(tensor.shape), _dtype_name(tensor.dtype))] += 1
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


def _capture_activation_shapes(modules, groups, group_of, fn) -> dict[int, Counter]:
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
                    recorded[_idx][(tuple(first.shape), _dtype_name(first.dtype))] += 1
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


def _first_tensor(args, kwargs):
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------------------------
# event attribution
# --------------------------------------------------------------------------------------------


class _RangeStats:
    __slots__ = (
        "index",
        "incl_host",
        "host",
        "dev",
        "kernels",
        "ops",
        "op_time",
        "children",
        "op_names",
        "syncs",
        "sync_time",
        "events",
        "op_events",
        "step",
        "start",
    )

    def __init__(self, index):
        self.index = index
        self.incl_host = self.host = self.dev = self.op_time = self.sync_time = 0.0
        self.kernels = self.ops = self.syncs = 0
        self.events = 1  # profiler events recorded in this range's own part, its label included
        self.op_events = 0  # of which inside top-level ops
        self.children: list[_RangeStats] = []
        self.op_names: dict[str, list[float]] = {}  # top-level op name -> [calls, host us, events]
        self.step: int | None = None  # which profiled probe call this range belongs to
        self.start = 0.0


def _is_cpu(event) -> bool:
    return getattr(event, "device_type", None) == torch.autograd.DeviceType.CPU


def _is_device_event(event) -> bool:
    if _is_cpu(event) or getattr(event, "is_user_annotation", False):
        return False
    return not str(event.name).startswith(LABEL)


def _duration(event) -> float:
    return float(event.time_range.end - event.time_range.start)


# Host calls that wait for the GPU: each one drains the launch queue.
_SYNC = re.compile(r"^(cuda|cu|hip)(Stream|Device|Event|Ctx)?Synchroni[sz]e$|^cudaMemcpy$|^cuMemcpyDtoH")


def _is_op(event) -> bool:
    return "::" in event.name and not event.name.startswith(LABEL)


def _attribute(events) -> list[_RangeStats]:
    """Self (innermost-range) host time, kernel time, launches and ops of every labelled range,
    each tagged with the profiled probe call (step) it belongs to."""
    out: list[_RangeStats] = []
    memo: dict[int, _RangeStats] = {}
    for event in events:
        if not _is_cpu(event) or not event.name.startswith(LABEL):
            continue
        out.append(_range_stats(event, memo))
    step_ranges = sorted((st for st in out if st.index == "step"), key=lambda st: st.start)
    for number, root in enumerate(step_ranges):
        stack = [root]
        while stack:
            node = stack.pop()
            node.step = number
            stack.extend(node.children)
    return out


def _median_per_step(per_step: dict[int, list[float]], steps: int, width: int) -> list[float]:
    """Component-wise median over the profiled steps (a step without a value counts as zeros):
    one slow call on a noisy machine does not move the numbers."""
    rows = [per_step.get(k, [0.0] * width) for k in range(steps)]
    return [statistics.median(row[i] for row in rows) for i in range(width)]


def _range_stats(label_event, memo) -> _RangeStats:
    key = id(label_event)
    if key in memo:
        return memo[key]
    tag = label_event.name[len(LABEL) :]
    stats = _RangeStats("step" if tag == "step" else int(tag))
    stats.incl_host = _duration(label_event)
    stats.start = float(label_event.time_range.start)
    stats.dev = sum(k.duration for k in label_event.kernels)
    stats.kernels = len(label_event.kernels)
    nested_host = 0.0
    stack = [(child, None) for child in label_event.cpu_children]
    while stack:
        event, top_op = stack.pop()
        if event.name.startswith(LABEL):
            child = _range_stats(event, memo)
            stats.children.append(child)
            nested_host += child.incl_host
            continue
        stats.events += 1
        stats.dev += sum(k.duration for k in event.kernels)
        stats.kernels += len(event.kernels)
        if top_op is None and _is_op(event):
            top_op = event.name
            stats.ops += 1
            stats.op_time += _duration(event)
            entry = stats.op_names.setdefault(top_op, [0, 0.0, 0])
            entry[0] += 1
            entry[1] += _duration(event)
        if top_op is not None:
            stats.op_events += 1
            stats.op_names[top_op][2] += 1
        if _SYNC.search(event.name):
            stats.syncs += 1
            stats.sync_time += _duration(event)
        stack.extend((child, top_op) for child in event.cpu_children)
    stats.host = max(stats.incl_host - nested_host, 0.0)
    memo[key] = stats
    return stats


_OVERHEAD: dict[str, tuple[float, float]] = {}


def profiler_overhead(device: str) -> tuple[float, float]:
    """(us per recorded op event, us per labelled module call) the profiler and hooks add on the host.

    Measured once per process and device kind: a loop of tiny ops, and a loop of calls of an empty
    module with the labelling hooks, each timed unprofiled and profiled (minimum of several runs)."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    if kind in _OVERHEAD:
        return _OVERHEAD[kind]
    cuda = kind == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    x = torch.zeros(8, device=device)
    n = 100

    class _Empty(torch.nn.Module):
        def forward(self, t):
            return t

    empty = _Empty()
    modules = [("", empty)]

    def ops():
        for _ in range(n):
            x.add_(1.0)

    def calls():
        for _ in range(n):
            empty(x)

    def best(fn, runs=5):
        times = []
        for _ in range(runs):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append((time.perf_counter() - t0) * 1e6)
        return min(times)

    with torch.no_grad():
        ops(), calls()
        plain_ops, plain_calls = best(ops), best(calls)
        handles = _install_hooks(modules, set(), defaultdict(Counter))
        try:
            with _profiler(activities) as prof:
                prof_ops, prof_calls = best(ops), best(calls)
            events = list(prof.events())
        finally:
            for handle in handles:
                handle.remove()
            _close_open_ranges(modules)
    op_events = sum(1 for e in events if _is_cpu(e) and not e.name.startswith(LABEL)) / (2 * 5 * n)
    per_event = max(prof_ops - plain_ops, 0.0) / (n * max(op_events, 1.0))
    per_call = max(prof_calls - plain_calls, 0.0) / n
    _OVERHEAD[kind] = (per_event, per_call)
    return per_event, per_call


def _remove_profiler_overhead(stats: list[_RangeStats], per_event: float, per_call: float) -> None:
    """Bring host times from the profiled run back to unprofiled time, in place: each recorded op
    event costs `per_event`, each labelled child module call `per_call` in its parent's own time
    (its hooks run there), so many-small-op modules are not over-counted."""
    for s in stats:
        s.host = max(s.host - per_event * (s.events - 1) - per_call * len(s.children), 0.0)
        s.op_time = max(s.op_time - per_event * s.op_events, 0.0)
        for entry in s.op_names.values():
            entry[1] = max(entry[1] - per_event * entry[2], 0.0)


def _absorbed(stats: _RangeStats, modules) -> tuple[float, float, int, int, float]:
    """A target's share of a range: its own time plus nested parameterless helpers (act_fn)."""
    host, dev, kernels, ops, op_time = stats.host, stats.dev, stats.kernels, stats.ops, stats.op_time
    for child in stats.children:
        if child.index == "step":
            continue
        _, module = modules[child.index]
        if next(module.parameters(recurse=False), None) is None:
            h, d, k, o, t = _absorbed(child, modules)
            host, dev, kernels, ops, op_time = host + h, dev + d, kernels + k, ops + o, op_time + t
    return host, dev, kernels, ops, op_time


# --------------------------------------------------------------------------------------------
# per-target metrics, regime, Amdahl estimate
# --------------------------------------------------------------------------------------------


def _target_metrics(ctx: _PhaseContext, group: ModuleGroup, modules, group_of, gi, by_index, captured):
    from gpuyantra.ops import get_op

    family = get_op(group.op)
    indices = [i for i, g in group_of.items() if g == gi]
    per_step: dict[int, list[float]] = defaultdict(lambda: [0.0] * 6)
    for i in indices:
        for st in by_index.get(i, []):
            row = per_step[st.step]
            for j, value in enumerate((*_absorbed(st, modules), 1)):
                row[j] += value
    host_us, dev, kernels, ops, op_time, calls_ps = _median_per_step(per_step, ctx.steps, 6)
    device_us = dev if ctx.cuda else op_time
    launches = kernels if ctx.cuda else ops

    # Shapes of the family's first activation (the roofline is computed on them).
    seen: Counter = Counter()
    for i in indices:
        _, module = modules[i]
        for (shape, dtype), n in captured.get(i, {}).items():
            act_shape = (
                tuple(shape) if family.module_activations is not None else _activation_shape(family, module, shape)
            )
            seen[(act_shape, dtype)] += n
    launches_per_call = launches / calls_ps if calls_ps else 0.0
    target = {
        "op": group.op,
        "module_class": group.module_class,
        "qualified_class": group.qualified_class,
        "modules": group.count,
        "adapter": [dict(b) for b in group.adapter],
        **_cost_fields(
            ctx, family, seen, ctx.steps, host_us, device_us, calls_ps, launches, launches_per_call, group.param_shapes
        ),
    }
    if group.param_shapes:  # linear: one target per projection shape, verified and swapped at it
        target["param_shapes"] = {k: None if v is None else list(v) for k, v in group.param_shapes.items()}
        target["variant"] = group.variant
    target["why"] = _why(ctx, target)
    return target


def _cost_fields(
    ctx: _PhaseContext,
    family,
    seen: Counter,
    steps: int,
    host_us: float,
    device_us: float,
    calls: float,
    launches: float,
    launches_per_call: float,
    param_shapes: dict[str, list[int] | None] | None = None,
) -> dict[str, Any]:
    """The measured and estimated fields of a target: its shapes (most frequent first), the roofline
    on them (with the live parameter shapes where the family has them: a linear's weight), and the
    swap's estimated gain. `seen` counts (shape, dtype) over `steps` steps."""
    shape_counts: Counter = Counter()
    dtype_counts: Counter = Counter()
    bytes_ps = flops_ps = floor_ps = 0.0
    for (shape, dtype_name), n in seen.items():
        shape_counts[shape] += n
        dtype_counts[dtype_name] += n
        cost = family.cost(shape, getattr(torch, dtype_name, torch.float32), param_shapes or None)
        nbytes, nflops = float(cost[0]), float(cost[1])
        bytes_ps += nbytes * n / steps
        flops_ps += nflops * n / steps
        floor_ps += ctx.spec.floor_us(nbytes, nflops) * n / steps
    ai = flops_ps / bytes_ps if bytes_ps > 0 else None
    regime, cost, new_cost, gain_us = estimate_gain(
        cuda=ctx.cuda,
        host_bound=ctx.host_bound,
        spec=ctx.spec,
        host_us=host_us,
        device_us=device_us,
        calls=calls,
        launches=launches,
        floor_us=floor_ps,
        arithmetic_intensity=ai,
    )
    step_us = ctx.step_us
    return {
        "shapes": [list(s) for s, _ in sorted(shape_counts.items(), key=lambda kv: (-kv[1], kv[0]))],
        "dtype": dtype_counts.most_common(1)[0][0] if dtype_counts else None,
        "dtypes": sorted(dtype_counts),
        "regime": regime,
        "share": round(cost / step_us if step_us > 0 else 0.0, 5),
        "device_us": round(device_us, 2),
        "host_us": round(host_us, 2),
        "launches": round(launches, 2),
        "calls": round(calls, 2),
        "launches_per_call": round(launches_per_call, 2),
        "arithmetic_intensity": round(ai, 4) if ai is not None else None,
        "bytes_per_step": int(bytes_ps),
        "flops_per_step": int(flops_ps),
        "floor_us": round(floor_ps, 3),
        "cost_us": round(cost, 2),
        "est_cost_after_us": round(new_cost, 2),
        "est_gain_us": round(gain_us, 2),
        "est_gain": round(gain_us / step_us if step_us > 0 else 0.0, 5),
    }


def estimate_gain(
    *,
    cuda: bool,
    host_bound: bool,
    spec: HardwareSpec,
    host_us: float,
    device_us: float,
    calls: float,
    launches: float,
    floor_us: float,
    arithmetic_intensity: float | None,
) -> tuple[str, float, float, float]:
    """(regime, cost_us, cost_after_us, gain_us) of swapping one module class's op for a kernel.

    cost: the module's time on the step's critical path: max(host, device) when the step waits on
    the host (GPU busy < HOST_BOUND_BUSY), its device time otherwise; host time on CPU.
    cost after: one Triton launch per call on the host (measured call cost x IN_SITU_LAUNCH_FACTOR) and
    the roofline floor at KERNEL_EFFICIENCY (never below min_kernel_us a call) on the device. In a launch-bound
    regime a module already at one launch per call cannot gain: fewer launches is the only lever.
    """
    ai = arithmetic_intensity
    roof_regime = spec.regime(ai) if ai is not None else "memory-bound"
    if not cuda:
        cost = host_us
        new_cost = floor_us / KERNEL_EFFICIENCY + calls * spec.launch_us
        return roof_regime, cost, new_cost, (cost - new_cost) if calls else 0.0
    regime = "launch-bound" if (host_bound and host_us >= device_us) else roof_regime
    new_dev = max(floor_us / KERNEL_EFFICIENCY, calls * spec.min_kernel_us)
    new_host = calls * spec.replacement_launch_us * IN_SITU_LAUNCH_FACTOR
    if host_bound:
        cost, new_cost = max(host_us, device_us), max(new_host, new_dev)
    else:
        cost, new_cost = device_us, new_dev
    gain = (cost - new_cost) if calls else 0.0
    if regime == "launch-bound" and calls and launches / calls <= 1.0:
        gain = min(gain, 0.0)
    return regime, cost, new_cost, gain


class _OpCounter:
    """Counts the aten ops dispatched inside a `with` block (eager launches of a free function)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.n += 1
                return func(*args, **(kwargs or {}))

        self.n = 0
        self.mode = _Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def _function_targets(ctx: _PhaseContext, sites, fn, sync) -> list[dict[str, Any]]:
    """One target per family bound at module globals (rope's `apply_rotary_pos_emb`): one extra call
    of the probe with each site wrapped in a timer (first call per site counts its eager ops), the
    q shapes seen, the roofline on them. `modules` counts the modules calling the function."""
    from gpuyantra.ops import get_op

    if not sites:
        return []
    stats: dict[str, dict[str, Any]] = {
        s.dotted: {"calls": 0, "timed": 0, "us": 0.0, "ops": None, "seen": Counter()} for s in sites
    }
    states = {s.dotted: s.current() for s in sites}

    def timer(site, current):
        st = stats[site.dotted]

        def timed(*args, **kwargs):
            q = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(q, torch.Tensor):
                st["seen"][(tuple(q.shape), _dtype_name(q.dtype))] += 1
            st["calls"] += 1
            if st["ops"] is None:
                with _OpCounter() as counter:
                    out = current(*args, **kwargs)
                st["ops"] = counter.n
                return out
            sync()
            t0 = time.perf_counter()
            out = current(*args, **kwargs)
            sync()
            st["us"] += (time.perf_counter() - t0) * 1e6
            st["timed"] += 1
            return out

        return timed

    try:
        for site in sites:
            site.set(timer(site, states[site.dotted]))
        with torch.no_grad():
            fn()
            sync()
    finally:
        for site in sites:
            site.set(states[site.dotted])

    targets = []
    for op in dict.fromkeys(s.op for s in sites):
        family = get_op(op)
        mine = [s for s in sites if s.op == op]
        calls = sum(stats[s.dotted]["calls"] for s in mine)
        if not calls:
            continue
        timed = sum(stats[s.dotted]["timed"] for s in mine)
        per_call_us = sum(stats[s.dotted]["us"] for s in mine) / timed if timed else 0.0
        ops_per_call = max((stats[s.dotted]["ops"] or 0) for s in mine)
        host_us = device_us = per_call_us * calls
        launches = float(ops_per_call * calls)
        seen: Counter = Counter()
        for s in mine:
            seen.update(stats[s.dotted]["seen"])
        costs = _cost_fields(ctx, family, seen, 1, host_us, device_us, float(calls), launches, float(ops_per_call))
        target = {
            "op": op,
            "module_class": ",".join(dict.fromkeys(s.attr for s in mine)),
            "qualified_class": family.default_module,  # what verify --module and swap(module_class=...) accept
            "modules": sum(s.count for s in mine),
            "adapter": [],
            "binding": "function",
            "functions": [s.dotted for s in mine],
            "callers": list(dict.fromkeys(c for s in mine for c in s.caller_classes)),
            **costs,
        }
        target["why"] = (
            _why(ctx, target) + " (function-level target: the swap replaces the module global "
            f"{', '.join(target['functions'])}, called by {', '.join(target['callers'])})"
        )
        targets.append(target)
    return targets


def _activation_shape(family, module, shape) -> tuple[int, ...]:
    """The family's first activation shape for a module input shape: (..., family hidden)."""
    if not shape:
        return tuple(shape)
    try:
        hidden = int(family.hidden_size(module))
    except Exception:  # noqa: BLE001
        return tuple(shape)
    return (*shape[:-1], hidden)


def _why(ctx: _PhaseContext, t: dict[str, Any]) -> str:
    spec = ctx.spec
    gain, frac = t["est_gain_us"], t["est_gain"]
    calls, lpc = t["calls"], t["launches_per_call"]
    ai = t["arithmetic_intensity"]
    ai_text = f"AI {ai:.2f} FLOP/B vs ridge {spec.ridge:.0f}" if ai is not None else "no roofline model"
    if not ctx.cuda:
        return (
            f"cpu: {t['host_us']:.0f} us/step host ({t['share']:.1%} of the step) over {calls:g} calls, "
            f"{lpc:.1f} ops each; {t['regime']} by roofline ({ai_text}, CPU constants). Speed is not "
            f"judged on CPU (Triton interpreter); ranking is indicative only."
        )
    if t["regime"] == "launch-bound":
        head = (
            f"launch-bound: GPU busy {ctx.busy:.0%} of the step; {calls:g} calls/step issue {lpc:.1f} "
            f"launches each ({t['host_us']:.0f} us host vs {t['device_us']:.0f} us on the GPU). "
        )
        if lpc <= 1.0:
            return head + (
                "Already one launch per call: a faster kernel cannot shorten a launch-bound step "
                f"(est. {gain:+.0f} us/step, {frac:+.1%}); only fusing with neighbours or CUDA "
                "graphs would."
            )
        verb = "saves" if gain > 0 else "would not save time:"
        return head + (
            f"Only fewer launches help: one Triton launch per call (~"
            f"{spec.replacement_launch_us * IN_SITU_LAUNCH_FACTOR:.0f} us host each in situ) {verb} "
            f"est. {gain:+.0f} us/step ({frac:+.1%} of served latency); "
            "kernel speed in isolation does not matter here."
        )
    where = "host-bound step, " if ctx.host_bound else ""
    return (
        f"{t['regime']}: {where}{ai_text}; {t['device_us']:.0f} us/step on the GPU vs roofline floor "
        f"{t['floor_us']:.0f} us; a kernel at {KERNEL_EFFICIENCY:.0%} of the roof saves est. {gain:+.0f} "
        f"us/step ({frac:+.1%} of served latency)."
    )


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
    for row in rows.values():
        row["modules"] = len(row["modules"])
        for name, value in zip(fields_, _median_per_step(row.pop("_steps"), steps, len(fields_))):
            row[name] = value
        top = sorted(row.pop("_ops").items(), key=lambda kv: -kv[1][1])[:4]
        row["top_ops"] = [{"name": name, "calls": round(n, 1), "host_us": round(t, 1)} for name, (n, t) in top]
        row["syncs"] = round(row["syncs"], 2)
        cost = (
            max(row["host_us"], row["device_us"])
            if ctx.host_bound
            else (row["device_us"] if ctx.cuda else row["host_us"])
        )
        row["share"] = round(cost / ctx.step_us, 5) if ctx.step_us else 0.0
        for k in ("host_us", "ops_host_us", "device_us", "launches"):
            row[k] = round(row[k], 2)
        out.append(row)
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


# --------------------------------------------------------------------------------------------
# phases -> one ranking
# --------------------------------------------------------------------------------------------


def _phase_functions(run_probe, probes) -> dict[str, Callable[[], Any]]:
    if probes is not None:
        fns = dict(probes)
    elif isinstance(run_probe, Mapping):
        fns = dict(run_probe)
    elif callable(run_probe):
        fns = {"probe": run_probe}
    else:
        raise TypeError("profile_model needs run_probe (a callable) or probes={'decode': f, ...}")
    if not fns or not all(callable(f) for f in fns.values()):
        raise TypeError("every probe must be a callable taking no arguments")
    return fns


def _model_device(model: torch.nn.Module) -> str:
    for tensor in model.parameters():
        return str(tensor.device)
    return "cpu"


def _phase_weights(phases, weights, decode_steps) -> dict[str, float]:
    out = {}
    for name in phases:
        if weights is not None and name in weights:
            out[name] = float(weights[name])
        elif name == "decode":
            out[name] = float(decode_steps)
        else:
            out[name] = 1.0
    return out


def _primary_phase(phases, weights) -> str:
    if "decode" in phases:
        return "decode"
    return max(phases, key=lambda p: weights[p] * phases[p]["step_ms"])


def _combine_targets(phases, weights, primary) -> list[dict[str, Any]]:
    """One entry per (op, class); share and gain over a request that runs each phase `weights` times."""
    total_us = sum(weights[p] * phases[p]["step_ms"] * 1e3 for p in phases)
    keyed: dict[tuple[str, str, str], dict[str, Any]] = {}
    order = [primary] + [p for p in phases if p != primary]
    for phase in order:
        for t in phases[phase]["targets"]:
            key = (t["op"], t["qualified_class"], t.get("variant", ""))
            entry = keyed.get(key)
            if entry is None:
                entry = {k: v for k, v in t.items() if k != "rank"}
                entry["shapes"] = []
                entry["dtypes"] = []
                entry["phases"] = {}
                entry["_cost"] = entry["_gain"] = 0.0
                keyed[key] = entry
            for shape in t["shapes"]:
                if shape not in entry["shapes"]:
                    entry["shapes"].append(shape)
            for d in t["dtypes"]:
                if d not in entry["dtypes"]:
                    entry["dtypes"].append(d)
            entry["_cost"] += weights[phase] * t["cost_us"]
            entry["_gain"] += weights[phase] * t["est_gain_us"]
            entry["phases"][phase] = {
                k: t[k]
                for k in (
                    "regime",
                    "share",
                    "est_gain",
                    "est_gain_us",
                    "device_us",
                    "host_us",
                    "launches",
                    "calls",
                    "arithmetic_intensity",
                    "floor_us",
                    "shapes",
                    "why",
                )
            }
    out = []
    for entry in keyed.values():
        cost, gain = entry.pop("_cost"), entry.pop("_gain")
        if len(phases) > 1 and total_us > 0:
            entry["share"] = round(cost / total_us, 5)
            entry["est_gain"] = round(gain / total_us, 5)
            entry["est_gain_us_per_request"] = round(gain, 2)
        out.append(entry)
    out.sort(key=lambda t: (-t["est_gain"], -t["share"], t["op"], t["qualified_class"]))
    for rank, t in enumerate(out, 1):
        t["rank"] = rank
    return out


def _notes(spec: HardwareSpec, phases, primary) -> list[str]:
    notes = []
    if not spec.measured:
        notes.append(f"{spec.name}: roofline from conservative constants (not measured); speed is not judged here.")
    head = phases[primary]
    if head["regime"] == "launch-bound":
        notes.append(
            f"{primary}: the GPU is busy {head['busy_fraction']:.0%} of a {head['step_ms']:.1f} ms step "
            f"({head['launches_per_step']:.0f} launches): the host is the bottleneck, so only swaps that "
            "remove launches shorten served latency."
        )
    target_classes = {t["qualified_class"] for t in head["targets"]}
    for row in head["classes"][:3]:
        if row["qualified_class"] in target_classes or row["share"] < 0.2:
            continue
        ops = ", ".join(f"{o['name']} {o['host_us']:.0f} us" for o in row["top_ops"][:3])
        notes.append(
            f"{primary}: {row['module_class']} (no op family binds it) holds {row['share']:.0%} of the step "
            f"in its own code ({row['launches']:.0f} launches, {row['syncs']:g} GPU syncs/step, "
            f"{row['host_us'] - row['ops_host_us']:.0f} us/step of Python between ops; top host ops: {ops})."
        )
    if head.get("syncs_per_step"):
        notes.append(f"{primary}: {head['syncs_per_step']:g} host-GPU synchronizations per step inside the model.")
    if len(phases) > 1:
        notes.append(
            "top-level share and est_gain are per served request, each phase weighted by 'weights' "
            "(how many times a request runs it)."
        )
    return notes
