"""Attribute profiler events to labelled module ranges, and remove the profiler's own host overhead."""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter, defaultdict

import torch

from gpuyantra.profiler.hooks import LABEL, _close_open_ranges, _install_hooks, _profiler


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
