"""Start an OptimizeCampaign on Temporal and, if asked, wait for its result.

One campaign per server at a time: two campaigns swapping kernels into one process would measure
and roll back each other's work. `running_campaign` finds the one already running; the CLI checks
before it starts, and the workflow's `preflight_campaign` activity checks again (stock-CLI starts).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from datetime import datetime
from typing import Any

from temporalio.client import Client

from gpuyantra import config
from workflows.inputs import server_key
from workflows.types import CampaignInput

CONNECT_WITHIN_S = 3.0  # a just-started dev server answers within this; a dead address fails fast
RUNNING = "WorkflowType = 'OptimizeCampaign' AND ExecutionStatus = 'Running'"
MAX_LISTED = 200  # running campaigns looked at, at most: one per server, so far more than any fleet


class CampaignRefused(Exception):
    """Another campaign is already running against the same server."""


class TemporalUnreachable(RuntimeError):
    def __init__(self, address: str) -> None:
        super().__init__(f"cannot reach Temporal at {address}: start it with `gpuyantra up` (or `temporal server "
                         f"start-dev`), or point --temporal / TEMPORAL_ADDRESS at it")


def new_workflow_id(server_url: str) -> str:
    """`campaign-<host>-<port>-<time>`: the server is readable in `temporal workflow list`."""
    where = re.sub(r"[^A-Za-z0-9.]+", "-", server_key(server_url).split("://", 1)[1]).strip("-")
    return f"campaign-{where}-{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns() % 100000:05d}"


async def connect(address: str, within_s: float = CONNECT_WITHIN_S) -> Client:
    """Client.connect, retried for a bounded time (a server just started may not answer yet), then
    TemporalUnreachable; bounded too when the address drops packets instead of refusing."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await asyncio.wait_for(Client.connect(address), max(deadline - time.monotonic(), 0.5))
        except (RuntimeError, asyncio.TimeoutError) as exc:
            if time.monotonic() + 0.5 >= deadline:
                raise TemporalUnreachable(address) from exc
        await asyncio.sleep(0.5)


async def running_campaign(client: Client, server_url: str, workflow_id: str | None = None,
                           started: datetime | None = None) -> str | None:
    """The id of a running campaign against `server_url` other than `workflow_id`; with `started`,
    only one that started before it (ties by id), so of two racing campaigns the later one yields."""
    key = server_key(server_url)
    async for execution in client.list_workflows(RUNNING, limit=MAX_LISTED):
        if execution.id == workflow_id:
            continue
        if started is not None and (execution.start_time, execution.id) >= (started, workflow_id or ""):
            continue
        other = await _input_of(client, execution.id, execution.run_id)
        if isinstance(other, dict) and isinstance(other.get("server_url"), str) \
                and server_key(other["server_url"]) == key:
            return execution.id
    return None


async def _input_of(client: Client, workflow_id: str, run_id: str | None) -> Any:
    """The first input of a workflow, from its start event (any starter, any client)."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async for event in handle.fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        if not payloads:
            return None
        try:
            return (await client.data_converter.decode([payloads[0]]))[0]
        except Exception:  # noqa: BLE001 - an input this code cannot read names no server we know
            return None
    return None


def unknown_ops(names: list[str]) -> str | None:
    """The registry's message for the first unknown op name, or None."""
    from gpuyantra.ops import UnknownOpError, get_op  # imports torch: only where an op is checked

    try:
        for name in names:
            get_op(name)
    except UnknownOpError as exc:
        return str(exc)
    return None


def refusal(server_url: str, running_id: str) -> str:
    return (f"campaign refused: workflow {running_id} is already optimizing {server_url}; wait for it "
            f"or cancel it: temporal workflow cancel --workflow-id {running_id}")


async def start_campaign(address: str, params: CampaignInput, wait: bool,
                         workflow_id: str | None = None) -> dict[str, Any]:
    client = await connect(address)
    running = await running_campaign(client, params.server_url)
    if running is not None:
        raise CampaignRefused(refusal(params.server_url, running))
    workflow_id = workflow_id or new_workflow_id(params.server_url)
    handle = await client.start_workflow("OptimizeCampaign", params, id=workflow_id,
                                         task_queue=config.CONTROL_TASK_QUEUE)
    if not wait:
        return {"workflow_id": workflow_id, "status": "started", "input": dataclasses.asdict(params)}
    return await handle.result()
