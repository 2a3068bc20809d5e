"""`profile_model`: profile each phase of a live model and combine the phases into one ranking."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from gpuyantra.binding import ModuleGroup, find_module_groups
from gpuyantra.hardware import HardwareSpec, get_hardware
from gpuyantra.profile_targets import merge_live_inputs
from gpuyantra.profiler.phase import _profile_phase

DEFAULT_DECODE_STEPS = 32


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
    graphed_phases: Sequence[str] = (),
) -> dict[str, Any]:
    """Profile `model` under each probe and rank its op-family targets by effect on served latency.

    `run_probe` runs one representative forward workload (the positional form; its phase is named
    "probe"). Alternatively `probes={"prefill": f, "decode": g}` (or a dict as `run_probe`) profiles
    each named phase. `ops` restricts the families; `groups` skips binding discovery.
    `function_sites` (`gpuyantra.function_sites.FunctionSite`, e.g. rope's `apply_rotary_pos_emb` globals) adds
    one function-level target per family; discovered with the groups when `groups` is None.
    `graphed_phases`: phases the server replays as CUDA graphs (decode under `serve --cuda-graphs`);
    their targets are ranked by GPU time, since host launches no longer cost the step anything.
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
            from gpuyantra.function_sites import find_function_sites

            function_sites = find_function_sites(model, ops)
    groups = [g for g in groups if ops is None or g.op in ops]
    sites = [s for s in (function_sites or []) if ops is None or s.op in ops]

    modules = list(model.named_modules())
    phases: dict[str, dict[str, Any]] = {}
    for phase, fn in phase_fns.items():
        phases[phase] = _profile_phase(
            model, modules, groups, fn, device, spec, warmup, repeat, profile_steps, sites, phase in graphed_phases
        )

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
            merge_live_inputs(entry, t)  # every phase's row counts (decode batches, prefill) and layouts
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
