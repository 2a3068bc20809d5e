"""`gpuyantra verify` through a GPU worker: the VerifyKernel workflow on a real Temporal dev server,
running the real verifier in the `verify_file` activity (Triton's interpreter here)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.gpu import verify_file
from gpuyantra import config
from gpuyantra.campaign.inputs import InvalidInput, parse_verify_input
from gpuyantra.config import GPU_TASK_QUEUE
from tests.errors_table import matches, rows
from workflows.verify import VerifyKernel

TEMPLATE = Path(__file__).resolve().parents[2] / "gpuyantra" / "kernels" / "rms_norm.py"
HANG_GUARD_S = 240  # one interpreted verification of one dtype takes well under a minute


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path))
    return tmp_path


@asynccontextmanager
async def worker(client: Client) -> AsyncIterator[str]:
    queue = "verify-test-" + uuid.uuid4().hex[:6]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        async with (
            Worker(client, task_queue=queue, workflows=[VerifyKernel]),
            Worker(client, task_queue=GPU_TASK_QUEUE, activities=[verify_file], activity_executor=pool),
        ):
            yield queue


async def test_the_worker_verifies_the_file_it_is_sent(env: WorkflowEnvironment, state) -> None:
    async with worker(env.client) as queue:
        request = {"source": TEMPLATE.read_text(), "file_name": "rms_norm.py", "device": "cpu", "dtypes": ["float32"]}
        verdict = await asyncio.wait_for(
            env.client.execute_workflow("VerifyKernel", request, id=f"verify-{uuid.uuid4().hex[:8]}", task_queue=queue),
            HANG_GUARD_S,
        )
    assert verdict["accepted"] is True and verdict["reward"] == 1 and verdict["failures"] == []
    assert verdict["op"] == "rms_norm" and verdict["device"] == "cpu" and verdict["dtypes"] == ["float32"]
    kept = Path(verdict["candidate_path"])
    assert kept.parent == state / "candidates" / "verify" and kept.read_text() == TEMPLATE.read_text()
    assert verdict["attestation"]["digest"] == verdict["source_sha256"]


async def test_a_bad_input_fails_the_run_naming_each_field(env: WorkflowEnvironment) -> None:
    async with worker(env.client) as queue:
        handle = await env.client.start_workflow(
            "VerifyKernel",
            {"source": " ", "timeout": -5, "devic": "cuda", "shapes": [[0, 4]]},
            id=f"verify-bad-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 60)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput"
    for needle in ("'source'", "'timeout'", "unknown field 'devic' (did you mean 'device'?)", "'shapes'"):
        assert needle in str(cause)


@pytest.mark.parametrize(("raw", "message"), rows("Verification input"))
def test_every_documented_bad_input_fails_with_its_message(raw: str, message: str) -> None:
    args = () if raw == "(no input)" else (json.loads(raw),)
    with pytest.raises(InvalidInput) as bad:
        parse_verify_input(args)
    assert matches(message, str(bad.value))


@pytest.mark.parametrize(
    "raw",
    [
        {"source": "x"},
        {"source": "x", "timeout": 300, "device": "cuda", "dtypes": ["float16"]},
        {"source": "x", "param_shapes": {"weight": [8, 3], "bias": None}, "shapes": [[1, 64], [4, 64]]},
    ],
)
def test_good_inputs_pass(raw: dict) -> None:
    assert parse_verify_input((raw,)).source == "x"


async def test_a_worker_that_fails_the_verification_is_reported_as_lost(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command verifies here after saying so (gpuyantra/commands/verify.py); here the client's
    side: the workflow's failure comes back as WorkerLost, naming the workflow and the cause."""
    from temporalio import activity

    from gpuyantra import verify_client

    @activity.defn(name="verify_file")
    def lost(request: dict) -> dict:
        raise ApplicationError("the GPU went away", non_retryable=True)

    address = env.client.service_client.config.target_host
    control = "verify-test-control-" + uuid.uuid4().hex[:6]  # the session's server: a queue of its own
    monkeypatch.setattr(config, "CONTROL_TASK_QUEUE", control)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        async with (
            Worker(env.client, task_queue=control, workflows=[VerifyKernel]),
            Worker(env.client, task_queue=GPU_TASK_QUEUE, activities=[lost], activity_executor=pool),
        ):
            for _ in range(100):  # bounded: 10 s for the new workers' first polls to be seen
                try:
                    await verify_client._check_workers(env.client, address)
                    break
                except verify_client.WorkerUnavailable:
                    await asyncio.sleep(0.1)
            with pytest.raises(verify_client.WorkerLost) as failed:
                request = {"source": "OP = 1", "file_name": "k.py"}
                await asyncio.wait_for(verify_client._verify(request, address, 60), HANG_GUARD_S)
    assert "workflow verify-k-" in str(failed.value) and "the GPU went away" in str(failed.value)
