"""Bad campaign inputs and signals on a real Temporal dev server: every input row of docs/errors.md
fails its run at once with the documented message; malformed signals leave the campaign running
and queryable; a second campaign on one server is refused, naming the first."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from gpuyantra.campaign.inputs import InvalidInput, parse_campaign_input
from gpuyantra.campaign.records import CampaignInput
from gpuyantra.campaign_client import CampaignRefused, start_campaign
from gpuyantra.config import CONTROL_TASK_QUEUE, CPU_TASK_QUEUE, GPU_TASK_QUEUE
from gpuyantra.processes import temporal_binary
from tests.errors_table import matches, rows
from tests.workflow.test_campaign_logic import Script
from workflows.campaign import OptimizeCampaign

HANG_GUARD_S = 60  # generous; each run here ends in well under a second


@asynccontextmanager
async def workers(client: Client, script: Script) -> AsyncIterator[str]:
    """Workflow, GPU and CPU workers (scripted activities, the real preflight); yields the control queue."""
    gpu, cpu = script.activities()
    queue = CONTROL_TASK_QUEUE + uuid.uuid4().hex[:6]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        async with (
            Worker(client, task_queue=queue, workflows=[OptimizeCampaign]),
            Worker(client, task_queue=GPU_TASK_QUEUE, activities=gpu, activity_executor=pool),
            Worker(client, task_queue=CPU_TASK_QUEUE, activities=cpu, activity_executor=pool),
        ):
            yield queue


@asynccontextmanager
async def awaiting_approval(client: Client, queue: str, server_url: str) -> AsyncIterator[WorkflowHandle]:
    """A campaign on rms_norm held at its approval step; terminated at the end if still running, since
    a leftover one would refuse later tests' campaigns on its server."""
    handle = await client.start_workflow(
        OptimizeCampaign.run,
        CampaignInput(server_url=server_url, ops=["rms_norm"], require_approval=True),
        id=f"held-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )
    try:
        await wait_for_stage(handle, "awaiting-approval")
        yield handle
    finally:
        if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
            await handle.terminate("test over")


async def failure_of(handle: WorkflowHandle) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), HANG_GUARD_S)
    assert isinstance(failed.value.cause, ApplicationError)
    return failed.value.cause


async def wait_for_stage(handle: WorkflowHandle, stage: str) -> dict[str, Any]:
    for _ in range(300):  # bounded: 30 s
        progress = await handle.query(OptimizeCampaign.progress)
        if any(t.get("stage") == stage for t in progress["targets"].values()):
            return progress
        await asyncio.sleep(0.1)
    raise AssertionError(f"never reached {stage}: {progress}")


def temporal_cli(env: WorkflowEnvironment, *args: str) -> subprocess.CompletedProcess:
    address = env.client.service_client.config.target_host
    return subprocess.run(
        [temporal_binary(), *args, "--address", address],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=True,
    )


def input_rows() -> list[tuple[str, str]]:
    return [(raw, message) for raw, message in rows("Campaign input")]


@pytest.mark.parametrize(("raw", "message"), [r for r in input_rows() if "unknown op" not in r[1]])
def test_documented_input_errors_come_from_the_checker(raw: str, message: str):
    with pytest.raises(InvalidInput) as error:
        parse_campaign_input(() if raw == "(no input)" else (json.loads(raw),))
    assert matches(message, str(error.value))


async def test_every_documented_bad_input_fails_its_run_naming_the_field(env):
    async with workers(env.client, Script(rewards=[3])) as queue:
        handles = []
        for raw, message in input_rows():
            args = [] if raw == "(no input)" else [json.loads(raw)]
            handle = await env.client.start_workflow(
                "OptimizeCampaign", args=args, id=f"bad-{uuid.uuid4().hex[:8]}", task_queue=queue
            )
            handles.append((handle, message))
        for handle, message in handles:
            error = await failure_of(handle)
            assert error.type == "InvalidInput" and error.non_retryable
            assert matches(message, error.message), (message, error.message)


async def test_stock_cli_typo_fails_the_run_instead_of_hanging(env):
    async with workers(env.client, Script(rewards=[3])) as queue:
        workflow_id = f"typo-{uuid.uuid4().hex[:8]}"
        temporal_cli(
            env,
            "workflow",
            "start",
            "--type",
            "OptimizeCampaign",
            "--task-queue",
            queue,
            "--workflow-id",
            workflow_id,
            "--input",
            '{"server": "http://127.0.0.1:8000"}',
        )
        error = await failure_of(env.client.get_workflow_handle(workflow_id))
    assert error.message.startswith("invalid campaign input: unknown field 'server' (did you mean 'server_url'?)")


async def test_malformed_signals_leave_notices_and_a_bare_approve_deploys_every_op(env):
    script = Script(rewards=[3])
    notices = [
        (signal, json.loads(f"[{args}]"), notice) for signal, args, _, notice in rows("Signals") if notice != "—"
    ]
    async with workers(env.client, script) as queue, awaiting_approval(env.client, queue, "http://s.test") as handle:
        for signal, args, _ in notices:
            await handle.signal(signal, args=args)
        progress = await wait_for_stage(handle, "awaiting-approval")
        for _ in range(100):  # bounded: signals are applied on the next workflow task
            if len(progress["notices"]) == len(notices):
                break
            await asyncio.sleep(0.1)
            progress = await handle.query(OptimizeCampaign.progress)
        assert progress["notices"] == [notice for *_, notice in notices]
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        assert "deploy" not in script.calls
        temporal_cli(env, "workflow", "signal", "--workflow-id", handle.id, "--name", "approve")  # no input
        result = await asyncio.wait_for(handle.result(), HANG_GUARD_S)
    # Deployed; then the server is profiled once more, with the kernel in (the result's profile_after).
    assert script.calls[-2:] == ["deploy", "profile"] and result["deployed"][0]["op"] == "rms_norm"


async def test_second_campaign_on_one_server_is_refused_naming_the_first(env):
    address = env.client.service_client.config.target_host
    async with (
        workers(env.client, Script(rewards=[3])) as queue,
        awaiting_approval(env.client, queue, "http://127.0.0.1:8123") as first,
    ):
        # A stock start (any id), the same server spelled differently: refused by the run itself.
        second = await env.client.start_workflow(
            "OptimizeCampaign",
            {"server_url": "http://localhost:8123/"},
            id=f"second-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        error = await failure_of(second)
        assert error.type == "CampaignConflict" and error.non_retryable
        assert error.message == (
            f"campaign refused: workflow {first.id} is already optimizing http://localhost:8123/; wait for it "
            f"or cancel it: temporal workflow cancel --workflow-id {first.id}"
        )
        # `gpuyantra optimize`: refused before anything starts.
        with pytest.raises(CampaignRefused, match=f"workflow {first.id} is already optimizing"):
            await start_campaign(address, CampaignInput(server_url="http://127.0.0.1:8123"), wait=False)
        # Another server is not blocked by it.
        other = await env.client.start_workflow(
            OptimizeCampaign.run,
            CampaignInput(server_url="http://127.0.0.1:8124", ops=["rms_norm"]),
            id=f"other-{uuid.uuid4().hex[:8]}",
            task_queue=queue,
        )
        assert (await asyncio.wait_for(other.result(), HANG_GUARD_S))["deployed"]
        assert (await first.describe()).status == WorkflowExecutionStatus.RUNNING
