"""Campaigns are findable in Temporal by model, ops, hardware, deployed count and best speedup
(custom search attributes, registered on the dev server as `gpuyantra up` registers them), and a
namespace without them still runs campaigns, unsearchable."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import subprocess
import uuid

from temporalio import activity
from temporalio.worker import Worker

from gpuyantra.campaign.records import CampaignInput
from gpuyantra.config import CONTROL_TASK_QUEUE, CPU_TASK_QUEUE, GPU_TASK_QUEUE, SEARCH_ATTRIBUTES, indexed_value_type
from gpuyantra.processes import temporal_binary
from tests.workflow.test_campaign_logic import Script, run
from workflows.campaign import (
    BEST_SPEEDUP_KEY,
    DEPLOYED_KEY,
    HARDWARE_KEY,
    MODEL_KEY,
    OPS_KEY,
    SEARCH_KEYS,
    OptimizeCampaign,
)

QUERY = 'GpuyantraModel="tiny-qwen2"'  # docs/usage.md's query


def test_workflow_keys_are_the_registered_ones():
    assert {key.name: f"INDEXED_VALUE_TYPE_{key.indexed_value_type.name}" for key in SEARCH_KEYS} == {
        name: indexed_value_type(kind) for name, kind in SEARCH_ATTRIBUTES.items()
    }


async def listed(env, query: str, workflow_id: str) -> list[str]:
    """Ids `temporal workflow list --query` answers (visibility lags a little: polled, bounded)."""
    for _ in range(50):
        found = subprocess.run(
            [
                temporal_binary(),
                "workflow",
                "list",
                "--address",
                env.client.service_client.config.target_host,
                "--query",
                query,
                "--output",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert found.returncode == 0, found.stderr
        ids = [row["execution"]["workflowId"] for row in json.loads(found.stdout or "[]")]
        if workflow_id in ids:
            return ids
        await asyncio.sleep(0.2)
    return ids


async def test_demo_like_campaign_is_found_by_model_ops_and_deployed(env):
    # As `gpuyantra demo` on a CPU: tiny-qwen2, rms_norm, min_reward 1, a CPU verdict.
    script = Script(rewards=[1], device="cpu", model="tiny-qwen2")
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"], min_reward=1))
    assert result["model"] == "tiny-qwen2" and result["deployed"]
    workflow_id = result["workflow_id"]
    assert workflow_id in await listed(env, QUERY, workflow_id)
    assert workflow_id in await listed(env, f'{QUERY} AND GpuyantraOps="rms_norm" AND GpuyantraDeployed=1', workflow_id)
    attributes = (await env.client.get_workflow_handle(workflow_id).describe()).typed_search_attributes
    assert attributes.get(MODEL_KEY) == "tiny-qwen2" and attributes.get(OPS_KEY) == ["rms_norm"]
    assert attributes.get(HARDWARE_KEY) == "test-gpu" and attributes.get(DEPLOYED_KEY) == 1
    assert attributes.get(BEST_SPEEDUP_KEY) == 2.0


async def test_namespace_without_the_attributes_runs_campaigns_unsearchable(env):
    @activity.defn(name="preflight_campaign")
    async def preflight_without_attributes(params: CampaignInput) -> dict:
        return {"search_attributes": []}  # what preflight answers where none is registered

    script = Script(rewards=[3], model="tiny-qwen2")
    gpu, cpu = script.activities()
    cpu = [a for a in cpu if a.__name__ != "preflight_campaign"]
    queue = CONTROL_TASK_QUEUE + uuid.uuid4().hex[:6]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        async with (
            Worker(env.client, task_queue=queue, workflows=[OptimizeCampaign]),
            Worker(env.client, task_queue=GPU_TASK_QUEUE, activities=gpu, activity_executor=pool),
            Worker(
                env.client,
                task_queue=CPU_TASK_QUEUE,
                activities=[*cpu, preflight_without_attributes],
                activity_executor=pool,
            ),
        ):
            handle = await env.client.start_workflow(
                OptimizeCampaign.run,
                CampaignInput(server_url="http://y", ops=["rms_norm"]),
                id=f"t-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
            )
            result = await asyncio.wait_for(handle.result(), 60)
    assert result["deployed"]
    attributes = (await handle.describe()).typed_search_attributes
    assert all(attributes.get(key) is None for key in SEARCH_KEYS)
