# Over 600 lines: the sandbox child's whole lifecycle (limits, start, watch, read back) in one place.
"""Layer 3: run the candidate in a separate, limited process and collect only what the harness measured.

The child gets a scrubbed environment (no tokens, keys or credentials), its own session (so its
whole process group can be killed), CPU-time and (on CPU) address-space limits, a file-size limit,
a network namespace of its own where the OS allows it, and a wall-clock limit enforced here. The
parent polls the resident memory of every process in the child's session and kills the group when
it exceeds the limit. The child's stdout and stderr go to files nobody parses; the verdict is built
from the results file the parent named and the tensors the child saved.

Outputs come in numbered chunk files, read (and handed to `consume`, which judges them) while the
child goes on: at most the output budget of them waits unread, so outputs of any total size never
meet the file-size limit, the disk or the parent's memory at once. On CUDA a chunk carries CUDA IPC
handles of the child's clones on the GPU instead of their bytes (`transport`): the reader copies
them into the parent's GPU memory before anything is judged.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpuyantra
import gpuyantra.verifier.fork_server as fork_server
from gpuyantra.verifier import compiler_cache, isolation
from gpuyantra.verifier.baselines import timing_lock
from gpuyantra.verifier.child import chunk_name
from gpuyantra.verifier.gpu_locks import WARM_UP_FILE, GpuLocks
from gpuyantra.verifier.transport import CUDA_IPC, HOST, TRANSPORTS, nack_name, one_line, receive_cuda_ipc

ENV_ALLOW = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "TRITON_PTXAS_PATH",
    "TRITON_CUOBJDUMP_PATH",
    "TRITON_NVDISASM_PATH",
    "TRITON_LIBCUDA_PATH",
    "TRITON_LIBDEVICE_PATH",
    "VIRTUAL_ENV",
)
SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")
REPO_ROOT = str(Path(gpuyantra.__file__).resolve().parent.parent)

DEFAULT_TIMEOUT = {"cpu": 300.0, "cuda": 600.0}
DEFAULT_MEMORY = {"cpu": 8 * 2**30, "cuda": 48 * 2**30}  # resident bytes of the whole session
FILE_SIZE_LIMIT = 8 * 2**30
# Saved outputs waiting unread for the parent, at most (the child waits for room; one call's outputs
# past it are refused with a verdict that names it).
OUTPUT_BUDGET = 2**30
POLL_SECONDS = 0.05
READ_POLL_SECONDS = 0.01
READ_IDLE_SECONDS = 0.1  # the reader looks this often even when the child says nothing
# The session's members are found by reading every process's stat in /proc (2 ms on a small host,
# under the worker's one GIL): each poll reads the resident memory of the members last found, and
# they are looked for again this often (a process the candidate starts counts from then on).
MEMBERS_SCAN_SECONDS = 0.25
KILL_WAIT_SECONDS = 5.0  # a killed leftover is waited for this long at most
LEFTOVER_GRACE_SECONDS = 0.05  # a process the candidate started gets this long to show up after the child


def output_budget() -> int:
    """Bytes of outputs the child may leave unread: the budget, and well inside the file-size limit."""
    return max(1, min(OUTPUT_BUDGET, FILE_SIZE_LIMIT // 2))


@dataclass
class SandboxOutcome:
    results: dict[str, Any] | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    returncode: int | None = None
    timed_out: bool = False
    memory_exceeded: bool = False
    peak_rss: int = 0
    leftover: list[int] = field(default_factory=list)
    exit_seconds: float | None = None  # from the child's results written to its process gone
    results_seen_seconds: float | None = None  # ...to them seen, where its exit was not waited for
    stderr_tail: str = ""
    seconds: float = 0.0
    load_seconds: float = 0.0  # reading the saved outputs back (parent side, while the child runs)
    load_cpu_seconds: float = 0.0  # the reading thread's CPU time of it
    consume_seconds: float = 0.0  # judging them as they came (parent side, while the child runs)
    consume_cpu_seconds: float = 0.0  # the judging thread's CPU time of it
    transports: dict[str, int] = field(default_factory=dict)  # chunks judged per transport (`transport`)
    transport_fallback: str | None = None  # why outputs went by the host on CUDA, the first reason
    start_wait_seconds: float | None = None  # the job waiting for the child to finish starting
    collect_seconds: float = 0.0  # from the child gone to the outcome complete
    started_by: str = "exec"  # "fork": forked by the fork server; "exec": a new interpreter


_PARENT_PROTECTED: list[bool] = []


def protect_parent() -> bool:
    """This process non-dumpable (once): its children, their capabilities dropped, cannot read its
    environment (the attestation key, the admin token) or memory (`isolation`). True where it held."""
    if not _PARENT_PROTECTED:
        _PARENT_PROTECTED.append(isolation.protect_parent())
    return _PARENT_PROTECTED[0]


def default_threads() -> int:
    """A child's CPU threads unless told otherwise: the operator's OMP_NUM_THREADS when set (a machine
    running several verifications and servers at once gains nothing from more threads than cores, and
    OpenMP's spinning threads burn them), else the cores, at most 4."""
    cores = max(1, min(4, os.cpu_count() or 1))
    asked = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, min(cores, int(asked))) if asked.isdigit() else cores


def scrubbed_env(device: str, workdir: Path, threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOW and not any(m in k.upper() for m in SECRET_MARKERS)}
    env.setdefault("PATH", "/usr/bin:/bin")
    python_path = [REPO_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(
        {
            "HOME": str(workdir / "home"),
            "TMPDIR": str(workdir),
            "XDG_CACHE_HOME": str(workdir / "cache"),
            "PYTHONPATH": os.pathsep.join(python_path),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "PYTHONNOUSERSITE": "1",
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "OPENBLAS_NUM_THREADS": str(threads),  # numpy's matmuls under the interpreter
            "TRITON_HOME": str(workdir / "triton-home"),
        }
    )
    from gpuyantra.config import state_dir

    # Its own compiler caches to write, the shared ones to read only (`compiler_cache`).
    env.update(compiler_cache.child_env(workdir, state_dir()))
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        # torch.compile's baselines compile in the child itself: no pool of compile workers to start
        # and to shut down at exit (seconds each, for a kernel or two), none to outlive the child.
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    return env


def _sessions() -> dict[int, list[int]]:
    """Every live (not zombie) process's pid by its session, from one pass over /proc."""
    sessions: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return sessions
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            fields = stat[stat.rindex(")") + 2 :].split()
            state, session = fields[0], int(fields[3])
        except (OSError, ValueError, IndexError):
            continue
        if state != "Z":
            sessions.setdefault(session, []).append(int(entry))
    return sessions


class _SharedScan:
    """The last pass over /proc, shared by every sandbox this process watches: six verifications at
    once made six passes each MEMBERS_SCAN_SECONDS (7 % of the worker's GIL in a round of six, H200
    host); one pass younger than a watcher's `max_age` now serves them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._sessions: dict[int, list[int]] = {}

    def members(self, sid: int, max_age: float) -> list[int]:
        with self._lock:
            if time.monotonic() - self._at > max_age:
                scanned_at = time.monotonic()
                self._sessions, self._at = _sessions(), scanned_at
            return list(self._sessions.get(sid, ()))


_SCAN = _SharedScan()


def _session_members(sid: int, max_age: float = 0.0) -> list[int]:
    """Pids whose session is `sid` (the child and anything it started), from /proc: a pass made now,
    or one at most `max_age` seconds old (another sandbox's)."""
    return _SCAN.members(sid, max_age)


def _rss(pids: list[int]) -> int:
    """Resident bytes of `pids` by their statm: cheap, and an upper bound where they share pages."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


def _pss(pids: list[int]) -> int:
    """Proportional resident bytes of `pids` (smaps_rollup): a page shared by n of them counts 1/n
    each, so forks of one process are charged the memory they really add. ~8 ms a process: read
    only when the statm sum says the limit may be passed. A process without it counts its statm."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                line = next(line for line in fh if line.startswith("Pss:"))
            total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError, StopIteration):
            total += _rss([pid])
    return total


def _resident(pids: list[int], limit: int) -> int:
    """The memory a session holds, as the limit judges it: the statm sum, unless that passes the
    limit across several processes (copy-on-write pages counted once per fork), then their PSS."""
    rss = _rss(pids)
    return _pss(pids) if rss > limit and len(pids) > 1 else rss


def _kill_session(sid: int) -> None:
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in _session_members(sid):  # members that moved to another group of the same session
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class _ExitWatch:
    """Waits for a child's exit for at most some seconds at a time. On Linux one blocking poll of a
    pidfd (the GIL released throughout): `Popen.wait` with a timeout wakes every few milliseconds to
    look instead, and six verifications' watchers waking took turns on the GIL with their judging."""

    def __init__(self, proc: subprocess.Popen | fork_server.ForkedChild) -> None:
        self.proc = proc
        self.pidfd: int | None = None
        self.poller = select.poll()
        with contextlib.suppress(AttributeError, OSError):  # not Linux 5.3+: Popen.wait
            self.pidfd = os.pidfd_open(proc.pid)
            self.poller.register(self.pidfd, select.POLLIN)

    def exited(self, seconds: float) -> bool:
        """True as soon as the child has exited (not yet reaped), False after `seconds`."""
        if self.pidfd is None:
            try:
                self.proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                return False
            return True
        return bool(self.poller.poll(max(1, round(seconds * 1000))))

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _finished_alone(sid: int) -> bool:
    """The child has written its results and nothing else lives in its session: the verdict needs
    nothing more of it. The harness runs no candidate code after its results (it only waits for the
    GPU to end the context, `gpu_locks.share_gpu_through_exit`, and leaves), so its exit (0.1 s
    alone, 0.2-1.4 s beside five other verifications on an H200: mostly that wait) is left to a
    reaper (`_reap_later`). Anything else alive in the session is the candidate's: the caller then
    waits for the exit, and judges what outlived it, as for a child that ended on its own."""
    return _session_members(sid) == [sid]


# Children that finished their job and are ending on their own, each watched by a thread of its own.
_REAPERS: set[threading.Thread] = set()
_REAPERS_LOCK = threading.Lock()
# A finished child waits for pending timers at most gpu_locks.EXIT_WAIT_MAX_S before it leaves.
REAP_WAIT_SECONDS = 60.0


def _reap_later(sandbox: Sandbox) -> None:
    """`sandbox.close()` for a child that finished its job, in a thread: its exit is watched (the
    memory limit, then a kill past `sandbox.reap_wait_s`), anything of its session that outlives it is
    killed, its shared memory and folder removed."""

    def reap() -> None:
        try:
            sandbox._reap()
        finally:
            with _REAPERS_LOCK:
                _REAPERS.discard(threading.current_thread())

    thread = threading.Thread(target=reap, name="gpuyantra-sandbox-reaper", daemon=True)
    with _REAPERS_LOCK:
        _REAPERS.add(thread)
    thread.start()


def _kill_leftovers(sid: int) -> list[int]:
    """What of a gone child's session is still alive (after a grace for stragglers to show up): the
    candidate started it and it outlived the child. Killed, and waited for (bounded); pids returned."""
    time.sleep(LEFTOVER_GRACE_SECONDS)
    leftover = _session_members(sid)
    if leftover:
        _kill_session(sid)
        _wait_gone(sid, KILL_WAIT_SECONDS)
    return leftover


def _wait_gone(sid: int, seconds: float) -> None:
    """SIGKILL lands asynchronously (a loaded host takes a while): a verdict that says a process was
    killed is given once nothing of the session is alive (`_sessions` skips zombies), or after
    `seconds`."""
    deadline = time.monotonic() + seconds
    while _session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.01)


def wait_for_reapers(timeout: float = REAP_WAIT_SECONDS + 5) -> bool:
    """Wait until every finished child is gone and cleaned up (at most `timeout`); True if all are.
    Called as this process exits, so no child's folder or shared memory outlives it."""
    deadline = time.monotonic() + timeout
    while True:
        with _REAPERS_LOCK:
            pending = list(_REAPERS)
        if not pending:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        pending[0].join(remaining)


atexit.register(wait_for_reapers)


class Sandbox:
    """One child process. `start()` early (it imports torch meanwhile), then `run(job)` once."""

    def __init__(
        self,
        device: str,
        timeout: float | None = None,
        memory_limit: int | None = None,
        threads: int | None = None,
        cpu_seconds: int | None = None,
    ):
        self.device = device
        self.timeout = float(timeout or DEFAULT_TIMEOUT[device])
        self.memory_limit = int(memory_limit or DEFAULT_MEMORY[device])
        self.threads = threads or default_threads()
        # CPU seconds of all the child's threads together: the wall-clock budget on every thread.
        self.cpu_seconds = int(cpu_seconds or self.timeout * self.threads + 30)
        self._tmp = tempfile.TemporaryDirectory(prefix="gpuyantra-verify-")
        self.workdir = Path(self._tmp.name)
        (self.workdir / "home").mkdir()
        self.proc: subprocess.Popen | fork_server.ForkedChild | None = None
        self.started_at = 0.0
        self.notify_fd: int | None = None  # read end of the pipe the child writes a byte to per chunk
        self._finished = False  # `run` returned once the child's results were written, before its exit
        self.reap_wait_s = REAP_WAIT_SECONDS  # a finished child's exit, at most (then it is killed)
        self._gpu_lock: str | None = None

    def start(self, gpu_lock: str | None = None, fork: bool = True) -> None:
        """Start the child: forked by this process's fork server for the device where one runs
        (`fork_server`; `keep_spare` starts it), else a new interpreter. `gpu_lock` (a spare's): the
        GPU timing lock, beside which lie the locks its CUDA warm-up shares the GPU through
        (gpu_locks), so a spare starting beside a verification never touches the GPU while anything
        is timed."""
        if self.proc is not None:
            return  # a warm spare: started earlier, waiting for its job
        self._gpu_lock = gpu_lock
        server = fork_server.running(self.device) if fork else None
        env = scrubbed_env(self.device, self.workdir, self.threads)
        protect_parent()
        args = self._child_args(gpu_lock) + ["--isolation", json.dumps(self._isolation_policy(env))]
        self.notify_fd, notify_write = os.pipe()
        os.set_blocking(self.notify_fd, False)
        self._stdout = open(self.workdir / "stdout.log", "wb")
        self._stderr = open(self.workdir / "stderr.log", "wb")
        self.started_at = time.monotonic()
        try:
            if server is not None:
                args += ["--notify-fd", str(fork_server.NOTIFY_FD)]
                self.proc = server.spawn(args, env, self.workdir, self._stdout, self._stderr, notify_write)
                return
            self.proc = subprocess.Popen(
                [*self._interpreter_command(args), "--notify-fd", str(notify_write)],
                stdin=subprocess.PIPE,
                stdout=self._stdout,
                stderr=self._stderr,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
                close_fds=True,
                pass_fds=(notify_write,),
            )
        finally:
            os.close(notify_write)  # the child's alone: the reader sees the end of the pipe when it exits

    def _interpreter_command(self, args: list[str]) -> list[str]:
        """The child started as a new interpreter (not forked)."""
        return [sys.executable, "-B", "-s", "-m", "gpuyantra.verifier.child", *args]

    def _isolation_policy(self, env: dict[str, str]) -> dict[str, Any]:
        """What the child may read and write (`isolation`): never the state folder, but the GPU's lock
        files and the shared compiler caches in it on CUDA."""
        from gpuyantra.config import state_dir

        locks: list[str] = []
        if self.device == "cuda":
            timing = timing_lock()
            beside = GpuLocks.beside(timing)
            locks = [str(beside.turn), str(beside.timing), str(beside.quiet), str(timing.with_name(WARM_UP_FILE))]
        return isolation.policy(self.device, self.workdir, env, locks, [state_dir()])

    def _child_args(self, gpu_lock: str | None) -> list[str]:
        # The address-space limit would break CUDA's large virtual reservations: CPU only.
        address_space = self.memory_limit + 4 * 2**30 if self.device == "cpu" else 0
        args = ["--device", self.device, "--cpu-seconds", str(self.cpu_seconds)]
        args += ["--address-space", str(address_space), "--file-size", str(FILE_SIZE_LIMIT)]
        return args + (["--gpu-lock", gpu_lock] if gpu_lock else [])

    @property
    def forked(self) -> bool:
        return isinstance(self.proc, fork_server.ForkedChild)

    def _ensure_started(self) -> None:
        """Started, and (where forked) the fork done: a fork server that failed it, or went, leaves
        the job to a child started as a new interpreter."""
        if self.proc is None:
            self.start()
        if isinstance(self.proc, fork_server.ForkedChild) and not self.proc.started():
            self._release_start()
            self.start(self._gpu_lock, fork=False)

    def _release_start(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.proc = None
        self._close_files()

    def _close_files(self) -> None:
        """The child's output files and the notify pipe's read end, where open."""
        for fh in (getattr(self, "_stdout", None), getattr(self, "_stderr", None)):
            if fh is not None and not fh.closed:
                fh.close()
        if self.notify_fd is not None:
            os.close(self.notify_fd)
            self.notify_fd = None

    def stage_file(self, name: str, text: str) -> Path:
        path = self.workdir / name
        path.write_bytes(text.encode())  # exactly the checked bytes: no locale encoding, no newline translation
        path.chmod(0o444)
        return path

    def run(self, job: dict[str, Any], consume: Callable[[dict[str, Any]], None] | None = None) -> SandboxOutcome:
        """Hand the child its job and watch it to the end. Each chunk of outputs goes to `consume` as
        it arrives (in order, on a reader thread); without one they are all kept in `outcome.outputs`."""
        self._ensure_started()
        assert self.proc is not None
        outcome = SandboxOutcome(started_by="fork" if self.forked else "exec")
        results_path = self.workdir / "results.json"
        outputs_dir = self.workdir / "outputs"
        outputs_dir.mkdir(exist_ok=True)
        budget = output_budget()
        reader = OutputReader(
            outputs_dir,
            budget,
            consume or outcome.outputs.update,
            device=self.device,
            child_pid=self.proc.pid,
            notify_fd=self.notify_fd,
        )
        job = dict(job, results_path=str(results_path), outputs_dir=str(outputs_dir), output_budget=budget)
        reader.start()
        job_sent_at = time.time()
        assert self.proc.stdin is not None  # started with stdin=PIPE
        try:
            self.proc.stdin.write(json.dumps(job).encode())
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        deadline = time.monotonic() + self.timeout  # from the job on: a spare may have waited long for one
        self._finished = self._watch(outcome, deadline, results_path)
        collecting = time.monotonic()
        ended_at = time.time()  # the child gone, or its results written with nothing else in its session
        outcome.seconds = time.monotonic() - self.started_at
        if not self._finished:
            outcome.leftover = _kill_leftovers(self.proc.pid)
        self._stdout.close()
        self._stderr.close()
        outcome.stderr_tail = _tail(self.workdir / "stderr.log")
        reader.finish(read_rest=not (outcome.timed_out or outcome.memory_exceeded))
        remove_shared_memory(self.proc.pid)
        outcome.load_seconds, outcome.consume_seconds = round(reader.load_seconds, 3), round(reader.consume_seconds, 3)
        outcome.consume_cpu_seconds = round(reader.consume_cpu_seconds, 3)
        outcome.load_cpu_seconds = round(reader.load_cpu_seconds, 3)
        outcome.transports, outcome.transport_fallback = dict(reader.transports), reader.fallback
        if results_path.exists() and not outcome.timed_out and not outcome.memory_exceeded:
            try:
                outcome.results = json.loads(results_path.read_text())
            except (OSError, ValueError):
                outcome.results = None
            results = outcome.results or {}
            finished_at, job_read_at = results.get("finished_at"), results.get("job_read_at")
            if isinstance(finished_at, (int, float)):
                since_finished = round(max(ended_at - finished_at, 0.0), 3)
                if self._finished:
                    outcome.results_seen_seconds = since_finished
                else:
                    outcome.exit_seconds = since_finished
            if isinstance(job_read_at, (int, float)):
                outcome.start_wait_seconds = round(max(job_read_at - job_sent_at, 0.0), 3)
            if outcome.results is not None and reader.error:
                own = outcome.results.get("harness_error")
                outcome.results["harness_error"] = f"{own}; {reader.error}" if own else reader.error
        outcome.collect_seconds = round(time.monotonic() - collecting, 3)
        return outcome

    def _watch(self, outcome: SandboxOutcome, deadline: float, results_path: Path | None = None) -> bool:
        """Wait for the child to exit; kill its session past `deadline` or the memory limit. With
        `results_path`, stop waiting once the child has finished its job (`_finished_alone`): True."""
        assert self.proc is not None
        sid = self.proc.pid
        members, scanned = [sid], time.monotonic()
        watch = _ExitWatch(self.proc)
        try:
            while not watch.exited(POLL_SECONDS):
                if results_path is not None and results_path.exists():
                    if _finished_alone(sid):
                        return True
                    results_path = None  # others in its session: wait for the exit and judge them then
                now = time.monotonic()
                if now > deadline:
                    outcome.timed_out = True
                    _kill_session(sid)
                    break
                if now - scanned >= MEMBERS_SCAN_SECONDS:
                    members, scanned = _session_members(sid, MEMBERS_SCAN_SECONDS / 2) or [sid], now
                rss = _resident(members, self.memory_limit)
                outcome.peak_rss = max(outcome.peak_rss, rss)
                if rss > self.memory_limit:
                    outcome.memory_exceeded = True
                    _kill_session(sid)
                    break
        finally:
            watch.close()
        outcome.returncode = self.proc.wait()
        return False

    def _reap(self) -> None:
        """`close` for a child that finished its job, once it is gone (`_reap_later`'s thread)."""
        assert self.proc is not None
        self._watch(SandboxOutcome(), time.monotonic() + self.reap_wait_s)
        _kill_leftovers(self.proc.pid)
        remove_shared_memory(self.proc.pid)
        self._finished = False
        self.close()

    def kill(self) -> None:
        """End the child's session now, from any thread: `run`, watching it in another, returns."""
        if self.proc is not None and self.proc.poll() is None:
            _kill_session(self.proc.pid)

    def close(self) -> None:
        if self._finished and self.proc is not None and self.proc.poll() is None:
            _reap_later(self)  # its exit (the CUDA context's teardown) is no part of the verdict
            return
        if isinstance(self.proc, fork_server.ForkedChild) and self.proc.poll() is None:
            self._close_forked(self.proc)
        elif self.proc is not None and self.proc.poll() is None:
            _kill_session(self.proc.pid)
            self.proc.wait()
        self._close_files()
        self._tmp.cleanup()

    @staticmethod
    def _close_forked(proc: fork_server.ForkedChild) -> None:
        """A fork not yet done is not waited for: its stdin ends now, so it exits once it reads it."""
        with contextlib.suppress(OSError):
            proc.stdin.close()
        if proc.started(timeout=0):
            _kill_session(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=fork_server.START_SECONDS)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOAD_ERROR_CHARS = 600


MAX_JSON_CHUNK_BYTES = 64 * 2**20  # a cuda_ipc chunk's descriptions: ~400 bytes per output at most


def _load_chunk(path: Path) -> Any:
    """A chunk file's contents: JSON (a cuda_ipc chunk's descriptions) or torch.save's zip (tensors),
    as its first byte says; either way data only (JSON has no objects, the zip loads weights_only)."""
    import torch

    with open(path, "rb") as handle:
        if handle.read(1) == b"{":
            if path.stat().st_size > MAX_JSON_CHUNK_BYTES:
                raise ValueError(f"{path.name} holds descriptions past {MAX_JSON_CHUNK_BYTES} bytes")
            handle.seek(0)
            return json.loads(handle.read())
    # Mapped, not read: the copy to the judging device reads the pages (one pass, not two).
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def load_error(exc: BaseException) -> str:
    """`exc` in one line that keeps its reason. Where torch.load refused a pickle under weights_only it
    wraps the unpickler's reason (say `Unsupported global: GLOBAL bytes was not an allowed global by
    default`) in paragraphs of advice, raising `from None`: the reason is the suppressed context."""
    text = _ANSI.sub("", str(exc))
    if text.startswith("Weights only load failed"):
        inner = exc.__context__ if exc.__context__ is not None else exc.__cause__
        if inner is not None:
            text = str(inner)
        else:  # torch's own wording: the reason follows its last "WeightsUnpickler error:"
            text = text.rsplit("WeightsUnpickler error:", 1)[-1]
        text = f"weights_only load refused it: {_ANSI.sub('', text)}"
    return one_line(f"{type(exc).__name__}: {text}", LOAD_ERROR_CHARS)


class OutputReader(threading.Thread):
    """Reads the child's chunk files in order while it runs: loads each (data only: tensors, or the
    CUDA IPC entries of the child's clones), hands the outputs to `consume`, deletes it (which gives
    the child room for the next, and lets it release its clones). A chunk that cannot be read or
    judged is a harness error, and reading goes on so the child never waits for room forever.

    A `cuda_ipc` chunk (`transport`) is copied into this process's GPU memory (`device`: where the
    outputs are judged; `child_pid`: whose reference counters the entries may name) and deleted
    once it is judged: the child's wait for it to go (`drain`) ends with the parent's GPU work on
    it, so none of it overlaps the child's timing that follows. Where that fails, a nack beside it
    asks the child to send the outputs again by the host, and `fallback` keeps the first reason;
    `transports` counts the chunks judged per transport."""

    def __init__(
        self,
        folder: Path,
        budget: int,
        consume: Callable[[dict[str, Any]], None],
        device: str = "cpu",
        child_pid: int | None = None,
        notify_fd: int | None = None,
    ) -> None:
        super().__init__(name="gpuyantra-output-reader", daemon=True)
        # The child writes a byte here after each chunk (`notify_fd`, non-blocking): the reader sleeps
        # until then, instead of waking every READ_POLL_SECONDS to look (six verifications' readers
        # waking took turns on the GIL with their judging).
        self.notify_fd = notify_fd
        self._woken_at = 0.0
        self.folder = folder
        self.budget = budget
        self.consume = consume
        self.device = device
        self.child_pid = child_pid
        self.next = 0
        self.error: str | None = None
        self.fallback: str | None = None
        self.transports: dict[str, int] = {}
        self._stream: Any = None  # CUDA: where cuda_ipc chunks are copied
        self._mapped: list[Any] = []  # the child's memory mapped for the chunk being judged (`_import`)
        self.load_seconds = 0.0
        self.load_cpu_seconds = 0.0  # this thread's CPU time reading chunks (the rest: GIL, driver, device)
        self.consume_seconds = 0.0
        self.consume_cpu_seconds = 0.0  # this thread's CPU time in `consume` (with any spin of a device wait)
        self._done = threading.Event()
        # Wakes a wait on the child's pipe when reading ends with the child alive (finished: its exit
        # is not waited for), where otherwise the pipe's end would (0.1 s later at most).
        self._wake_read, self._wake_write = os.pipe()
        self._read_rest = True

    def run(self) -> None:
        while not self._done.is_set():
            if not self.read_ready():
                self._await_chunk()
        if self._read_rest:
            self.read_ready()  # what the child wrote before it exited

    def _await_chunk(self) -> None:
        """Until the child says it wrote a chunk (at most READ_IDLE_SECONDS), or READ_POLL_SECONDS
        without a notification pipe. Wakes at most once per READ_POLL_SECONDS, whatever is written
        to the pipe (the candidate runs in the child and may write to it too). The pipe's end (the
        child gone, or the pipe closed by the candidate) leaves polling."""
        if self.notify_fd is None:
            self._done.wait(READ_POLL_SECONDS)
            return
        since = time.monotonic() - self._woken_at
        if since < READ_POLL_SECONDS:
            self._done.wait(READ_POLL_SECONDS - since)
        poller = select.poll()
        poller.register(self.notify_fd, select.POLLIN)
        poller.register(self._wake_read, select.POLLIN)  # `finish`, with the child still there
        if poller.poll(round(READ_IDLE_SECONDS * 1000)) and not self._done.is_set():
            try:
                if not os.read(self.notify_fd, 65536):
                    self.notify_fd = None  # every write end is closed: nothing will say so again
            except BlockingIOError:
                pass
            except OSError:  # closed under it (the sandbox gone): look by polling
                self.notify_fd = None
        self._woken_at = time.monotonic()

    def finish(self, read_rest: bool = True) -> None:
        """Read what is left (unless the child was killed: nothing of it is judged), then stop."""
        self._read_rest = read_rest
        self._done.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")
        self.join()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def read_ready(self) -> bool:
        """Read every chunk that is there, in order; False when the next one is not there yet."""
        read = False
        while (path := self.folder / chunk_name(self.next)).exists():
            self._read(path, self.next)
            self.next += 1
            read = True
        return read

    def _read(self, path: Path, sequence: int) -> None:
        try:
            size = path.stat().st_size
            # A chunk holds a quarter budget, or one call's outputs up to the budget, plus zip headers.
            if size > 2 * self.budget + 2**20:
                raise ValueError(f"{path.name} holds {size} bytes, past the output budget of {self.budget}")
            loading, loading_cpu = time.monotonic(), time.thread_time()
            chunk = _load_chunk(path)
            if not isinstance(chunk, dict) or not isinstance(chunk.get("outputs"), dict):
                raise ValueError(f"{path.name} holds a {type(chunk).__name__}, not a chunk of outputs")
            transport = chunk.get("transport")
            if transport == HOST:
                outputs = chunk["outputs"]
                if isinstance(chunk.get("fallback"), str):
                    self._fell_back(chunk["fallback"])
            elif transport == CUDA_IPC:
                outputs = self._receive(chunk["outputs"], path, sequence)
                if outputs is None:
                    self.load_seconds += time.monotonic() - loading
                    self.load_cpu_seconds += time.thread_time() - loading_cpu
                    return  # the child sends them again by the host
            else:
                raise ValueError(f"{path.name} names transport {transport!r}, not one of {', '.join(TRANSPORTS)}")
            self.load_seconds += time.monotonic() - loading
            self.load_cpu_seconds += time.thread_time() - loading_cpu
            judging, judging_cpu = time.monotonic(), time.thread_time()
            with self._after_copies():
                self.consume(outputs)
            self.consume_seconds += time.monotonic() - judging
            self.consume_cpu_seconds += time.thread_time() - judging_cpu
            self.transports[transport] = self.transports.get(transport, 0) + 1
        except Exception as exc:  # noqa: BLE001 - a damaged chunk means no outputs to trust
            if self.error is None:
                self.error = f"cannot read the saved outputs ({path.name}): {load_error(exc)}"
        finally:
            self._release_mappings()
            path.unlink(missing_ok=True)  # copied and judged: the child may release its clones

    def _after_copies(self) -> contextlib.AbstractContextManager[Any]:
        """Where a cuda_ipc chunk's copies were queued (this reader's stream): judging entered from
        there queues behind them (`judge.judging_stream`) and its one wait for the device covers both."""
        if not self._mapped or self._stream is None:
            return contextlib.nullcontext()
        import torch

        return torch.cuda.stream(self._stream)

    def _release_mappings(self) -> None:
        """Release the child's memory mapped for the last chunk, once its copies are complete (judging
        waited for them already, unless nothing in the chunk was judged)."""
        if self._mapped:
            assert self._stream is not None  # mapped only on it (`_import`)
            self._stream.synchronize()
            self._mapped.clear()

    def _receive(self, entries: Any, path: Path, sequence: int) -> dict[str, Any] | None:
        """A cuda_ipc chunk's outputs in this process's GPU memory; None (after leaving a nack for the
        child) where they cannot be had."""
        try:
            return self._import(entries)
        except Exception as exc:  # noqa: BLE001 - any failure: the same outputs come again by the host
            self._release_mappings()
            reason = one_line(f"cuda_ipc import failed: {type(exc).__name__}: {exc}")
            self._fell_back(reason)
            # An empty file, before the chunk goes: the child looks for it once the chunk is gone. Never
            # through a link the child left there; without it the outputs count as read, and missing.
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
            with contextlib.suppress(OSError):
                os.close(os.open(self.folder / nack_name(sequence), flags, 0o600))
            path.unlink(missing_ok=True)
            return None

    def _import(self, entries: Any) -> dict[str, Any]:
        """The entries' clones copied into this process's GPU memory, on this reader's own stream (not
        behind other verifications' work): queued, the mappings kept in `_mapped` until the judging
        that follows has waited for them (`_release_mappings`). Judging them (on a judging stream)
        ends with reading its counts back, before they are freed."""
        if self.device != "cuda":
            raise ValueError(f"outputs are judged on {self.device}, not on a CUDA device")
        import torch

        index = torch.cuda.current_device()
        if self._stream is None:
            self._stream = torch.cuda.Stream(index)
        with torch.cuda.stream(self._stream):
            return receive_cuda_ipc(entries, index, self.budget, self.child_pid, self._mapped)

    def _fell_back(self, reason: str) -> None:
        if self.fallback is None:
            self.fallback = one_line(reason)


# Warm spares: started children per limits key, waiting on stdin with torch, triton (and on CUDA a
# context) loaded, so a long-lived worker's next verifications skip the child's start. A spare
# whose parent exits reads an empty job and exits. One per key unless a worker that runs several
# verifications at once asks for as many (`set_spare_count`): a campaign's first wave of eight
# verifications spent 9-21 s each starting its child when one spare was kept.
_SPARES: dict[tuple[Any, ...], list[Sandbox]] = {}
_SPARES_LOCK = threading.Lock()
_SPARE_COUNT = 1


def set_spare_count(count: int) -> None:
    """How many warm spares `keep_spare` keeps per limits key (at least 1)."""
    global _SPARE_COUNT
    _SPARE_COUNT = max(1, int(count))


def close_spares() -> None:
    """Stop every warm spare (tests, and a worker shutting down). The fork server stays: it holds no
    GPU and forks the next spares (`fork_server.close_all` stops it; so does this process's exit)."""
    with _SPARES_LOCK:
        spares = [spare for pool in _SPARES.values() for spare in pool]
        _SPARES.clear()
    for spare in spares:
        spare.close()


def _spare_key(
    device: str, timeout: float | None, memory_limit: int | None, cpu_seconds: int | None
) -> tuple[Any, ...]:
    from gpuyantra.config import state_dir

    return device, timeout, memory_limit, cpu_seconds, str(state_dir())


def _alive(sandbox: Sandbox) -> bool:
    return sandbox.proc is not None and sandbox.proc.poll() is None


def take_spare(
    device: str, timeout: float | None = None, memory_limit: int | None = None, cpu_seconds: int | None = None
) -> Sandbox | None:
    """A warm spare with these limits if one is alive (`keep_spare` started it), else None."""
    with _SPARES_LOCK:
        pool = _SPARES.get(_spare_key(device, timeout, memory_limit, cpu_seconds), [])
        dead = [spare for spare in pool if not _alive(spare)]
        pool[:] = [spare for spare in pool if _alive(spare)]
        spare = pool.pop(0) if pool else None
    for sandbox in dead:
        sandbox.close()
    return spare


def take_sandbox(
    device: str, timeout: float | None = None, memory_limit: int | None = None, cpu_seconds: int | None = None
) -> Sandbox:
    """A warm spare with these limits if one is alive, else a new (not yet started) sandbox."""
    spare = take_spare(device, timeout=timeout, memory_limit=memory_limit, cpu_seconds=cpu_seconds)
    return spare or Sandbox(device, timeout=timeout, memory_limit=memory_limit, cpu_seconds=cpu_seconds)


def keep_spare(
    device: str, timeout: float | None = None, memory_limit: int | None = None, cpu_seconds: int | None = None
) -> None:
    """Start spares for the next verifications with these limits, up to the spare count."""
    key = _spare_key(device, timeout, memory_limit, cpu_seconds)
    with _SPARES_LOCK:
        pool = _SPARES.setdefault(key, [])
        if len(pool) < _SPARE_COUNT:
            start_fork_server(device)
        while len(pool) < _SPARE_COUNT:
            spare = Sandbox(device, timeout=timeout, memory_limit=memory_limit, cpu_seconds=cpu_seconds)
            # It starts while a verification may be timing: its CUDA context waits until nothing is timed.
            spare.start(gpu_lock=str(timing_lock()) if device == "cuda" else None)
            pool.append(spare)


def start_fork_server(device: str) -> None:
    """This process's sandbox children for `device` are forked from now on, with the imports done:
    ready in about a second instead of 7-10 s on CUDA, and 2-3 CPU-s of torch's import saved per
    verification on a CPU (`fork_server`). A process that keeps spares keeps one; so does a worker."""
    fork_server.ensure(device, lambda workdir: scrubbed_env(device, workdir, default_threads()))


SHARED_MEMORY = Path("/dev/shm")


def remove_shared_memory(pid: int) -> None:
    """Remove torch's shared-memory files of a child that is gone (`/dev/shm/torch_<pid>_*`: the
    reference counters of its CUDA IPC exports, and whatever the candidate shared): the child exits
    without the interpreter's teardown, which would have removed them, and a worker verifies
    thousands of candidates."""
    try:
        paths = list(SHARED_MEMORY.glob(f"torch_{int(pid)}_*"))
    except OSError:
        return
    for path in paths:
        try:
            path.unlink()
        except OSError:
            continue


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read().decode(errors="replace").strip()
    except OSError:
        return ""
