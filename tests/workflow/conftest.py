"""One real Temporal dev server (the `temporal` binary) for every workflow test module."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from gpuyantra.processes import temporal_binary


@pytest.fixture(scope="session")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    environment = await WorkflowEnvironment.start_local(dev_server_existing_path=temporal_binary(),
                                                        dev_server_extra_args=["--headless"])
    yield environment
    await environment.shutdown()
