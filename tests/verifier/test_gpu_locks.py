"""The GPU's three locks (gpuyantra/verifier/gpu_locks.py): the served-speed check goes before queued
verifications, timing waits for GPU work under way and lets none start, bounded waits say what they
held. Plain files: each holder is a thread with its own open file descriptions (flock locks belong
to those), or a process. Tests assert the order things happen in, never how long they take."""

from __future__ import annotations

import contextlib
import fcntl
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuyantra.verifier import child, gpu_locks
from gpuyantra.verifier.child import JOB_PARTS, PHASE_PARTS, SETUP_PARTS
from gpuyantra.verifier.core import SANDBOX_PARTS
from gpuyantra.verifier.gpu_locks import (
    MEMORY_FILE,
    ORDER,
    GpuLocks,
    hold_lock,
    problem_memory,
    share_gpu,
    share_gpu_through_exit,
    time_alone,
    wait_for_idle,
    warming_up,
)
from tests.verifier.conftest import can_take

LIMIT_S = 30.0  # a bound on every wait here, so a broken lock fails the test instead of hanging it


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


class Holder(threading.Thread):
    """Enters `enter()` (a lock holder), notes its name in `order` once inside, stays until released."""

    def __init__(self, name: str, enter: Callable[[], AbstractContextManager[Any]], order: list[str]) -> None:
        super().__init__(name=name, daemon=True)
        self.enter, self.order = enter, order
        self.inside, self.release = threading.Event(), threading.Event()
        self.got: Any = None

    def run(self) -> None:
        with self.enter() as got:
            self.got = got
            self.order.append(self.name)
            self.inside.set()
            self.release.wait(LIMIT_S)


def let_through(holders: list[Holder]) -> None:
    """Release each holder as it gets in, until all have been in and left."""
    deadline = time.monotonic() + LIMIT_S
    while any(h.is_alive() for h in holders):
        assert time.monotonic() < deadline, [h.name for h in holders if h.is_alive()]
        for h in holders:
            if h.inside.is_set():
                h.release.set()
        time.sleep(0.005)


@pytest.fixture
def locks(tmp_path) -> GpuLocks:
    return GpuLocks.beside(tmp_path / "gpu-timing.lock")


@pytest.fixture
def polled(monkeypatch) -> set[str]:
    """The names of the threads that polled (tried a lock, let go of everything, and wait to retry)."""
    names: set[str] = set()

    def pause() -> None:
        names.add(threading.current_thread().name)
        time.sleep(0.01)

    monkeypatch.setattr(gpu_locks, "_pause", pause)
    return names


@pytest.fixture
def holders():
    started: list[Holder] = []
    yield started
    for h in started:  # a failed test leaves none behind
        h.release.set()
    for h in started:
        h.join(LIMIT_S)


def start(holders: list[Holder], *new: Holder) -> None:
    for h in new:
        holders.append(h)
        h.start()


def test_a_served_check_gets_the_gpu_before_verifications_already_waiting(locks, polled, holders):
    order: list[str] = []
    timer = Holder("timing", lambda: time_alone(locks.timing), order)
    start(holders, timer)
    until(timer.inside.is_set, "the first verification times")
    # Three verifications wait to time, one to check correctness: flock would hand T to any of them.
    waiting = [Holder(f"child {i}", lambda: time_alone(locks.timing), order) for i in range(3)]
    waiting.append(Holder("correctness", lambda: share_gpu(locks.timing), order))
    start(holders, *waiting)
    until(lambda: {h.name for h in waiting} <= polled, "every waiting verification polls")
    served = Holder("served", lambda: hold_lock(locks.timing, wait_s=LIMIT_S), order)
    start(holders, served)
    until(lambda: not can_take(locks.turn, fcntl.LOCK_SH), "the served check holds the turnstile")
    timer.release.set()
    until(served.inside.is_set, "the served check measures")
    assert order == ["timing", "served"]
    assert served.got["held"] is True and served.got["locks"] == {"turn": True, "timing": True, "quiet": True}
    assert not can_take(locks.quiet, fcntl.LOCK_SH)  # no correctness phase runs while it measures
    served.release.set()
    let_through(waiting)
    assert order[:2] == ["timing", "served"] and sorted(order[2:]) == sorted(h.name for h in waiting)


def test_timing_waits_for_gpu_work_under_way_and_lets_none_start(locks, polled, holders):
    order: list[str] = []
    first = Holder("correctness", lambda: share_gpu(locks.timing), order)
    start(holders, first)
    until(first.inside.is_set, "a verification checks correctness")
    timer = Holder("timing", lambda: time_alone(locks.timing), order)
    start(holders, timer)
    until(lambda: not can_take(locks.timing, fcntl.LOCK_SH), "the timer holds T and waits for Q")
    late = Holder("late correctness", lambda: share_gpu(locks.timing), order)
    start(holders, late)
    until(lambda: "late correctness" in polled, "the late one waits")
    assert order == ["correctness"]  # shared flock alone would have let the late one in
    first.release.set()
    until(timer.inside.is_set, "the timer has the GPU alone")
    assert order == ["correctness", "timing"]
    assert not can_take(locks.quiet, fcntl.LOCK_SH)
    assert set(timer.got) == {"timing", "quiet", "last_timed_at"}  # the seconds waited for each, the stamp
    timer.release.set()
    let_through([late])
    assert order == ["correctness", "timing", "late correctness"]


def test_a_problem_alone_on_the_gpus_memory_waits_for_those_running_and_lets_none_start(locks, polled, holders):
    order: list[str] = []
    running = [Holder(f"problem {i}", lambda: problem_memory(locks.timing), order) for i in range(2)]
    start(holders, *running)
    until(lambda: all(h.inside.is_set() for h in running), "two problems share the GPU's memory")
    alone = Holder("alone", lambda: problem_memory(locks.timing, alone=True), order)
    start(holders, alone)
    memory = locks.timing.with_name(MEMORY_FILE)
    until(lambda: not can_take(memory.with_name("gpu-memory-turn.lock"), fcntl.LOCK_SH), "it waits at the turnstile")
    late = Holder("late", lambda: problem_memory(locks.timing), order)
    start(holders, late)
    time.sleep(0.2)  # a new problem blocks at the turnstile the waiting one holds: it does not get in
    assert not late.inside.is_set()
    running[0].release.set()
    running[1].release.set()
    until(alone.inside.is_set, "the retried problem has the memory alone")
    assert sorted(order[:2]) == ["problem 0", "problem 1"] and order[2] == "alone"
    assert not can_take(memory, fcntl.LOCK_SH)
    alone.release.set()
    let_through([late])
    assert order[3:] == ["late"]
    # The GPU's time locks are untouched by it.
    assert can_take(locks.timing, fcntl.LOCK_EX) and can_take(locks.quiet, fcntl.LOCK_EX)


def test_readers_share_the_gpu_with_each_other(locks, holders):
    order: list[str] = []
    readers = [Holder(f"correctness {i}", lambda: share_gpu(locks.timing), order) for i in range(3)]
    start(holders, *readers)
    until(lambda: all(h.inside.is_set() for h in readers), "all three inside at once")
    assert not can_take(locks.quiet, fcntl.LOCK_EX) and can_take(locks.timing, fcntl.LOCK_EX)
    let_through(readers)


def test_a_bounded_wait_gives_up_and_says_what_it_held(locks, holders):
    timer = Holder("timing", lambda: time_alone(locks.timing), [])
    start(holders, timer)
    until(timer.inside.is_set, "a verification times")
    with hold_lock(locks.timing, wait_s=0.05) as lock:
        assert lock["held"] is False and lock["waited_s"] >= 0.05
        assert lock["locks"] == {"turn": True, "timing": False, "quiet": False}
        assert not can_take(locks.turn, fcntl.LOCK_SH)  # what it got still keeps newcomers out
    assert can_take(locks.turn, fcntl.LOCK_EX)  # and is let go afterwards
    timer.release.set()
    timer.join(LIMIT_S)
    with hold_lock(locks.timing, wait_s=0.05) as lock:
        assert lock["held"] is True and lock["locks"] == dict.fromkeys(ORDER, True)


# A process holding the GPU shared, as a verifier child checking correctness does (the module is
# loaded from its file: the package's import would pull in torch).
READER = """
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("gpu_locks", sys.argv[1])
gpu_locks = importlib.util.module_from_spec(spec)
sys.modules["gpu_locks"] = gpu_locks
spec.loader.exec_module(gpu_locks)
with gpu_locks.share_gpu(Path(sys.argv[2])):
    print("inside", flush=True)
    sys.stdin.read()
"""


def test_a_served_check_waits_for_a_correctness_phase_in_another_process(locks):
    proc = subprocess.Popen(
        [sys.executable, "-c", READER, gpu_locks.__file__, str(locks.timing)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "inside"
        with hold_lock(locks.timing, wait_s=0.05) as lock:
            assert lock["held"] is False and lock["locks"] == {"turn": True, "timing": True, "quiet": False}
    finally:
        proc.communicate("", timeout=LIMIT_S)  # stdin closed: it lets go and exits
    with hold_lock(locks.timing, wait_s=LIMIT_S) as lock:
        assert lock["held"] is True


def test_every_holder_takes_the_locks_in_the_documented_order(locks, monkeypatch):
    # P, T, Q, always: a waiter never holds a later lock while it waits for an earlier one.
    doc = gpu_locks.__doc__ or ""
    assert ORDER == ("turn", "timing", "quiet") and "P, T, Q" in doc and "deadlock" in doc
    assert all(f"gpu-{name}.lock" in doc for name in ORDER)
    names: dict[int, str] = {}
    taken: list[str] = []
    original_open, original_lock = gpu_locks._open, gpu_locks._lock

    def watched_open(stack: Any, path: Path) -> int:
        fd = original_open(stack, path)
        names[fd] = next(name for name in ORDER if getattr(locks, name) == path)
        return fd

    def watched_lock(fd: int, operation: int) -> None:
        original_lock(fd, operation)
        if not operation & fcntl.LOCK_UN:
            taken.append(names[fd])

    monkeypatch.setattr(gpu_locks, "_open", watched_open)
    monkeypatch.setattr(gpu_locks, "_lock", watched_lock)
    taken.clear()
    with hold_lock(locks.timing, wait_s=1.0):
        assert taken == list(ORDER)
    taken.clear()
    with time_alone(locks.timing):
        assert taken == list(ORDER)
    taken.clear()
    with share_gpu(locks.timing):
        assert taken == list(ORDER)


class _Sink:
    def __init__(self, seen: list[tuple[str, bool, bool]], locks: GpuLocks) -> None:
        self.seen, self.locks = seen, locks

    def drain(self) -> None:
        self.seen.append(("drain", *gpu_state(self.locks)))


def gpu_state(locks: GpuLocks) -> tuple[bool, bool]:
    """(another verification could check correctness now, another could time now)."""
    return can_take(locks.quiet, fcntl.LOCK_SH), can_take(locks.quiet, fcntl.LOCK_EX)


def _run_child(monkeypatch, locks: GpuLocks, device: str) -> tuple[list[tuple[str, bool, bool]], dict[str, Any]]:
    """`child.execute` on a fake candidate: what the GPU's locks allowed others during each phase."""
    import gpuyantra.verifier.bench as bench

    seen: list[tuple[str, bool, bool]] = []
    cases = [SimpleNamespace(phase="main"), SimpleNamespace(phase="recheck")]
    ctx = {"device": device, "cases": cases, "counter": child._Counter(), "family": None, "entry": None}
    ctx["param_specs"] = []
    monkeypatch.setattr(child, "_setup", lambda job, results: ctx)

    def run_cases(chosen: list, ctx: dict, results: dict, sink: Any, part: str = "correctness") -> bool:
        seen.append((chosen[0].phase, *gpu_state(locks)))
        return True

    def bench_shape(*args: Any) -> dict[str, Any]:
        seen.append(("bench", *gpu_state(locks)))
        return {"kernel_us": 1.0}

    def precompile_baselines(*args: Any) -> None:
        seen.append(("precompile", *gpu_state(locks)))

    monkeypatch.setattr(child, "run_cases", run_cases)
    monkeypatch.setattr(bench, "bench_shape", bench_shape)
    monkeypatch.setattr(bench, "precompile_baselines", precompile_baselines)
    job = {"benchmark": True, "timing_lock": str(locks.timing), "bench_shapes": [[4, 8]], "bench_dtype": "float32"}
    job["param_specs"] = []
    results: dict[str, Any] = {"timings": {}, "bench": []}
    child.execute(job, results, _Sink(seen, locks))  # type: ignore[arg-type]
    assert results["stage"] == "done"
    return seen, results["timings"]


def test_a_cuda_child_checks_correctness_sharing_the_gpu_and_times_alone(locks, monkeypatch):
    seen, timings = _run_child(monkeypatch, locks, "cuda")
    shared, alone = (True, False), (False, False)  # others may share the GPU, but not time
    assert seen == [
        ("main", *shared),
        ("drain", *shared),  # the parent judges the outputs on the GPU meanwhile
        ("precompile", True, True),  # compiling the baselines (one call each): others may even time
        ("bench", *alone),
        ("recheck", *alone),  # in the same turn: the GPU is still its alone
        ("drain", *alone),  # the parent judges the recheck's outputs meanwhile
    ]
    assert all(can_take(getattr(locks, name), fcntl.LOCK_EX) for name in ORDER)  # all let go
    waits = {
        "correctness_lock_wait",
        "timing_lock_wait",
        "quiet_lock_wait",
    }
    assert waits <= set(timings) <= {*JOB_PARTS, *SETUP_PARTS, *PHASE_PARTS, "setup_other"}  # every wait has its name
    assert {f"child_{part}" for part in JOB_PARTS} <= set(SANDBOX_PARTS)


def test_a_cpu_child_takes_no_gpu_lock(locks, monkeypatch):
    opened: list[Path] = []
    monkeypatch.setattr(gpu_locks, "_open", lambda stack, path: opened.append(path))
    seen, timings = _run_child(monkeypatch, locks, "cpu")
    assert [phase for phase, *_ in seen] == ["main"]  # no timing, no recheck on CPU
    assert opened == []
    assert not any(key.endswith("lock_wait") for key in timings)


def test_kernelbench_times_model_against_model_new_alone_and_checks_it_sharing(locks, monkeypatch, holders):
    """`gpuyantra kernelbench` on CUDA: Model against ModelNew is timed under the same locks as a
    verdict (other shards' float64 checks had doubled Model's own time), its GPU checks share."""
    from gpuyantra.kernelbench import runner
    from gpuyantra.verifier import baselines

    monkeypatch.setattr(baselines, "timing_lock", lambda: locks.timing)
    order: list[str] = []
    checking = Holder("check ModelNew", lambda: runner.on_gpu("cuda", timing=False), order)
    start(holders, checking)
    until(checking.inside.is_set, "one shard checks its ModelNew")
    with runner.on_gpu("cuda", timing=False):  # another shard's check shares the GPU with it
        assert not can_take(locks.quiet, fcntl.LOCK_EX)
    timer = Holder("time Model, ModelNew", lambda: runner.on_gpu("cuda", timing=True), order)
    start(holders, timer)
    until(lambda: not can_take(locks.timing, fcntl.LOCK_SH), "the timer holds T and waits for Q")
    assert order == ["check ModelNew"]
    checking.release.set()
    until(timer.inside.is_set, "the timer has the GPU alone")
    assert not can_take(locks.quiet, fcntl.LOCK_SH)
    timer.release.set()
    timer.join(LIMIT_S)
    with runner.on_gpu("cpu", timing=True):  # no GPU: no lock at all
        assert can_take(locks.timing, fcntl.LOCK_EX) and can_take(locks.quiet, fcntl.LOCK_EX)


def test_a_timer_learns_when_the_previous_timing_ended_and_skips_the_spin_up_after_it(locks):
    # The timing lock file carries the end of the last timing from one holder (often another
    # process) to the next; a timer that follows within IDLE_BEFORE_SPIN_UP_S needs no spin-up.
    from gpuyantra.verifier import bench

    with time_alone(locks.timing) as first:
        assert first["last_timed_at"] == 0.0  # nothing was timed on this GPU yet
    ended = time.time()
    with time_alone(locks.timing) as second:
        assert 0.0 < ended - second["last_timed_at"] < LIMIT_S
    bench._last_busy = 0.0  # this process never timed anything
    bench.note_timed_elsewhere(time.time() - 2 * bench.IDLE_BEFORE_SPIN_UP_S)
    assert bench.needs_spin_up()  # the GPU idled since: clocks may have dropped
    bench.note_timed_elsewhere(second["last_timed_at"] + (time.time() - ended))  # as if it just ended
    assert not bench.needs_spin_up()
    locks.timing.write_text("not a stamp")
    with time_alone(locks.timing) as third:
        assert third["last_timed_at"] == 0.0


def test_a_spare_waits_for_a_gap_in_others_gpu_work_before_its_warm_up(locks, holders):
    assert wait_for_idle(locks.timing, idle_s=0.05, max_wait_s=LIMIT_S) < LIMIT_S  # idle: no wait past the gap
    reader = Holder("correctness", lambda: share_gpu(locks.timing), [])
    start(holders, reader)
    until(reader.inside.is_set, "a verification checks correctness")
    done: list[float] = []
    spare = threading.Thread(target=lambda: done.append(wait_for_idle(locks.timing, 0.05, LIMIT_S)), daemon=True)
    spare.start()
    time.sleep(0.3)
    assert not done  # still waiting: the GPU is in use
    reader.release.set()
    spare.join(LIMIT_S)
    assert done and 0.3 <= done[0] < LIMIT_S
    assert can_take(locks.quiet, fcntl.LOCK_EX)  # the probes hold nothing afterwards


def test_a_spare_stops_waiting_for_a_gap_after_its_longest_wait(locks, holders):
    timer = Holder("timing", lambda: time_alone(locks.timing), [])
    start(holders, timer)
    until(timer.inside.is_set, "a verification times")
    assert 0.2 <= wait_for_idle(locks.timing, idle_s=0.05, max_wait_s=0.2) < LIMIT_S


def test_a_spare_stops_waiting_for_a_gap_when_its_job_comes(locks, holders):
    reader = Holder("correctness", lambda: share_gpu(locks.timing), [])
    start(holders, reader)
    until(reader.inside.is_set, "a verification checks correctness")
    asked = [0]

    def job_came() -> bool:
        asked[0] += 1
        return asked[0] >= 3

    assert wait_for_idle(locks.timing, idle_s=0.05, max_wait_s=LIMIT_S, needed=job_came) < LIMIT_S
    assert asked[0] == 3


def test_a_spare_in_its_warm_up_turn_waits_for_others_work_not_for_the_turn_it_holds(locks, holders):
    with warming_up(locks.timing) as queued:
        assert queued < LIMIT_S
        assert wait_for_idle(locks.timing, idle_s=0.05, max_wait_s=LIMIT_S) < 1.0  # idle: its own turn is no work
        reader = Holder("correctness", lambda: share_gpu(locks.timing), [])
        start(holders, reader)
        until(reader.inside.is_set, "a verification checks correctness")
        assert wait_for_idle(locks.timing, idle_s=0.05, max_wait_s=0.2) >= 0.2  # others' work: waits it out


def test_spares_create_their_contexts_one_at_a_time_unless_their_job_has_come(locks, holders):
    first = Holder("first spare", lambda: warming_up(locks.timing), [])
    start(holders, first)
    until(first.inside.is_set, "a spare warms up")
    second = Holder("second spare", lambda: warming_up(locks.timing), [])
    start(holders, second)
    time.sleep(0.2)
    assert not second.inside.is_set()  # queued behind the first one's context
    came = threading.Event()
    third = Holder("spare with a job", lambda: warming_up(locks.timing, needed=came.is_set), [])
    start(holders, third)
    time.sleep(0.1)
    assert not third.inside.is_set()
    came.set()  # its job arrived: it warms up at once, beside the first
    until(third.inside.is_set, "the spare whose job came warms up")
    assert not second.inside.is_set()
    first.release.set()
    until(second.inside.is_set, "the queued spare warms up after the first")
    assert second.got >= 0.2  # the seconds it queued
    second.release.set()
    third.release.set()


# A verifier child leaving: `share_gpu_through_exit`, then it stays until the test lets it end (the
# module is loaded from its file, as READER's).
LEAVER = """
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("gpu_locks", sys.argv[1])
gpu_locks = importlib.util.module_from_spec(spec)
sys.modules["gpu_locks"] = gpu_locks
spec.loader.exec_module(gpu_locks)
print("leaving", flush=True)
print(gpu_locks.share_gpu_through_exit(Path(sys.argv[2]), defer_s=float(sys.argv[3])), flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _leaving(locks: GpuLocks, defer_s: float) -> Iterator[subprocess.Popen]:
    """A child on its way out; it ends when the block does (killed if the block failed first)."""
    argv = [sys.executable, "-c", LEAVER, gpu_locks.__file__, str(locks.timing), str(defer_s)]
    leaver = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert leaver.stdout is not None and leaver.stdout.readline() == "leaving\n"
        yield leaver
        leaver.communicate("", timeout=LIMIT_S)
    finally:
        if leaver.poll() is None:
            leaver.kill()
            leaver.wait()


def _waited(leaver: subprocess.Popen) -> float:
    assert leaver.stdout is not None
    return float(leaver.stdout.readline())


def _lock_descriptors(pid: int, path: Path) -> list[int]:
    fds = Path(f"/proc/{pid}/fd")
    return [int(fd.name) for fd in fds.iterdir() if fd.is_symlink() and Path(fd.readlink()) == path]


def test_a_leaving_child_holds_the_gpu_shared_until_it_is_gone_after_any_pending_timer(locks, holders):
    # Its CUDA context is torn down as the process ends: that must not overlap anyone's timing.
    timer = Holder("timing", lambda: time_alone(locks.timing), [])
    start(holders, timer)
    until(timer.inside.is_set, "a verification times")
    with _leaving(locks, defer_s=0.05) as leaver:
        assert not select.select([leaver.stdout], [], [], 0.3)[0]  # still waiting: a timing runs
        timer.release.set()
        timer.join(LIMIT_S)
        assert _waited(leaver) >= 0.3
        (fd,) = _lock_descriptors(leaver.pid, locks.quiet)
        assert fd == max(int(p.name) for p in Path(f"/proc/{leaver.pid}/fd").iterdir())  # closed last
        assert not can_take(locks.quiet, fcntl.LOCK_EX)  # the next timer waits for it
    assert can_take(locks.quiet, fcntl.LOCK_EX)  # released with the process


def test_a_leaving_child_waits_for_a_quiet_gpu_first_then_shares_it(locks, holders):
    # Between two timers' turns its teardown would delay the next one: it first waits for the end of
    # all GPU work (here a correctness phase it could share), up to its deferral.
    reader = Holder("correctness", lambda: share_gpu(locks.timing), [])
    start(holders, reader)
    until(reader.inside.is_set, "a verification checks correctness")
    with _leaving(locks, defer_s=LIMIT_S) as leaver:
        assert not select.select([leaver.stdout], [], [], 0.3)[0]  # waits for the quiet GPU
        reader.release.set()
        assert _waited(leaver) >= 0.3
    reader = Holder("correctness again", lambda: share_gpu(locks.timing), [])
    start(holders, reader)
    until(reader.inside.is_set, "a verification checks correctness")
    with _leaving(locks, defer_s=0.2) as leaver:  # deferral over: it shares the GPU with the correctness phase
        assert 0.2 <= _waited(leaver) < LIMIT_S
    reader.release.set()


def test_a_leaving_child_leaves_without_the_lock_after_its_longest_wait(locks, holders):
    timer = Holder("timing", lambda: time_alone(locks.timing), [])
    start(holders, timer)
    until(timer.inside.is_set, "a verification times")
    assert 0.2 <= share_gpu_through_exit(locks.timing, max_wait_s=0.2) < LIMIT_S  # in this process: not held
    timer.release.set()
    timer.join(LIMIT_S)
    assert can_take(locks.quiet, fcntl.LOCK_EX)  # nothing of it held in this process
