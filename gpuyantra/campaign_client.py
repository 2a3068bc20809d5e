"""Start an OptimizeCampaign on Temporal and, if asked, wait for its result."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from temporalio.client import Client

from gpuyantra import config
from workflows.types import CampaignInput


def new_workflow_id() -> str:
    return f"campaign-{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns() % 100000:05d}"


async def start_campaign(address: str, params: CampaignInput, wait: bool,
                         workflow_id: str | None = None) -> dict[str, Any]:
    client = await Client.connect(address)
    workflow_id = workflow_id or new_workflow_id()
    handle = await client.start_workflow("OptimizeCampaign", params, id=workflow_id,
                                         task_queue=config.CONTROL_TASK_QUEUE)
    if not wait:
        return {"workflow_id": workflow_id, "status": "started", "input": dataclasses.asdict(params)}
    return await handle.result()
