"""Real parts for integration tests: the Temporal dev server binary, worker processes and a
uvicorn serving process, all on 127.0.0.1 with free ports, each stopped at teardown."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuyantra.processes import Managed, free_port, start_server, start_temporal, start_worker

ADMIN_TOKEN = "test-" + secrets.token_hex(8)


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpuyantra-state")


@pytest.fixture(scope="session")
def temporal(state_dir: Path) -> Iterator[Managed]:
    managed = start_temporal(state_dir, port=free_port(), headless=True)
    yield managed
    managed.stop()


@pytest.fixture(scope="session")
def worker_env(state_dir: Path) -> dict[str, str]:
    return {
        "GPUYANTRA_ADMIN_TOKEN": ADMIN_TOKEN,
        "GPUYANTRA_STATE_DIR": str(state_dir),
        "TRITON_INTERPRET": "1",
        "GPUYANTRA_QDRANT_PATH": str(state_dir / "qdrant"),
    }


@pytest.fixture(scope="session")
def workers(temporal: Managed, state_dir: Path, worker_env: dict[str, str]) -> Iterator[list[Managed]]:
    # Separate GPU and CPU workers, as on a real deployment: the queues must route correctly.
    started = [start_worker(role, temporal.info["address"], state_dir, worker_env) for role in ("cpu", "gpu")]
    yield started
    for managed in started:
        managed.stop()


@pytest.fixture(scope="session")
def trust(state_dir: Path) -> Callable[[str], str]:
    """Register a server with the workers' state folder (`<state>/servers/`, as `serve` registers itself
    in its own): the workers send admin requests only to servers they trust. Returns the URL."""

    def register(url: str) -> str:
        folder = state_dir / "servers"
        folder.mkdir(exist_ok=True)
        (folder / f"test-{url.rsplit(':', 1)[1]}.json").write_text(json.dumps({"url": url}))
        return url

    return register


@pytest.fixture
def served_model(tmp_path: Path, trust: Callable[[str], str]) -> Iterator[Managed]:
    managed = start_server(
        "tiny-qwen2", tmp_path, free_port(), ADMIN_TOKEN, device="cpu", env={"TRITON_INTERPRET": "1"}
    )
    trust(managed.info["url"])
    yield managed
    managed.stop()


@pytest.fixture
def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


os.environ.setdefault("TRITON_INTERPRET", "1")
