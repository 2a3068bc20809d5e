"""Per-target metrics of a phase: time, launches and shapes of a module group or function site, its
roofline, regime and the Amdahl estimate of what a swap would save (`estimate_gain`), and the `why`."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any

import torch

from gpuyantra.binding import ModuleGroup
from gpuyantra.hardware import HardwareSpec
from gpuyantra.profile_targets import (
    function_target_fields,
    group_target_fields,
    live_input_fields,
    param_shape_fields,
)
from gpuyantra.profiler.events import _absorbed, _median_per_step
from gpuyantra.profiler.hooks import _dtype_name, record_layouts

HOST_BOUND_BUSY = 0.5  # below this GPU busy fraction the step waits on the host
KERNEL_EFFICIENCY = 0.8  # fraction of the roofline a good kernel reaches
# A Triton call inside a served forward costs more host time than in the warm micro-loop that
# `gpuyantra.hardware` times (cold caches, the replacement forward, reading the ADAPTER). On an H200
# (torch 2.11) a swapped-in RMSNorm saved 73 us/call in decode against 169 us of eager host time,
# i.e. ~96 us in situ vs 30 us in the loop; 2x keeps estimates on the conservative side.
IN_SITU_LAUNCH_FACTOR = 2.0


class _PhaseContext:
    """A profiled phase. `graphed`: the server replays this phase's steps as CUDA graphs, so host
    launches are off the critical path and the step lasts as long as its GPU work (`step_us` is then
    the GPU time of the eager step the profiler saw)."""

    def __init__(self, cuda, spec, step_us, busy, steps, graphed: bool = False):
        self.cuda, self.spec, self.step_us, self.busy, self.steps = cuda, spec, step_us, busy, steps
        self.graphed = graphed

    @property
    def host_bound(self) -> bool:
        return self.cuda and not self.graphed and self.busy < HOST_BOUND_BUSY


def _target_metrics(ctx: _PhaseContext, group: ModuleGroup, modules, group_of, gi, by_index, captured, layouts=None):
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

    seen = _activation_counts(family, modules, indices, captured)  # the roofline is computed on them
    launches_per_call = launches / calls_ps if calls_ps else 0.0
    target = {
        **group_target_fields(group),
        **_cost_fields(
            ctx, family, seen, ctx.steps, host_us, device_us, calls_ps, launches, launches_per_call, group.param_shapes
        ),
        **param_shape_fields(group),
    }
    seen_layouts: Counter = Counter()
    for i in indices:
        seen_layouts.update((layouts or {}).get(i, {}))
    target.update(live_input_fields(target["shapes"], seen_layouts))
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
        s.dotted: {"calls": 0, "timed": 0, "us": 0.0, "ops": None, "seen": Counter(), "layouts": Counter()}
        for s in sites
    }
    states = {s.dotted: s.current() for s in sites}

    def timer(site, current):
        st = stats[site.dotted]

        def timed(*args, **kwargs):
            q = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(q, torch.Tensor):
                st["seen"][(tuple(q.shape), _dtype_name(q.dtype))] += 1
                # q and k sliced to the rotary dims (partial rotary) arrive as views: their layouts.
                record_layouts(st["layouts"], [a for a in args if isinstance(a, torch.Tensor)])
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

    # Replayed as CUDA graphs, the step waits on the function's kernels only: its host-inclusive
    # wall time (what the timer measures) would rank it far above what a swap could save.
    kernels = _site_kernel_us(sites, states, fn, sync) if ctx.graphed else {}
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
        kernel_calls = sum(kernels.get(s.dotted, (0.0, 0))[1] for s in mine)
        if kernel_calls:  # device time as the graph replays it
            device_us = sum(kernels.get(s.dotted, (0.0, 0))[0] for s in mine) / kernel_calls * calls
        launches = float(ops_per_call * calls)
        seen: Counter = Counter()
        seen_layouts: Counter = Counter()
        for s in mine:
            seen.update(stats[s.dotted]["seen"])
            seen_layouts.update(stats[s.dotted]["layouts"])
        costs = _cost_fields(ctx, family, seen, 1, host_us, device_us, float(calls), launches, float(ops_per_call))
        target = {
            **function_target_fields(op, mine),
            "callers": list(dict.fromkeys(c for s in mine for c in s.caller_classes)),
            **costs,
        }
        target.update(live_input_fields(target["shapes"], seen_layouts))
        target["why"] = (
            _why(ctx, target) + " (function-level target: the swap replaces the module global "
            f"{', '.join(target['functions'])}, called by {', '.join(target['callers'])})"
        )
        targets.append(target)
    return targets


SITE_LABEL = "gpuyantra.site:"


def _site_kernel_us(sites, states, fn, sync) -> dict[str, tuple[float, int]]:
    """Per function site: (kernel time in us, calls) over one call of `fn`, each call a labelled
    profiler range whose device time sums the kernels launched inside it. {} when the profiler
    cannot run (the wall time stands)."""
    from gpuyantra.profiler.events import _is_cpu

    def labelled(site, current):
        def call(*args, **kwargs):
            with torch.profiler.record_function(SITE_LABEL + site.dotted):
                return current(*args, **kwargs)

        return call

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    try:
        for site in sites:
            site.set(labelled(site, states[site.dotted]))
        with torch.no_grad(), torch.profiler.profile(activities=activities) as prof:
            fn()
            sync()
        events = list(prof.events())
    except Exception:  # noqa: BLE001 - the profile keeps the timed wall time
        return {}
    finally:
        for site in sites:
            site.set(states[site.dotted])
    out: dict[str, tuple[float, int]] = {}
    for event in events:
        if not (_is_cpu(event) and str(event.name).startswith(SITE_LABEL)):
            continue
        dotted = str(event.name)[len(SITE_LABEL) :]
        device = getattr(event, "device_time_total", None)
        if device is None:
            device = getattr(event, "cuda_time_total", 0.0)
        us, n = out.get(dotted, (0.0, 0))
        out[dotted] = (us + float(device or 0.0), n + 1)
    return out


def _activation_counts(family, modules, indices, captured) -> Counter:
    """(shape, dtype) of the family's first activation -> calls, over the group's modules `indices`.
    `captured` holds module input shapes, or activation shapes already for a family whose module
    input is not its first activation (`module_activations`: recorded by a shadow call)."""
    seen: Counter = Counter()
    for i in indices:
        _, module = modules[i]
        for (shape, dtype), n in captured.get(i, {}).items():
            act_shape = (
                tuple(shape) if family.module_activations is not None else _activation_shape(family, module, shape)
            )
            seen[(act_shape, dtype)] += n
    return seen


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
    where = "host-bound step, " if ctx.host_bound else ("step replayed as CUDA graphs, " if ctx.graphed else "")
    return (
        f"{t['regime']}: {where}{ai_text}; {t['device_us']:.0f} us/step on the GPU vs roofline floor "
        f"{t['floor_us']:.0f} us; a kernel at {KERNEL_EFFICIENCY:.0%} of the roof saves est. {gain:+.0f} "
        f"us/step ({frac:+.1%} of served latency)."
    )
