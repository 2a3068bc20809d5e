"""Fixtures of the serving tests. Kernels run in Triton's interpreter (TRITON_INTERPRET=1, set
before triton is imported) and models in float32 on the CPU."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path

import pytest

from tests.serving.helpers import ServerProcess


@pytest.fixture
def start_server(tmp_path):
    """Factory: start_server(state_dir=None, *args) -> ready ServerProcess; all killed at teardown."""
    started: list[ServerProcess] = []

    def start(state_dir: Path | None = None, *args: str, wait: bool = True) -> ServerProcess:
        state = state_dir or (tmp_path / "state")
        state.mkdir(parents=True, exist_ok=True)
        server = ServerProcess(state, tmp_path / f"server-{len(started)}.log", *args)
        started.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for a test module (the load and faulty-kernel tests)."""
    root = tmp_path_factory.mktemp("shared-server")
    server = ServerProcess(root / "state", root / "server.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()
