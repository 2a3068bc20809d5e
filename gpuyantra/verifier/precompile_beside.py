"""The torch.compile baselines compiled in a second sandbox child, beside the candidate's.

A verification whose baselines are not yet kept (the first of an op, shape, dtype, parameters and
device) compiled them in the candidate's child after its correctness cases and before its timing
turn: on an H200 the correctness of a cold verdict took 4.2 s (most of it Triton compiling the
candidate for each dtype) and the compile 7.3 s, one after the other. Neither needs the other, so a
second child (a warm spare; one that had to start first would take longer than compiling in the
first) compiles the baselines while the first runs the cases; the first waits for it, then compiles them
itself before its timing turn, finding the compilers' on-disk caches (FX graph, Triton, shared by
the state folder's children) warm: a process's first compile still costs seconds beyond the caches'
hits (H200: 2.8-3.1 s), better paid there than under the timing lock.

What the second child does is a head start only. Nothing of it is timed or judged; where the word
that the baselines are compiled does not come (the second child failed, was not started, or took
longer than `MAX_WAIT_S`), the candidate's child compiles them from cold caches. It never outlives
the verification (`Beside.stop`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from pathlib import Path
from typing import Any

import gpuyantra.verifier.bench as bench
import gpuyantra.verifier.cases as case_plan
from gpuyantra.config import state_dir
from gpuyantra.files import write_whole
from gpuyantra.verifier import compiler_cache
from gpuyantra.verifier.baselines import shape_key
from gpuyantra.verifier.sandbox import Sandbox

# The file, in the candidate's work folder, that says "ok" (compiled) or "failed".
MARKER = "baselines-compiled"
# The longest the candidate's child waits for the second child before compiling the baselines.
MAX_WAIT_S = 120.0
# How often `Beside.stop` kills the compiling child again while its thread has not ended.
STOP_POLL_S = 0.1
# Past this (a KernelBench problem's inputs of gigabytes), both children would hold the timed shape's
# inputs on the GPU at once, beside other verifications': the candidate's child compiles them itself.
MAX_INPUT_BYTES = 256 * 2**20
# The job's keys the compiling child needs (the rest concern the candidate).
SHARED_KEYS = (
    "op",
    "device",
    "param_specs",
    "threads",
    "family_modules",
    "open_target",
    "bench_shapes",
    "bench_dtype",
    "cached_baselines",
    "timing_lock",
)


def needed(job: dict[str, Any]) -> bool:
    """Whether the job's benchmark would compile a torch.compile baseline, of inputs small enough to
    sit in GPU memory twice at once."""
    cached = job.get("cached_baselines") or {}
    return (
        bool(job.get("benchmark"))
        and any(bench.uncompiled_modes(cached.get(shape_key(shape))) for shape in job["bench_shapes"])
        and _largest_input_bytes(job) <= MAX_INPUT_BYTES
    )


def _largest_input_bytes(job: dict[str, Any]) -> int:
    """The largest timed shape's first input, in bytes of the timed dtype."""
    itemsize = case_plan.dtype_of(job["bench_dtype"]).itemsize
    return max((math.prod(int(d) for d in shape) * itemsize for shape in job["bench_shapes"]), default=0)


class Beside:
    """A compiling child and the thread that watches it. The child writes "ok" to the marker once it
    has compiled; where it could not (it failed, or was killed), the thread writes "failed"."""

    def __init__(self, sandbox: Sandbox, job: dict[str, Any], marker: Path) -> None:
        self.sandbox = sandbox
        self.marker = marker
        self.outcome: Any = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(job,), name="precompile-beside", daemon=True)
        self._thread.start()

    def _run(self, job: dict[str, Any]) -> None:
        compiled = False
        try:
            if not self._stopping.is_set():  # stopped before it started: nothing to run
                self.outcome = self.sandbox.run(job)
                results = self.outcome.results or {}
                compiled = results.get("stage") == "done" and not results.get("harness_error")
                if compiled and self.sandbox.device == "cuda":  # no candidate code ran there: trusted
                    compiler_cache.promote(self.sandbox.workdir, state_dir())
        except Exception:  # noqa: BLE001, S110 - a head start only: the candidate's child compiles instead
            pass
        finally:
            self.sandbox.close()
            # The child says "ok" itself as soon as it has compiled; this is the word otherwise.
            with contextlib.suppress(OSError):  # the verification may be over, its folder gone
                if not self.marker.exists():
                    write_whole(self.marker, "ok" if compiled else "failed")

    @property
    def running(self) -> bool:
        """Its thread has not ended: the child starts, compiles, or is being collected."""
        return self._thread.is_alive()

    def timings(self) -> dict[str, float]:
        """`beside_child_start` (the job waiting for the compiling child) and `beside_precompile` (its
        compile), where it got that far."""
        outcome = self.outcome
        if outcome is None or not outcome.results:
            return {}
        values = {
            "beside_child_start": outcome.start_wait_seconds,
            "beside_precompile": (outcome.results.get("timings") or {}).get("precompile"),
        }
        return {name: round(float(v), 3) for name, v in values.items() if isinstance(v, (int, float))}

    def stop(self, timeout: float = 10.0) -> None:
        """End the compiling child if it still runs (the verification is over), and its thread. Killed
        again until the thread ends: the child may be starting (no process to kill yet) at first."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                self.sandbox.kill()
            self._thread.join(STOP_POLL_S)


def start(job: dict[str, Any], candidate_folder: Path, sandbox: Sandbox) -> Beside:
    """Hand `sandbox` the baselines' compile of `job` and tell `job` where its child hears of it
    (`job["precompile_beside"]`, read by the child before its timing turn)."""
    marker = candidate_folder / MARKER
    job["precompile_beside"] = {"marker": str(marker), "max_wait_s": MAX_WAIT_S}
    compile_job = {key: job.get(key) for key in SHARED_KEYS}
    compile_job["precompile_only"] = True
    compile_job["marker"] = str(marker)
    return Beside(sandbox, compile_job, marker)
