"""Who may use the GPU when: three flock files in the verifier's state folder, beside each other.

Several verifications run at once on one GPU, and the campaign's served-speed check measures on it
too. A timing (a verdict's kernel, the copy bandwidth, the served tokens/s) is only worth something
when nothing else runs on the GPU meanwhile, and the served check must not starve behind queued
verifications (flock is not FIFO). Hence:

* P `gpu-turn.lock`, the turnstile. The served check holds it exclusive while it waits for T and Q
  and while it measures. Everyone else takes it shared, and only for an instant, before trying T:
  while a served check is pending nobody new gets T or Q, so it is next once the current holder of
  T lets go.
* T `gpu-timing.lock`, the timing lock: exclusive while anything is timed (as before). Verifier
  children never block on it: they try it without blocking, each time inside an instant of P shared
  (`time_alone`). GPU work that is not timing takes it shared for an instant (`share_gpu`) on its
  way to Q, so a timer holding T stops new readers while it waits for the current ones.
  Each timer writes into the file when its timed work ended (`stamp_timed`): the next one, often
  another process, knows the GPU's clocks are still up and skips its spin-up.
* Q `gpu-quiet.lock`, the GPU quiet lock (readers-writer): shared while a verification runs GPU work
  that is not timing (correctness cases, a CUDA warm-up, the parent judging outputs on the GPU while
  the child waits for it), exclusive after T while anything is timed. So nothing else runs on the GPU
  while anything is timed.

The order is always P, T, Q (`ORDER`), and a lock is released before any lock that precedes it
(`ExitStack`: Q, T, P). No deadlock: nobody waits for an earlier lock while holding a later one, a
reader never waits for anything while it holds P or T (it tries them, lets go and polls), and the
only waits made while holding a lock are for a later one (the served check for T holding P; a timer
for Q holding T). A holder of Q shared waits for nothing of these locks until it lets go.
A verifier child ends holding Q shared (`share_gpu_through_exit`), so its CUDA context's teardown
is GPU work like any other: no timing runs beside it.
`warming_up` (a spare's CUDA warm-up) holds `gpu-warm-up.lock` exclusive, beside the rest, taken by
polling while holding nothing else; inside it `wait_for_idle` only probes Q without blocking, then Q
is taken shared (`share_gpu`) for the context's creation.
`hold_lock`'s wait may be bounded (the served check measures anyway once it runs out, and says so).

Outside these three, for whole jobs that share the GPU's memory rather than its time (KernelBench
problems run by shards side by side, `problem_memory`): M `gpu-memory.lock` shared per job, and
exclusive, through its own turnstile `gpu-memory-turn.lock`, for a job that must run with the
GPU's memory to itself (one that ran out of memory beside the others). M is always taken before
P, T and Q and waited for holding none of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# How often a wait that may not block tries again. Six verifications at once hand the timing lock on
# five times; at 50 ms a poll the GPU idled 25 ms a hand-on on average. A try is one syscall.
POLL_S = 0.005
IDLE_POLL_S = 0.01  # `wait_for_idle`'s probes of Q
TURN_FILE = "gpu-turn.lock"
TIMING_FILE = "gpu-timing.lock"
QUIET_FILE = "gpu-quiet.lock"
MEMORY_FILE = "gpu-memory.lock"
MEMORY_TURN_FILE = "gpu-memory-turn.lock"
WARM_UP_FILE = "gpu-warm-up.lock"  # the spares' warm-up turn, exclusive (`warming_up`)
ORDER = ("turn", "timing", "quiet")  # the only order locks are taken in (P, T, Q)


@dataclass(frozen=True)
class GpuLocks:
    turn: Path
    timing: Path
    quiet: Path

    @classmethod
    def beside(cls, timing: str | Path) -> GpuLocks:
        """The three locks, named by the timing lock's path (what jobs and spares are handed)."""
        path = Path(timing)
        return cls(path.with_name(TURN_FILE), path, path.with_name(QUIET_FILE))


def _open(stack: contextlib.ExitStack, path: Path) -> int:
    """An open file description of its own (flock locks belong to it), closed (unlocked) on exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
    stack.callback(os.close, fd)
    return fd


def _lock(fd: int, operation: int) -> None:
    """Every flock of this module goes through here (tests watch the order)."""
    fcntl.flock(fd, operation)


def _try(fd: int, operation: int) -> bool:
    try:
        _lock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _pause() -> None:
    """One poll's sleep (tests watch who polls)."""
    time.sleep(POLL_S)


def _wait(fd: int, operation: int, deadline: float | None) -> bool:
    """Take the lock, blocking (`deadline` None) or trying until `deadline`; False when it ran out."""
    if deadline is None:
        _lock(fd, operation)
        return True
    while not _try(fd, operation):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(POLL_S, left))
    return True


def _through_turn(turn: int, attempt: Any, deadline: float | None = None) -> bool:
    """Poll `attempt` (non-blocking tries) inside instants of P shared until it succeeds. P shared
    blocks while a served check is pending; nothing else is held while waiting, so it never stalls.
    With a `deadline` (monotonic seconds) P is tried rather than waited for, and False says the
    deadline passed first."""
    while True:
        if deadline is None:
            _lock(turn, fcntl.LOCK_SH)
        if deadline is None or _try(turn, fcntl.LOCK_SH):
            try:
                if attempt():
                    return True
            finally:
                _lock(turn, fcntl.LOCK_UN)
        if deadline is not None and time.monotonic() >= deadline:
            return False
        _pause()


@contextlib.contextmanager
def hold_lock(timing: Path, wait_s: float | None = None) -> Iterator[dict[str, Any]]:
    """The served-speed check: P, T and Q exclusive, in that order, for the block. Waits as long as it
    takes (`wait_s` None) or at most `wait_s` for all three together: the check measures anyway
    rather than stall a campaign. Yields `{"held", "waited_s", "locks"}`: `held` is True when all
    three were taken, `locks` says which ({"turn", "timing", "quiet"}: bool)."""
    locks = GpuLocks.beside(timing)
    with contextlib.ExitStack() as stack:
        started = time.monotonic()
        deadline = None if wait_s is None else started + wait_s
        held = {name: _wait(_open(stack, getattr(locks, name)), fcntl.LOCK_EX, deadline) for name in ORDER}
        yield {"held": all(held.values()), "waited_s": round(time.monotonic() - started, 3), "locks": held}


@contextlib.contextmanager
def time_alone(timing: Path) -> Iterator[dict[str, float]]:
    """A verifier child timing: T exclusive, taken through the turnstile (a pending served check goes
    first), then Q exclusive (waits for the GPU work of others to end and stops new work). Yields
    the seconds waited for each, `{"timing", "quiet"}`, and under `last_timed_at` when the previous
    timing of anyone on this GPU ended (wall-clock seconds, 0.0 for none; `stamp_timed`)."""
    locks = GpuLocks.beside(timing)
    with contextlib.ExitStack() as stack:
        turn, timing_fd, quiet = (_open(stack, getattr(locks, name)) for name in ORDER)
        started = time.monotonic()
        _through_turn(turn, lambda: _try(timing_fd, fcntl.LOCK_EX))
        got_timing = time.monotonic()
        _lock(quiet, fcntl.LOCK_EX)  # readers are no longer let in (they pass T): only current ones end
        waits = {
            "timing": round(got_timing - started, 3),
            "quiet": round(time.monotonic() - got_timing, 3),
            "last_timed_at": last_timed_at(timing_fd),
        }
        try:
            yield waits
        finally:
            stamp_timed(timing_fd)


STAMP_BYTES = 32  # the timing lock file holds when timed work last ended (`stamp_timed`)


def stamp_timed(timing_fd: int) -> None:
    """Write the end of timed work into the timing lock file, still holding T. The next timer, often
    another process, then knows the GPU's clocks are still up and skips its spin-up."""
    os.pwrite(timing_fd, f"{time.time():.6f}".ljust(STAMP_BYTES).encode(), 0)


def last_timed_at(timing_fd: int) -> float:
    """When timed work last ended (`stamp_timed`), in wall-clock seconds; 0.0 for none."""
    try:
        return float(os.pread(timing_fd, STAMP_BYTES, 0).decode() or 0.0)
    except ValueError:  # a file written otherwise: no stamp
        return 0.0


@contextlib.contextmanager
def share_gpu(timing: Path) -> Iterator[float]:
    """GPU work that is not timing: Q shared for the block, taken while holding P and T shared for an
    instant (no new reader while a served check is pending or anything times or waits to). Yields
    the seconds waited."""
    locks = GpuLocks.beside(timing)
    with contextlib.ExitStack() as stack:
        turn, timing_fd, quiet = (_open(stack, getattr(locks, name)) for name in ORDER)

        started = time.monotonic()
        _through_turn(turn, lambda: _enter_shared(timing_fd, quiet))
        yield round(time.monotonic() - started, 3)


def _enter_shared(timing_fd: int, quiet: int) -> bool:
    """Q shared, tried inside an instant of T shared (no new reader while anything times or waits to).
    Fails also where Q is held without T (a served check whose wait for T ran out)."""
    if not _try(timing_fd, fcntl.LOCK_SH):
        return False
    try:
        return _try(quiet, fcntl.LOCK_SH)
    finally:
        _lock(timing_fd, fcntl.LOCK_UN)


EXIT_WAIT_MAX_S = 30.0  # a process leaving waits at most this long for pending timers (then leaves anyway)
EXIT_IDLE_S = 0.02  # a leaving process first waits for a gap this long in all GPU work...
EXIT_DEFER_S = 1.0  # ...for at most this long, then takes the next hand-on between two timers


def share_gpu_through_exit(timing: Path, max_wait_s: float = EXIT_WAIT_MAX_S, defer_s: float = EXIT_DEFER_S) -> float:
    """For a process about to end (a verifier child whose results are written): Q shared, taken as
    `share_gpu` takes it (pending timers first), and held until the process is gone. Its CUDA context
    is torn down as the process ends (0.1 s; 0.2-0.4 s beside five others), and that teardown
    overlapped the next verification's timing turn: its recheck took twice as long, and a verdict of
    six at once read a kernel 1.7 times slower than alone (H200). The lock's descriptor is moved
    above every other one, since a process's descriptors are closed in ascending order when it
    ends: the driver's, and the context with them, go before the lock.

    Taken between two timers' turns it would add its teardown to the next one's wait, so it first
    waits up to `defer_s` for the GPU to go quiet (six at once: the end of the timing turns, where
    the six teardowns run side by side). Waits at most `max_wait_s` in all (then the process ends
    without it); returns the seconds waited. Call it last: nothing of P, T or Q may be held."""
    started = time.monotonic()
    wait_for_idle(timing, EXIT_IDLE_S, min(defer_s, max_wait_s))
    locks = GpuLocks.beside(timing)
    with contextlib.ExitStack() as stack:
        turn, timing_fd = _open(stack, locks.turn), _open(stack, locks.timing)
        quiet = os.open(locks.quiet, os.O_CREAT | os.O_RDWR, 0o666)  # outlives the block when taken
        if _through_turn(turn, lambda: _enter_shared(timing_fd, quiet), deadline=started + max_wait_s):
            _close_last(quiet)
        else:
            os.close(quiet)
    return round(time.monotonic() - started, 3)


def _close_last(fd: int) -> None:
    """Move `fd` to the highest descriptor number this process may have (the lock goes with the open
    file description, so it is held while that copy is open)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = min(soft if soft != resource.RLIM_INFINITY else 65536, 65536) - 1
    if highest > fd:
        with contextlib.suppress(OSError):
            os.dup2(fd, highest, inheritable=False)
            os.close(fd)


def wait_for_idle(timing: Path, idle_s: float, max_wait_s: float, needed: Callable[[], bool] = lambda: False) -> float:
    """Wait, holding nothing of P, T and Q, until nobody has held Q for `idle_s` in a row (no
    correctness, judging, warm-up or timing on the GPU), or `needed()` (its job came), or
    `max_wait_s` passed; returns the seconds waited. For work that can come later and would slow
    whoever it overlaps: spares' CUDA contexts, created while six verifications checked correctness,
    made their correctness 1.1-1.9 s instead of 0.5-0.9 s (H200). A spare waits in its warm-up turn
    (`warming_up`), so other spares' warm-ups are not among what it waits out. A timer's hand-on to
    the next leaves Q free a few milliseconds, far under `idle_s`."""
    locks = GpuLocks.beside(timing)
    with contextlib.ExitStack() as stack:
        quiet = _open(stack, locks.quiet)
        started = time.monotonic()
        idle_since: float | None = None
        while True:
            now = time.monotonic()
            if _try(quiet, fcntl.LOCK_EX):  # a probe: let go at once
                _lock(quiet, fcntl.LOCK_UN)
                idle_since = now if idle_since is None else idle_since
                if now - idle_since >= idle_s:
                    break
            else:
                idle_since = None
            if now - started >= max_wait_s or needed():
                break
            time.sleep(IDLE_POLL_S)
        return round(time.monotonic() - started, 3)


@contextlib.contextmanager
def warming_up(timing: Path, needed: Callable[[], bool] = lambda: False) -> Iterator[float]:
    """A spare's warm-up turn: `gpu-warm-up.lock` exclusive for the block, so spares create their CUDA
    contexts one at a time, each after its own gap in others' GPU work (`wait_for_idle`, inside the
    turn). Six created at once took 1.2-2.0 s each against 0.3 s alone (the driver takes them in
    turn anyway) and held Q shared all along: a timer waited for all six (up to 1.1 s), and others'
    correctness shared the driver with six context creations (correctness 2.0-3.7 s in six at once
    against 0.65-1.55 s with the turn, H200). A spare whose job has come (`needed()`) stops queueing
    and warms up at once. Yields the seconds queued."""
    with contextlib.ExitStack() as stack:
        warm = _open(stack, Path(timing).with_name(WARM_UP_FILE))
        started = time.monotonic()
        while not _try(warm, fcntl.LOCK_EX) and not needed():
            _pause()
        yield round(time.monotonic() - started, 3)


@contextlib.contextmanager
def problem_memory(timing: Path, alone: bool = False) -> Iterator[float]:
    """A whole job's hold on the GPU's memory (M, beside the timing lock): shared, so jobs run side by
    side, or `alone`: exclusive, after the jobs already running end, while new ones wait (they pass
    the memory turnstile, which a waiting `alone` job holds). Yields the seconds waited."""
    timing = Path(timing)
    with contextlib.ExitStack() as stack:
        turn = _open(stack, timing.with_name(MEMORY_TURN_FILE))
        memory = _open(stack, timing.with_name(MEMORY_FILE))
        started = time.monotonic()
        if alone:
            _lock(turn, fcntl.LOCK_EX)
            try:
                _lock(memory, fcntl.LOCK_EX)
            finally:
                _lock(turn, fcntl.LOCK_UN)
        else:
            _through_turn(turn, lambda: _try(memory, fcntl.LOCK_SH))
        yield round(time.monotonic() - started, 3)
