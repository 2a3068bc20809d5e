"""Real parts for the dashboard tests: the integration suite's session Temporal dev server and
workers (imported, so one definition), a uvicorn serving process for this package, a Qdrant folder
with skills, and `gpuyantra dashboard` processes on 127.0.0.1 with ports from the OS."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpuyantra.processes import Managed, free_port, start_server
from gpuyantra.skills import SkillStore
from tests.integration.conftest import (  # noqa: F401 - fixtures
    ADMIN_TOKEN,
    state_dir,
    temporal,
    trust,
    worker_env,
    workers,
)
from tests.skills.conftest import make_skill

REPO = Path(__file__).resolve().parents[2]
START_WITHIN_S = 30.0


class Dashboard:
    """One `python -m gpuyantra.cli dashboard` process; its output goes to a log file."""

    def __init__(self, log_dir: Path, *args: str, host: str = "127.0.0.1", env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"dashboard-{self.port}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpuyantra.cli", "dashboard", "--host", host, "--port", str(self.port), *args],
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_ready(self) -> Dashboard:
        deadline = time.monotonic() + START_WITHIN_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dashboard exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"dashboard did not answer within {START_WITHIN_S:.0f} s:\n{self.log()}")

    def get(self, path: str, **kwargs) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30.0, **kwargs)

    def post(self, path: str, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60.0, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def wait_for(check, within_s: float, what: str, every_s: float = 0.5):
    """Poll `check()` until it returns something truthy (returned), else fail naming `what`."""
    deadline = time.monotonic() + within_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    pytest.fail(f"{what} not seen within {within_s:.0f} s")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, trust) -> Iterator[Managed]:  # noqa: F811 - the fixture
    """A real `gpuyantra serve` process (tiny-qwen2 on the CPU) with the integration suite's admin token,
    registered with the workers' state folder (they send admin requests only to servers they trust)."""
    root = tmp_path_factory.mktemp("dashboard-server")
    managed = start_server("tiny-qwen2", root, free_port(), ADMIN_TOKEN, device="cpu", env={"TRITON_INTERPRET": "1"})
    trust(managed.info["url"])
    yield managed
    managed.stop()


@pytest.fixture(scope="module")
def skills_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qdrant folder with two rms_norm skills (one pulled twice) and one silu_mul skill."""
    folder = tmp_path_factory.mktemp("dashboard-skills") / "qdrant"
    with SkillStore(path=folder) as store:
        pulled = store.upsert(make_skill("rms_norm", "cpu", "a", regime="memory-bound"))
        store.upsert(make_skill("rms_norm", "cpu", "b", regime="launch-bound"))
        store.upsert(make_skill("silu_mul", "nvidia-h200", "c", regime="memory-bound"))
        store.record_outcome(pulled, 3.0)
        store.record_outcome(pulled, 1.0)
    return folder
