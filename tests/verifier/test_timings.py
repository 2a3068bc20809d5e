"""Where a verdict's time goes: every second of `sandbox` and of the child's setup has a name in
`verdict.timings`, so a slow verification on a GPU shows its cause instead of a gap."""

from __future__ import annotations

import time

import pytest
import torch

from gpuyantra.verifier import baselines, bench, run_verification
from gpuyantra.verifier import sandbox as sandbox_module
from gpuyantra.verifier.child import JOB_PARTS, SETUP_PARTS
from gpuyantra.verifier.core import SANDBOX_PARTS
from gpuyantra.verifier.sandbox import scrubbed_env
from tests.verifier.conftest import candidate_path

QUICK = {"seeds": (0,), "dtypes": ["float32"]}
# Job sent, reader thread started and stopped, clocks of two processes: what may stay unnamed.
UNNAMED_SECONDS = 0.25


def _assert_sandbox_is_named(timings: dict[str, float]) -> None:
    for part in ("sandbox_child_start", "child_setup", "child_correctness", "child_save_outputs"):
        assert part in timings, part
    assert len({"child_exit", "child_results_seen"} & set(timings)) == 1, timings  # the child's end, one way
    named = sum(timings.get(part, 0.0) for part in SANDBOX_PARTS)
    assert timings["sandbox_other"] == pytest.approx(timings["sandbox"] - named, abs=0.002)
    assert abs(timings["sandbox_other"]) <= UNNAMED_SECONDS, timings
    setup = sum(timings.get(f"child_{part}", 0.0) for part in SETUP_PARTS) + timings["child_setup_other"]
    assert setup == pytest.approx(timings["child_setup"], abs=0.005)
    assert timings["child_setup_other"] <= 0.1 and timings["child_other"] <= 0.1, timings
    # Every top-level part of the child's job is one of the sandbox's parts.
    assert {f"child_{part}" for part in JOB_PARTS} <= set(SANDBOX_PARTS)
    # The correctness phase's own parts lie inside its wall time (the CPU too: one thread's calls).
    inside = sum(timings.get(f"child_correctness_{part}", 0.0) for part in ("inputs", "calls", "sync"))
    assert 0 < inside <= timings["child_correctness"] + 0.005, timings
    assert 0 < timings["child_correctness_cpu"], timings


def test_every_second_of_the_sandbox_is_named(state):
    verdict = run_verification(candidate_path("honest_rowwise"), device="cpu", **QUICK)
    assert verdict.accepted
    _assert_sandbox_is_named(verdict.timings)
    # Outputs were read and judged beside the child; the child's exit skips the interpreter's teardown.
    assert {"load_outputs", "judge_outputs", "child_warm_imports"} <= set(verdict.timings)
    # The judging's own CPU time is part of its wall time; every chunk's comparisons were settled.
    assert 0 < verdict.timings["judge_outputs_cpu"] <= verdict.timings["judge_outputs"] + 0.01, verdict.timings
    assert 0 < verdict.timings["load_outputs_cpu"] <= verdict.timings["load_outputs"] + 0.01, verdict.timings
    assert verdict.timings["judge_settles"] >= 1 and verdict.timings["judge_outputs_device_wait"] == 0
    # The verifying thread's own CPU: some (the static layer parses), never more than its wall time.
    assert 0 < verdict.timings["parent_cpu"] <= verdict.seconds + 0.01, verdict.timings


def test_a_warm_spare_is_ready_before_the_next_job(state):
    first = run_verification(candidate_path("honest_rowwise"), device="cpu", keep_warm=True, **QUICK)
    second = run_verification(candidate_path("honest_rowwise"), device="cpu", keep_warm=True, **QUICK)
    assert first.accepted and second.accepted
    _assert_sandbox_is_named(second.timings)
    # Started while the first verification ran: its imports were done before the second one's job.
    assert second.timings["sandbox_child_start"] <= 0.1, second.timings


def test_the_next_spare_starts_while_this_verification_runs(state, monkeypatch):
    running: list[list[bool]] = []
    original = sandbox_module.Sandbox.run

    def run(self, job, consume=None):
        running.append(
            [s.proc is not None and s.proc.poll() is None for p in sandbox_module._SPARES.values() for s in p]
        )
        return original(self, job, consume)

    monkeypatch.setattr(sandbox_module.Sandbox, "run", run)
    verdict = run_verification(candidate_path("honest_rowwise"), device="cpu", keep_warm=True, **QUICK)
    assert verdict.accepted and running == [[True]]
    assert [len(pool) for pool in sandbox_module._SPARES.values()] == [1]  # and no second one afterwards


def test_cuda_children_compile_baselines_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path))
    # A pool of compile workers took seconds to shut down at the child's exit.
    assert scrubbed_env("cuda", tmp_path, threads=2)["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in scrubbed_env("cpu", tmp_path, threads=2)


def test_a_cuda_spare_warms_its_gpu_under_the_timing_lock(state, monkeypatch):
    # A spare starts while this verification may be timing: its CUDA context must wait for the lock.
    locks: list[str | None] = []
    monkeypatch.setattr(sandbox_module.Sandbox, "start", lambda self, gpu_lock=None: locks.append(gpu_lock))
    sandbox_module.keep_spare("cuda")
    sandbox_module.keep_spare("cpu")
    assert locks == [str(baselines.timing_lock()), None]


class _HostEvent:
    """torch.cuda.Event on the host clock: time_cuda's control flow without a GPU."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = 0.0

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.at - self.at) * 1e3


def test_timing_spins_the_gpu_up_only_after_it_idled(monkeypatch):
    # Interleaved rounds time the candidate and eager back to back: a 100 ms spin-up before each
    # measurement only mattered where the GPU had idled (after compilation, at the start).
    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "_last_busy", 0.0)
    monkeypatch.setattr(bench, "queue_ahead", lambda us: None)
    spins: list[int] = []
    monkeypatch.setattr(bench, "spin_up", lambda flush: spins.append(1))
    flush = torch.empty(16)
    bench.time_cuda(lambda i: None, flush)  # nothing timed before in this process
    bench.time_cuda(lambda i: None, flush)  # right after the first: still busy
    assert spins == [1]
    time.sleep(2 * bench.IDLE_BEFORE_SPIN_UP_S)
    bench.time_cuda(lambda i: None, flush)
    assert spins == [1, 1]


def test_each_timed_call_is_queued_behind_gpu_work_longer_than_its_launch(monkeypatch):
    # Device time: a call whose Python takes longer to issue than the flush keeps the GPU busy was
    # timed as its launcher. Before each timed call the GPU is kept busy for twice the issue time.
    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "spin_up", lambda flush: None)
    order: list[tuple[str, float]] = []
    monkeypatch.setattr(bench, "queue_ahead", lambda us: order.append(("ahead", us)))

    def slow_launcher(i: int) -> None:
        time.sleep(0.002)  # 2 ms of host work per call
        order.append(("call", 0.0))

    bench.time_cuda(slow_launcher, torch.empty(16))
    aheads = [us for kind, us in order if kind == "ahead"]
    assert len(aheads) >= bench.MIN_REPS
    assert all(us >= bench.AHEAD_FACTOR * 2000 for us in aheads), aheads[:3]
    # Every timed call follows its own queue-ahead: no timed call is issued to an idle GPU.
    timed = order[order.index(("ahead", aheads[0])) :]
    assert timed[::2] == [("ahead", aheads[0])] * len(aheads)
    assert all(kind == "call" for kind, _ in timed[1::2])


def test_queue_ahead_is_bounded(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "spin_up", lambda flush: None)
    aheads: list[float] = []
    monkeypatch.setattr(bench, "queue_ahead", aheads.append)
    monkeypatch.setattr(bench, "launch_us", lambda fn: 1e7)  # a call that blocks for 10 s on the host
    monkeypatch.setattr(bench, "flush_us", lambda flush: 0.0)
    bench.time_cuda(lambda i: None, torch.empty(16))
    assert aheads and max(aheads) == bench.MAX_AHEAD_US


@pytest.mark.parametrize(("flush_us", "spun"), [(50.0, 30.0), (80.0, None), (500.0, None)])
def test_the_flush_counts_toward_keeping_the_gpu_busy(monkeypatch, flush_us, spun):
    # The L2 flush issued before each timed call is GPU work of its own: only what the call's issue
    # needs beyond the flush's device time is spun (2 x 30 us + 20 us = 80 us needed here).
    monkeypatch.setattr(torch.cuda, "Event", _HostEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "spin_up", lambda flush: None)
    aheads: list[float] = []
    monkeypatch.setattr(bench, "queue_ahead", aheads.append)
    monkeypatch.setattr(bench, "launch_us", lambda fn: 30.0)
    monkeypatch.setattr(bench, "flush_us", lambda flush: flush_us)
    bench.time_cuda(lambda i: None, torch.empty(16))
    if spun is None:
        assert aheads == []
    else:
        assert aheads and all(us == pytest.approx(spun) for us in aheads)


def test_the_flush_time_is_its_fastest_run_measured_once_per_size(monkeypatch):
    clock_ms = [0]  # a fake clock that only the flushes advance: the runs' lengths exact at any load

    class ClockEvent:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = 0

        def record(self) -> None:
            self.at = clock_ms[0]

        def elapsed_time(self, end: ClockEvent) -> float:
            return float(end.at - self.at)

    monkeypatch.setattr(torch.cuda, "Event", ClockEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "_flush_us", {})
    zeroed: list[int] = []

    class Flush:
        def __init__(self, numel: int) -> None:
            self.n = numel

        def numel(self) -> int:
            return self.n

        def element_size(self) -> int:
            return 1

        def zero_(self) -> None:
            zeroed.append(self.n)
            clock_ms[0] += 1 + len(zeroed) % 3  # runs of 2, 3, 1, 2, ... ms

    first = bench.flush_us(Flush(64))  # type: ignore[arg-type]
    assert first == 1000  # the fastest of the runs, in microseconds
    assert bench.flush_us(Flush(64)) == first and zeroed == [64] * bench.FLUSH_SAMPLES  # not measured again
    bench.flush_us(Flush(128))  # type: ignore[arg-type]
    assert zeroed.count(128) == bench.FLUSH_SAMPLES


def test_sandbox_children_yield_the_cpu_to_the_server():
    # The served model's decode loop shares the machine with the verifier's children.
    import os
    import subprocess
    import sys

    from gpuyantra.verifier.child import CHILD_NICENESS

    code = "import os; from gpuyantra.verifier.child import _apply_limits; _apply_limits(0, 0, 0); print(os.nice(0))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert int(out.stdout.strip()) == min(19, os.nice(0) + CHILD_NICENESS)


def test_a_worker_running_several_verifications_keeps_as_many_spares(state, monkeypatch):
    started: list[str | None] = []
    monkeypatch.setattr(sandbox_module.Sandbox, "start", lambda self, gpu_lock=None: started.append(gpu_lock))
    monkeypatch.setattr(sandbox_module, "_alive", lambda sandbox: True)
    monkeypatch.setattr(sandbox_module, "_SPARE_COUNT", 1)
    sandbox_module.set_spare_count(3)
    sandbox_module.keep_spare("cpu")
    assert len(started) == 3
    taken = [sandbox_module.take_sandbox("cpu") for _ in range(2)]
    assert len({id(t) for t in taken}) == 2 and all(t.proc is None for t in taken)  # started by the stub
    sandbox_module.keep_spare("cpu")  # tops the pool up to 3 again
    assert len(started) == 5
    sandbox_module.close_spares()
