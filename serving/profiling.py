"""Profiling the served model (`POST /admin/profile`): probes built from recent traffic, the profiler
(`gpuyantra.profiler`), and a fallback profile timed here when the profiler cannot run.

The profile times one decode batch (the one live traffic runs most, else one row), but a kernel is
judged at every batch the server serves: `served_decode_batches` names them (one row, and the
batched decode), each target's `shapes` gain the shapes it takes at each of them, and the answer's
`served_batches` tells a campaign which batches its served-speed checks measure."""

from __future__ import annotations

import inspect
import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch

from gpuyantra.binding import ModuleGroup, find_open_groups
from gpuyantra.hardware import gpu_uuid, hardware_kind
from gpuyantra.profile_targets import (
    add_served_shapes,
    function_target_fields,
    group_target_fields,
    param_shape_fields,
)
from gpuyantra.swap.engine import SwapEngine
from serving.runner import ModelRunner
from serving.scheduler import Scheduler
from serving.shapes import ShapeRecorder

log = logging.getLogger("gpuyantra.serving")


def prepare_profiler_on_this_thread(device: str) -> None:
    """Start and stop an empty profile on the calling (main) thread, before the server's threads.

    Why: the profiler library registers its client on the thread that imported torch and runs that
    client's init on the thread that first starts a profile; when those differ (a profile served
    from the engine's thread) it logs "External init callback must run in same thread as
    registerClient" and skips the init, on a CPU as on CUDA. Starting it once here keeps both on one
    thread."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if str(device).startswith("cuda") and torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    try:
        with torch.profiler.profile(activities=activities):
            pass
    except Exception as exc:  # noqa: BLE001 - serving must start without a profiler too
        log.warning("profiler warm-up failed (profiles fall back to timing): %s", exc)


class Profiling:
    """The engine's profiling part (`/admin/profile`): probes from the scheduler's recent traffic,
    run through the runner with the scheduler idle. It owns the served model's op-family groups,
    which gain the open targets found at the first profile."""

    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler,
        swaps: SwapEngine,
        groups: list[ModuleGroup],
        shapes: ShapeRecorder,
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.swaps = swaps
        self.groups = groups
        self.shapes = shapes
        self._open_groups_found = False

    def function_sites(self) -> list[Any]:
        """Function-level swap sites of the served model (rope's `apply_rotary_pos_emb` globals)."""
        from gpuyantra.ops import all_ops

        return [
            site for family in all_ops() if family.known_functions for site in self.swaps.function_sites(family.name)
        ]

    def live_shapes(self) -> dict[str, list[list[int]]]:
        return {g.key: [list(s) for s in self.shapes.shapes_for(g.key)] for g in self.groups}

    def _probe_rows(self) -> tuple[int, int]:
        traffic = self.scheduler.traffic
        prompt = int(statistics.median(traffic.prompt_lens)) if traffic.prompt_lens else 16
        batch = Counter(traffic.batches).most_common(1)[0][0] if traffic.batches else 1
        prompt = max(1, min(prompt, self.runner.usable_len - 2))
        return prompt, max(1, min(batch, self.runner.max_batch))

    def served_decode_batches(self) -> list[int]:
        """The decode batches a kernel must be judged at: one row (a lone client) and the server's
        batched decode: the row count live traffic decodes at most often above one, else max_batch,
        as the decode step runs it (rounded up to its CUDA-graph bucket)."""
        batched = Counter(rows for _, rows, _, _ in self.scheduler.traffic.live_steps if rows > 1)
        widest = batched.most_common(1)[0][0] if batched else self.runner.max_batch
        graphs = self.runner.graphs
        rows = graphs.bucket_for(widest) if graphs is not None else widest
        return sorted({1, min(rows, self.runner.max_batch)})

    def _probe_prompt(self, length: int) -> list[int]:
        vocab = max(2, self.runner.vocab_size)
        return [(13 * i + 1) % vocab for i in range(length)]

    def _decode_probe(self, prompt: list[int], batch: int) -> Callable[[], Any]:
        """One decode step at `batch` rows; the rows are prefilled with `prompt` on the first call."""
        primed = {"done": False}

        def decode():
            if not primed["done"]:
                for r in range(batch):
                    self.runner.prefill_row(r, prompt)
                primed["done"] = True
            self.runner.decode_rows_eager([1] * batch, [len(prompt)] * batch, kv_len=len(prompt) + 1)

        return decode

    def probes(self) -> dict[str, Callable[[], Any]]:
        """Representative workloads built from recent traffic: one prefill, one decode step."""
        prompt_len, batch = self._probe_rows()
        prompt = self._probe_prompt(prompt_len)

        def prefill():
            self.runner.prefill_row(0, prompt)

        return {"prefill": prefill, "decode": self._decode_probe(prompt, batch)}

    def served_probes(self, batches: Sequence[int]) -> dict[str, Callable[[], Any]]:
        """One decode step at each served batch (`decode@8`): run only for the shapes targets take."""
        prompt = self._probe_prompt(self._probe_rows()[0])
        return {f"decode@{batch}": self._decode_probe(prompt, batch) for batch in batches}

    def _discovery_probe(self, probes: Mapping[str, Callable[[], Any]]) -> Callable[[], Any]:
        """Every workload the server runs, once: the decode step the profile times (its calls build
        the open targets), the prefill, and a decode step at each served batch. An open target's
        sizes are judged from all of their calls (a position input of batch 1 in a prefill, of the
        served batch in a decode), never from one."""
        served = self.served_probes(self.served_decode_batches())

        def run() -> None:
            for probe in (probes["decode"], probes["prefill"], *served.values()):
                probe()

        return run

    def _add_served_shapes(self, targets: list[dict[str, Any]], batches: Sequence[int]) -> None:
        """Each target's shapes at every served decode batch, after those the profile timed."""
        try:
            from gpuyantra.profiler.coverage import capture_target_shapes

            sites = self.function_sites()
            served = {
                name: capture_target_shapes(self.runner.model, self.groups, probe, sites)
                for name, probe in self.served_probes(batches).items()
            }
        except Exception:  # noqa: BLE001 - the profile still answers, with the shapes it timed
            log.exception("capturing the served batches' shapes failed; targets keep the profiled shapes")
            return
        add_served_shapes(targets, served)

    def profile(self) -> dict[str, Any]:
        if self.scheduler.active_count:
            raise RuntimeError("profile needs an idle engine (run it through call(..., exclusive=True))")
        with self.runner.eager_prefill():  # the probes' prefill runs the modules' own calls, as the profiler needs
            return self._profile()

    def _profile(self) -> dict[str, Any]:
        probes = self.probes()
        self._add_open_groups(self._discovery_probe(probes))
        source, error, result = "fallback", None, None
        try:
            result = run_profiler(
                self.runner.model,
                probes,
                str(self.runner.device),
                self.groups,
                function_sites=self.function_sites(),
                graphed_phases=("decode",) if self.runner.graphs is not None else (),
            )
            if result is not None:
                source = "profiler"
        except Exception as exc:  # noqa: BLE001 - the fallback always answers
            error = f"{type(exc).__name__}: {exc}"
            log.exception("profiler failed; answering with the fallback profile")
        if result is None:
            result = self._fallback_profile(probes)
        result = dict(result)
        batches = self.served_decode_batches()
        self._add_served_shapes(result.get("targets", []), batches)
        result["served_batches"] = batches
        targets = []
        for t in result.get("targets", []):
            t = dict(t)
            group = next(
                (
                    g
                    for g in self.groups
                    if g.op == t.get("op")
                    and t.get("module_class") in (g.module_class, g.qualified_class)
                    and g.variant == t.get("variant", "")  # linear: one group per projection shape
                ),
                None,
            )
            if group is not None:
                t.setdefault("qualified_class", group.qualified_class)
                t.setdefault("adapter", group.adapter)
                t.setdefault("modules", group.count)
                live = [list(s) for s in self.shapes.shapes_for(group.key)]
                if live:
                    t.setdefault("live_shapes", live)
                t["swapped"] = self.swaps.swaps_bound_at(modules=group.names)
                _attach_open_payload(t)
            elif t.get("functions"):  # function-level target (rope): which swaps hold its globals
                t["swapped"] = self.swaps.swaps_bound_at(functions=t["functions"])
            targets.append(t)
        result["targets"] = targets
        result.setdefault("device", str(self.runner.device))
        result.setdefault("hardware", _hardware_name(self.runner.device))
        result.setdefault("device_key", gpu_uuid(self.runner.device))  # which GPU: campaigns verify on others
        # The kind GPU workers derive from the same device name (their queue): the profile's `hardware`
        # is the roofline class ("nvidia-h100"), coarser than a worker's kind ("nvidia-h100-80gb").
        result.setdefault("hardware_kind", served_kind(self.runner.device))
        result["source"] = source
        if error:
            result["profiler_error"] = error
        result["model"] = self.runner.model_name
        result["dtype"] = str(self.runner.dtype).replace("torch.", "")
        return result

    def _add_open_groups(self, decode: Callable[[], Any]) -> None:
        """Once per process: open targets for the leaf module classes no registered family covers
        (their own forward is the reference), profiled and offered to campaigns like families."""
        if self._open_groups_found:
            return
        self._open_groups_found = True
        try:
            extra = find_open_groups(self.runner.model, decode, self.groups)
        except Exception:  # noqa: BLE001 - the registered families are still profiled
            log.exception("open target discovery failed; profiling registered families only")
            return
        known = {(g.op, g.qualified_class) for g in self.groups}
        self.groups = [*self.groups, *(g for g in extra if (g.op, g.qualified_class) not in known)]

    def _fallback_profile(self, probes: Mapping[str, Callable[[], Any]]) -> dict[str, Any]:
        """Rank (op, class) groups by measured share of a decode step, at the live shapes."""
        from gpuyantra.ops import get_op

        cuda = self.runner.device.type == "cuda"

        def timed(fn, repeat=3) -> float:
            times = []
            for _ in range(repeat):
                if cuda:
                    torch.cuda.synchronize(self.runner.device)
                t0 = time.perf_counter()
                fn()
                if cuda:
                    torch.cuda.synchronize(self.runner.device)
                times.append(time.perf_counter() - t0)
            return statistics.median(times)

        with torch.no_grad():
            probes["decode"]()
            step_s = timed(probes["decode"])
        modules = dict(self.runner.model.named_modules())
        targets: list[dict[str, Any]] = []
        for group in self.groups:
            family = get_op(group.op)
            module = modules[group.names[0]]
            recent = self.shapes.shapes_for(group.key)
            shapes = recent[:4] if recent else []
            rows = tuple(recent[0][:-1]) if recent else (1, 1)
            try:
                gen = torch.Generator().manual_seed(0)
                acts = family.activations_for_module(module, rows, self.runner.dtype, self.runner.device, gen)
                with torch.no_grad():
                    family.module_call(module, *acts)
                    per_call = timed(partial(family.module_call, module, *acts))
            except Exception:  # noqa: BLE001 - a group we cannot time ranks last
                per_call = 0.0
            if not shapes:
                shapes = [tuple(a.shape) for a in acts[:1]] if per_call else []
            share = min(1.0, per_call * group.count / step_s) if step_s > 0 else 0.0
            targets.append(
                {
                    **group_target_fields(group),
                    **param_shape_fields(group),
                    "shapes": [list(s) for s in shapes],
                    "dtype": str(self.runner.dtype).replace("torch.", ""),
                    "regime": "unknown",
                    "share": round(share, 4),
                    "est_us_per_step": round(per_call * group.count * 1e6, 2),
                }
            )
        targets.extend(self._fallback_function_targets(probes["decode"], step_s))
        targets.sort(key=lambda t: t["share"], reverse=True)
        return {
            "targets": targets,
            "device": str(self.runner.device),
            "hardware": _hardware_name(self.runner.device),
            "step_ms": round(step_s * 1000, 3),
        }

    def _fallback_function_targets(self, decode: Callable[[], Any], step_s: float) -> list[dict[str, Any]]:
        """Function-level targets (rope) for the fallback profile: one decode step with each site's
        global wrapped in a timer; shapes are the q shapes seen."""
        sites = self.function_sites()
        if not sites:
            return []
        seen: dict[str, Counter] = {s.op: Counter() for s in sites}
        spent: dict[str, float] = {s.op: 0.0 for s in sites}
        states = {s.dotted: s.current() for s in sites}

        def timer(site, current):
            def timed(*args, **kwargs):
                if args and isinstance(args[0], torch.Tensor):
                    seen[site.op][tuple(args[0].shape)] += 1
                t0 = time.perf_counter()
                try:
                    return current(*args, **kwargs)
                finally:
                    spent[site.op] += time.perf_counter() - t0

            return timed

        try:
            for site in sites:
                site.set(timer(site, states[site.dotted]))
            with torch.no_grad():
                decode()
        finally:
            for site in sites:
                site.set(states[site.dotted])
        out = []
        for op in seen:
            mine = [s for s in sites if s.op == op]
            if not seen[op]:
                continue
            out.append(
                {
                    **function_target_fields(op, mine),
                    "shapes": [list(sh) for sh, _ in seen[op].most_common()],
                    "dtype": str(self.runner.dtype).replace("torch.", ""),
                    "regime": "unknown",
                    "share": round(min(1.0, spent[op] / step_s), 4) if step_s > 0 else 0.0,
                    "est_us_per_step": round(spent[op] * 1e6, 2),
                }
            )
        return out


# An open target travels with its profile entry (workers may not share the server's state folder),
# unless its pickled module is larger than this: Temporal payloads are kept small.
OPEN_PAYLOAD_MAX_BYTES = 1 << 20


def _attach_open_payload(target: dict[str, Any]) -> None:
    from gpuyantra.ops import get_op
    from gpuyantra.ops.open import is_open

    if not is_open(target.get("op")):
        return
    payload = get_op(str(target["op"])).open_target.to_payload()
    if len(payload["module_b64"]) <= OPEN_PAYLOAD_MAX_BYTES:
        target["open_target"] = payload


def run_profiler(
    model: torch.nn.Module,
    probes: Mapping[str, Callable[[], Any]],
    device: str,
    groups: Sequence[ModuleGroup] | None = None,
    function_sites: Sequence[Any] | None = None,
    graphed_phases: Sequence[str] = (),
) -> dict[str, Any] | None:
    """`gpuyantra.profiler.profile_model(model, run_probe, device)` when that module exists, else None."""
    try:
        from gpuyantra.profiler import profile_model
    except ImportError:
        return None
    try:
        params = set(inspect.signature(profile_model).parameters)
    except (TypeError, ValueError):
        params = set()
    if "groups" in params:
        extra: dict[str, Any] = {"function_sites": list(function_sites or [])} if "function_sites" in params else {}
        if "graphed_phases" in params:
            extra["graphed_phases"] = tuple(graphed_phases)
        return profile_model(model, dict(probes), device, groups=list(groups or []), **extra)
    # The minimal contract: one callable probe.
    return profile_model(model, lambda: [p() for p in probes.values()], device)


def served_kind(device: torch.device) -> str:
    """The served device's hardware kind, as a GPU worker on it announces it (gpuyantra/hardware.py)."""
    return hardware_kind(_hardware_name(device)) if device.type == "cuda" else "cpu"


def _hardware_name(device: torch.device) -> str:
    if device.type == "cuda":
        try:
            return torch.cuda.get_device_name(device)
        except Exception:  # noqa: BLE001
            return "cuda"
    return "cpu"
