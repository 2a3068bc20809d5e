"""One real Temporal dev server (the `temporal` binary) for every workflow test module, with
gpuyantra's search attributes registered as `gpuyantra up` registers them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from gpuyantra.config import search_attribute_args
from gpuyantra.processes import temporal_binary


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), dev_server_extra_args=["--headless", *search_attribute_args()]
    )
    yield environment
    await environment.shutdown()


# The servers these tests' campaigns name, trusted as a worker's `--server NAME=URL` would trust them
# (gpuyantra/trusted_servers.py).
TEST_SERVERS = "x=http://x,y=http://y,s=http://s.test,a=http://127.0.0.1:8123,b=http://127.0.0.1:8124"


@pytest.fixture(autouse=True)
def trusted_test_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUYANTRA_SERVERS", TEST_SERVERS)
