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
