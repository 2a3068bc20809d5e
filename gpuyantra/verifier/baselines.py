"""Measurements that do not depend on the candidate, kept in the state folder and reused.

* copy bandwidth per device name (the physical floor of the benchmark layer);
* the eager and torch.compile (default and reduce-overhead) baselines per (op, module class, the
  parameters (`params_digest`), shape, dtype, device name, torch and triton versions): compiling
  and timing them is most of the benchmark layer's time and their value does not change between
  candidates. Verifications on one GPU take turns timing, so a baseline timed again in each would
  lengthen every other's wait; the first verification of a shape times eager interleaved with its
  candidate, later ones time the candidate alone (after the same spin-up to load clocks) against
  the kept figure.

Several verifications may run at once on one GPU: files are rewritten under an exclusive lock, and
`timing_lock()` names the lock the sandbox children hold while they time (no verdict's speed is
measured against another's load); the GPU's other locks lie beside it, and the campaign's
served-speed check holds all of them (`gpuyantra/verifier/gpu_locks.py`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuyantra.verifier.gpu_locks import TIMING_FILE, time_alone

BANDWIDTH_FILE = "copy_bandwidth.json"
BASELINES_FILE = "baselines.json"
CACHED_KEYS = ("eager_us", "eager_launch_us", "compile_us", "compile_ro_us")


def folder() -> Path:
    from gpuyantra.config import state_dir

    path = state_dir() / "verifier"
    path.mkdir(parents=True, exist_ok=True)
    return path


def timing_lock() -> Path:
    """The file sandbox children `flock` while they time kernels and baselines; the GPU's turnstile
    and quiet locks lie beside it (`gpu_locks.GpuLocks.beside`)."""
    return folder() / TIMING_FILE


def read_state(name: str) -> dict[str, Any]:
    """One JSON file of the verifier's state folder ({} when missing or unreadable)."""
    try:
        data = json.loads((folder() / name).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


@contextlib.contextmanager
def updating_state(name: str) -> Iterator[dict[str, Any]]:
    """Read-modify-write of one JSON file under an exclusive lock, replaced atomically."""
    path = folder() / name
    with open(path.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = read_state(name)
        yield data
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)


def bandwidth_cache() -> dict[str, float]:
    return {str(k): float(v) for k, v in read_state(BANDWIDTH_FILE).items() if isinstance(v, (int, float))}


def store_bandwidth(device_name: str | None, gbs: float | None) -> float | None:
    """Keep the best copy bandwidth measured on `device_name`: interference and low clocks only ever
    make a copy slower, so a lower reading never replaces a higher one. Returns what is kept."""
    if not device_name:
        return None
    with updating_state(BANDWIDTH_FILE) as data:
        kept = float(data.get(device_name) or 0.0)
        if gbs and float(gbs) > kept:
            data[device_name] = kept = float(gbs)
    return kept or None


def remeasure_bandwidth(device_name: str, measure: Callable[[], float]) -> float | None:
    """Measure the copy bandwidth again with the GPU alone, in this (trusted) process, and keep the
    better reading; returns the kept one. For a verdict whose kernel ran faster than the floor the
    kept bandwidth allows: the floor is only as good as the reading it came from."""
    with time_alone(timing_lock()):
        return store_bandwidth(device_name, measure())


def measure_bandwidth_if_missing(device_name: str, measure: Callable[[], float]) -> bool:
    """Measure the copy bandwidth of `device_name` with the GPU alone and keep it, unless it is kept
    already; True when it measured. A GPU worker does it at its start: otherwise each verification
    of a cold campaign's first wave measured it in its child, waiting up to 16.2 s (H200) for the GPU
    alone behind the others' timings, for a measurement of 5 ms."""
    if bandwidth_cache().get(device_name):
        return False
    with time_alone(timing_lock()):
        if bandwidth_cache().get(device_name):  # measured meanwhile by another process
            return False
        store_bandwidth(device_name, measure())
    return True


def _versions() -> str:
    import torch
    import triton

    return f"torch {torch.__version__} triton {triton.__version__}"


# Bumped when what a baseline times changes (2: the module's own computation, `OpFamily.eager`; 3: device
# time, launches queued ahead, `bench.time_cuda`; 4: keyed by the parameters too), so timings cached by
# an older verifier are never reused as if they measured the same thing.
BASELINE_FORMAT = 4


def params_digest(param_specs: Sequence[dict[str, Any]]) -> str:
    """The module's parameters as the cases build them (shapes, kinds, values): two projections
    with the same activations and different weights (q/k/v and o_proj) time differently."""
    text = json.dumps(list(param_specs), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def shape_key(shape: Sequence[int]) -> str:
    """A shape as baselines are kept by it: "4x1536"."""
    return "x".join(str(d) for d in shape)


def baseline_key(
    op: str, module_class: str | None, shape: Sequence[int], dtype: str, device_name: str, params: str = ""
) -> str:
    return f"{op}|{module_class}|{params}|{shape_key(shape)}|{dtype}|{device_name}|{_versions()}|v{BASELINE_FORMAT}"


def cached_baselines(
    op: str,
    module_class: str | None,
    shapes: Sequence[Sequence[int]],
    dtype: str,
    device_name: str,
    params: str = "",
) -> dict[str, dict[str, float]]:
    """{shape as "AxB": {eager_us, eager_launch_us, compile_us, compile_ro_us}} for the shapes measured
    before with the same parameters (`params_digest`)."""
    data = read_state(BASELINES_FILE)
    out: dict[str, dict[str, float]] = {}
    for shape in shapes:
        entry = data.get(baseline_key(op, module_class, shape, dtype, device_name, params))
        if isinstance(entry, dict):
            values = {k: float(entry[k]) for k in CACHED_KEYS if isinstance(entry.get(k), (int, float))}
            if values:
                out[shape_key(shape)] = values
    return out


def store_baselines(
    op: str, module_class: str | None, rows: Sequence[dict[str, Any]], device_name: str, params: str = ""
) -> None:
    """Keep the baseline timings of bench rows measured in this verification (not the reused ones)."""
    fresh = []
    for row in rows:
        reused = set(row.get("cached") or ())
        values = {k: row[k] for k in CACHED_KEYS if k not in reused and isinstance(row.get(k), (int, float))}
        if values:
            fresh.append((baseline_key(op, module_class, row["shape"], row["dtype"], device_name, params), values))
    if fresh:
        with updating_state(BASELINES_FILE) as data:
            for key, values in fresh:
                data.setdefault(key, {}).update(values)
