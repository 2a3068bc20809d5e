"""A fork server for sandbox children: one process per device that has done what every child does
before its GPU work (`child.preload`: torch, triton, the harness, on CUDA torch's compiler modules
and Triton's cache key) and never touched a GPU, forking one child per sandbox.

Why: a child started as a new interpreter spent 7-10 s (H200 host; more with six starting at once)
before it could take a job, most of it importing torch's compiler modules (3.4-5 s) and hashing
Triton (0.4-0.9 s); a worker that verified six candidates at once waited that long for the next six
spares. A forked child starts with all of it done and only creates its CUDA context.

What the fork keeps from the sandbox's contract: the child runs `child.main` as a new interpreter
would, with the sandbox's scrubbed environment, working folder, stdin/stdout/stderr, its own
session, its limits (applied after the fork, so its CPU time counts from zero) and its network
namespace. It holds no descriptor of the server's (the server's socket and its other children's
pidfds are closed before anything else runs), so a candidate cannot ask for processes outside its
session. The server imports no CUDA state: `torch.cuda` is never initialized before a fork.

Protocol (one SOCK_SEQPACKET socketpair per server, JSON messages): the parent sends
`{"token", "argv", "env", "cwd"}` with four descriptors (stdin, stdout, stderr, notify pipe); the
server answers `{"token", "pid"}` (or `{"token", "error"}`), and `{"exited": pid, "returncode"}`
when it has reaped that child. The server leaves when its parent process does (the socket's end; not
a parent-death signal, which fires when the thread that started it ends).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuyantra.verifier import isolation

NOTIFY_FD = 3  # where a forked child finds its notify pipe (the parent names it in the argv it sends)
START_SECONDS = 180.0  # the longest a sandbox waits for its fork before starting a child itself
MAX_MESSAGE = 2**20
CUDA_ERROR_NOT_INITIALIZED = 3
# The exit code of a forked child whose server died before reaping it: not a signal (a verdict with
# the harness's results stands; one without is a crash, as for any nonzero code).
STATUS_LOST = 255
# Set to "0" to start every sandbox child as a new interpreter.
ENV_SWITCH = "GPUYANTRA_FORK_SERVER"


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0" and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


class ForkedChild:
    """A child forked by a fork server, with what `Sandbox` uses of `subprocess.Popen`: `pid`
    (waits for the fork), `stdin`, `poll()`, `wait()` and `returncode`, the last from the server,
    which reaps it."""

    def __init__(self, stdin: Any) -> None:
        self.stdin = stdin
        self.returncode: int | None = None
        self.error: str | None = None
        self._pid: int | None = None
        self._forked = threading.Event()
        self._exited = threading.Event()

    def started(self, timeout: float = START_SECONDS) -> bool:
        """Whether the server forked it (waits for its answer); False: it never will."""
        self._forked.wait(timeout)
        return self._pid is not None

    @property
    def pid(self) -> int:
        if not self.started():
            raise RuntimeError(f"the fork server started no child: {self.error or 'no answer'}")
        assert self._pid is not None
        return self._pid

    def kill(self) -> None:
        if self.started() and self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def poll(self) -> int | None:
        return self.returncode if self._exited.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired("fork-server child", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def _on_fork(self, pid: int) -> None:
        self._pid = pid
        self._forked.set()

    def _on_failure(self, reason: str, returncode: int) -> None:
        self.error = self.error or reason
        self.returncode = returncode
        self._forked.set()
        self._exited.set()

    def _on_exit(self, returncode: int) -> None:
        self.returncode = returncode
        self._exited.set()


class ForkServer:
    """The parent's end: starts the server process and forks children through it."""

    def __init__(self, device: str, env_for: Callable[[Path], dict[str, str]]) -> None:
        """`env_for(folder)`: the scrubbed environment of a sandbox working in `folder` (the server's
        own; each child gets its sandbox's)."""
        self.device = device
        self._tmp = tempfile.TemporaryDirectory(prefix="gpuyantra-fork-server-")
        workdir = Path(self._tmp.name)
        (workdir / "home").mkdir()
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._log = open(workdir / "server.log", "wb")
        self._send_lock = threading.Lock()
        self._children: dict[int, ForkedChild] = {}  # asked for, by token, until the server answers
        self._by_pid: dict[int, ForkedChild] = {}  # forked, by pid, until the server reports the exit
        self._tokens = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-B", "-s", "-m", "gpuyantra.verifier.fork_server", "--device", device],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                cwd=workdir,
                env=dict(env_for(workdir), GPUYANTRA_FORK_SERVER_FD=str(theirs.fileno())),
                start_new_session=True,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        self._reader = threading.Thread(target=self._read, name=f"fork-server-{device}", daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return not self._closed and self.proc.poll() is None

    def spawn(
        self, argv: list[str], env: dict[str, str], cwd: Path, stdout: Any, stderr: Any, notify: int
    ) -> ForkedChild:
        """Ask for a child running `child.main(argv)`; returns at once (the fork may wait for the
        server's preload). A server gone or going fails the child (`poll()` says so)."""
        read_end, write_end = os.pipe()
        child = ForkedChild(open(write_end, "wb"))
        token = next(self._tokens)
        message = json.dumps({"token": token, "argv": argv, "env": env, "cwd": str(cwd)}).encode()
        with self._lock:
            self._children[token] = child
        try:
            with self._send_lock:
                socket.send_fds(self._sock, [message], [read_end, stdout.fileno(), stderr.fileno(), notify])
        except OSError as exc:
            with self._lock:
                self._children.pop(token, None)
            child._on_failure(f"fork server unreachable: {exc}", -signal.SIGKILL)
        finally:
            os.close(read_end)
        return child

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self._dispatch(json.loads(data))
        self._fail_all("the fork server exited")

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "exited" in message:
            with self._lock:
                child = self._by_pid.pop(int(message["exited"]), None)
            if child is not None:
                child._on_exit(int(message["returncode"]))
            return
        with self._lock:
            child = self._children.pop(int(message["token"]), None)
            if child is not None and "pid" in message:
                self._by_pid[int(message["pid"])] = child
        if child is None:
            return
        if "pid" in message:
            child._on_fork(int(message["pid"]))
        else:
            child._on_failure(str(message.get("error", "fork failed")), -signal.SIGKILL)

    def _fail_all(self, reason: str) -> None:
        """The server is gone: children not yet forked never will be; forked ones are nobody's to
        reap now, so they end with STATUS_LOST once they are gone."""
        with self._lock:
            unforked, forked = list(self._children.values()), dict(self._by_pid)
            self._children.clear()
            self._by_pid.clear()
            self._closed = True
        for child in unforked:
            child._on_failure(reason, -signal.SIGKILL)
        for pid, child in forked.items():
            threading.Thread(target=_report_when_gone, args=(pid, child), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=5)
        self._sock.close()
        self._log.close()
        self._tmp.cleanup()


def _report_when_gone(pid: int, child: ForkedChild) -> None:
    """A child whose server died: its exit is seen (pidfd), its status is not (init reaps it)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        child._on_exit(STATUS_LOST)
        return
    try:
        select.select([pidfd], [], [])
    finally:
        os.close(pidfd)
    child._on_exit(STATUS_LOST)


_SERVERS: dict[str, ForkServer] = {}
_SERVERS_LOCK = threading.Lock()


def ensure(device: str, env_for: Callable[[Path], dict[str, str]]) -> ForkServer | None:
    """This process's fork server for `device`, started if none runs (None where forking is off or
    not possible here)."""
    if not enabled():
        return None
    with _SERVERS_LOCK:
        server = _SERVERS.get(device)
        if server is not None and server.alive():
            return server
        if server is not None:
            server.close()
        try:
            server = ForkServer(device, env_for)
        except OSError:
            return None
        _SERVERS[device] = server
        return server


def running(device: str) -> ForkServer | None:
    """The fork server for `device` if one was started and is alive (never starts one)."""
    if not enabled():
        return None
    with _SERVERS_LOCK:
        server = _SERVERS.get(device)
    return server if server is not None and server.alive() else None


def close_all() -> None:
    with _SERVERS_LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.close()


# --- the server process -------------------------------------------------------------------------


def _open_descriptors() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


def _become_child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked process: take the sandbox's descriptors, session, folder and environment, drop
    every descriptor of the server's, and run the child harness as `python -m` would."""
    code = 70
    try:
        os.setsid()
        isolation.undo_protect_parent()  # as a child started as a new interpreter: its own isolation follows
        stdin, stdout, stderr, notify = fds
        for source, target in ((stdin, 0), (stdout, 1), (stderr, 2), (notify, NOTIFY_FD)):
            os.dup2(source, target)
        for fd in _open_descriptors():
            if fd > NOTIFY_FD:
                with contextlib.suppress(OSError):
                    os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # from TMPDIR again, the sandbox's
        _take_thread_count()
        from gpuyantra.verifier.child import _exit_now, main

        argv = [str(arg) for arg in request["argv"]]
        sys.argv = ["gpuyantra.verifier.child", *argv]
        code = main(argv)
        _exit_now(code)
    except BaseException:  # noqa: BLE001 - a child must never return into the server's loop
        with contextlib.suppress(BaseException):
            traceback.print_exc()
            sys.stderr.flush()
    os._exit(code)


def _driver_initialized() -> bool:
    """Whether the CUDA driver was started here (torch's state aside, Triton's driver object starts it
    when first used): a child forked after `cuInit` cannot use CUDA. The driver library is mapped by
    the imports already; asking it for the device count before `cuInit` answers "not initialized"
    (3) and starts nothing."""
    try:
        driver = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False  # not loaded: not started
    count = ctypes.c_int(0)
    return int(driver.cuDeviceGetCount(ctypes.byref(count))) != CUDA_ERROR_NOT_INITIALIZED


def _take_thread_count() -> None:
    """The OpenMP runtime read OMP_NUM_THREADS when the server loaded it: the sandbox's count is set."""
    import torch

    with contextlib.suppress(ValueError, RuntimeError):
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "0"))))


def _fork(request: dict[str, Any], fds: list[int]) -> int:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        _become_child(request, fds)
    return pid


def serve(sock: socket.socket, device: str) -> int:
    """Fork a child per request until the parent goes; report each child's exit."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    children: dict[int, int] = {}  # pidfd -> pid
    try:
        _serve_requests(sock, device, poller, children)
    except OSError:  # the parent is gone mid-answer
        pass
    return 0


def _serve_requests(sock: socket.socket, device: str, poller: Any, children: dict[int, int]) -> None:
    import torch

    while True:
        for fd, _ in poller.poll():
            if fd != sock.fileno():
                pid = children.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                sock.send(json.dumps({"exited": pid, "returncode": os.waitstatus_to_exitcode(status)}).encode())
                continue
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
            if not data:
                return  # the parent is gone
            answer: dict[str, Any]
            request: Any = None
            try:
                request = json.loads(data)
                answer = {"token": request["token"]}
                if len(fds) != 4:
                    answer["error"] = f"a fork request carries 4 descriptors, not {len(fds)}"
                elif device == "cuda" and (torch.cuda.is_initialized() or _driver_initialized()):
                    answer["error"] = "the fork server started the CUDA driver: its children could not use it"
                else:
                    pid = _fork(request, fds)
                    pidfd = os.pidfd_open(pid)
                    children[pidfd] = pid
                    poller.register(pidfd, select.POLLIN)
                    answer["pid"] = pid
            except (ValueError, KeyError, TypeError, OSError) as exc:
                answer = {"token": request.get("token") if isinstance(request, dict) else None, "error": str(exc)}
            finally:
                for received in fds:
                    os.close(received)
            sock.send(json.dumps(answer).encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuyantra.verifier.fork_server")
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    args = parser.parse_args(argv)
    # Python warns of fork in a process with threads: torch's import starts a native one that holds
    # no lock a child needs (the CUDA runtime, which must not cross a fork, is never initialized).
    warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks.*")
    sock = socket.socket(fileno=int(os.environ.pop("GPUYANTRA_FORK_SERVER_FD")))
    from gpuyantra.verifier.child import CHILD_NICENESS, preload

    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, CHILD_NICENESS)  # its children's niceness, from the start
    started = time.perf_counter()
    timings = preload(args.device)
    print(f"preloaded in {time.perf_counter() - started:.2f} s: {timings}", flush=True)
    isolation.protect_parent()  # an ancestor of every forked child: its /proc files out of their reach
    return serve(sock, args.device)


if __name__ == "__main__":
    sys.exit(main())
