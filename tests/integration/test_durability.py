"""A campaign survives crashes: the GPU worker is killed mid-verification and the Temporal dev
server itself is killed and restarted on its SQLite file; the campaign still finishes and deploys."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

from temporalio.client import Client

from gpuyantra.campaign.records import CampaignInput
from gpuyantra.config import CONTROL_TASK_QUEUE
from gpuyantra.processes import Managed, free_port, start_temporal, start_worker
from gpuyantra.verifier.reuse import FRESH_ENV


def crash(managed: Managed) -> None:
    os.killpg(managed.process.pid, signal.SIGKILL)
    managed.process.wait(timeout=30)


async def wait_for_stage(client: Client, workflow_id: str, stage: str, timeout_s: float = 180) -> None:
    handle = client.get_workflow_handle(workflow_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        progress = await handle.query("progress")
        if any(t.get("stage") == stage for t in progress["targets"].values()):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"campaign never reached stage {stage!r}: {progress}")


async def test_campaign_survives_worker_and_server_crashes(served_model, worker_env, tmp_path):
    state = tmp_path / "durable"
    # Verify for real: a verdict stored by an earlier test for the same bytes would make the
    # verification instant, and there would be no verification to crash in the middle of.
    worker_env = {**worker_env, FRESH_ENV: "1"}
    port = free_port()
    temporal = start_temporal(state, port=port, headless=True)
    address = temporal.info["address"]
    processes = [
        temporal,
        start_worker("cpu", address, state, worker_env),
        start_worker("gpu", address, state, worker_env),
    ]
    try:
        client = await Client.connect(address)
        workflow_id = f"durable-{uuid.uuid4().hex[:8]}"
        await client.start_workflow(
            "OptimizeCampaign",
            CampaignInput(server_url=served_model.info["url"], ops=["rms_norm"], min_reward=1),
            id=workflow_id,
            task_queue=CONTROL_TASK_QUEUE,
        )
        await wait_for_stage(client, workflow_id, "verify")

        crash(processes[2])  # the GPU worker dies in the middle of verifying
        crash(processes[0])  # and so does the Temporal server
        processes[0] = start_temporal(state, port=port, headless=True)  # same SQLite file, same port
        processes[2] = start_worker("gpu", address, state, worker_env)

        client = await Client.connect(address)
        handle = client.get_workflow_handle(workflow_id)
        result = await asyncio.wait_for(handle.result(), timeout=300)
        assert [d["op"] for d in result["deployed"]] == ["rms_norm"], result

        verify_attempts = [
            event.activity_task_started_event_attributes.attempt
            async for event in handle.fetch_history_events()
            if event.HasField("activity_task_started_event_attributes")
        ]
        assert max(verify_attempts) >= 2  # the interrupted activity was retried, not lost
    finally:
        for managed in reversed(processes):
            managed.stop()
