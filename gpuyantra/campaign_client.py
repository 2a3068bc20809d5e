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
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError

from gpuyantra import config
from gpuyantra.campaign.inputs import server_key
from gpuyantra.campaign.records import CampaignInput

CONNECT_WITHIN_S = 3.0  # a just-started dev server answers within this; a dead address fails fast
RUNNING = "WorkflowType = 'OptimizeCampaign' AND ExecutionStatus = 'Running'"
CAMPAIGNS = "WorkflowType = 'OptimizeCampaign'"
QUERY_WITHIN_S = 2.0  # a running campaign whose worker is down does not answer its query: don't wait on it
POLL_S = 1.0  # how often `optimize --wait` asks the campaign for its progress
MAX_LISTED = 200  # running campaigns looked at, at most: one per server, so far more than any fleet
# Search attributes a campaign sets as it learns them (config.SEARCH_ATTRIBUTES), shown per campaign.
MODEL_KEY = SearchAttributeKey.for_keyword("GpuyantraModel")
DEPLOYED_KEY = SearchAttributeKey.for_int("GpuyantraDeployed")
BEST_SPEEDUP_KEY = SearchAttributeKey.for_float("GpuyantraBestSpeedup")


class CampaignRefused(Exception):
    """Another campaign is already running against the same server."""


class TemporalUnreachable(RuntimeError):
    def __init__(self, address: str) -> None:
        super().__init__(
            f"cannot reach Temporal at {address}: start it with `gpuyantra up` (or `temporal server "
            f"start-dev`), or point --temporal / TEMPORAL_ADDRESS at it"
        )


def new_workflow_id(server_url: str, model: str | None = None, ops: list[str] | None = None) -> str:
    """`campaign-<model>-<ops>-<host>-<port>-<time>`: model, ops and server are readable in
    `temporal workflow list` (model left out when unknown; ops `auto` when the profile picks them)."""
    where = re.sub(r"[^A-Za-z0-9.]+", "-", server_key(server_url).split("://", 1)[1]).strip("-")
    what = [
        re.sub(r"[^A-Za-z0-9._]+", "-", part).strip("-")[:60]
        for part in (model or "", "+".join(ops)[:80] if ops else "auto")
    ]
    prefix = "-".join(part for part in what if part)
    return f"campaign-{prefix}-{where}-{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns() % 100000:05d}"


def web_ui_link(address: str, workflow_id: str) -> str:
    """The dev server's Web UI page of a workflow: its UI listens on the gRPC port + 1000 (8233 for 7233)."""
    host, _, port = address.rpartition(":")
    ui_port = int(port) + 1000 if port.isdigit() else 8233
    host = "127.0.0.1" if host in ("", "localhost") else host
    return f"http://{host}:{ui_port}/namespaces/default/workflows/{quote(workflow_id, safe='')}"


def follow_commands(address: str, workflow_id: str) -> list[str]:
    """The stock CLI lines that show or cancel a campaign."""
    return [
        f"temporal workflow show --address {address} --workflow-id {workflow_id}",
        f"temporal workflow cancel --address {address} --workflow-id {workflow_id}",
    ]


async def connect(address: str, within_s: float = CONNECT_WITHIN_S, namespace: str = "default") -> Client:
    """Client.connect, retried for a bounded time (a server just started may not answer yet), then
    TemporalUnreachable; bounded too when the address drops packets instead of refusing."""
    from gpuyantra.temporal_auth import connect_options

    options = connect_options()  # TLS and an API key, when the environment names them
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await asyncio.wait_for(
                Client.connect(address, namespace=namespace, **options), max(deadline - time.monotonic(), 0.5)
            )
        except (TimeoutError, RuntimeError) as exc:
            if time.monotonic() + 0.5 >= deadline:
                raise TemporalUnreachable(address) from exc
        await asyncio.sleep(0.5)


async def running_campaign(
    client: Client, server_url: str, workflow_id: str | None = None, started: datetime | None = None
) -> str | None:
    """The id of a running campaign against `server_url` other than `workflow_id`; with `started`,
    only one that started before it (ties by id), so of two racing campaigns the later one yields."""
    key = server_key(server_url)
    async for execution in client.list_workflows(RUNNING, limit=MAX_LISTED):
        if execution.id == workflow_id:
            continue
        if started is not None and (execution.start_time, execution.id) >= (started, workflow_id or ""):
            continue
        other = await _input_of(client, execution.id, execution.run_id)
        if (
            isinstance(other, dict)
            and isinstance(other.get("server_url"), str)
            and server_key(other["server_url"]) == key
            and await _still_running(client, execution.id, execution.run_id)
        ):
            return execution.id
    return None


async def _still_running(client: Client, workflow_id: str, run_id: str | None) -> bool:
    """The list comes from visibility, which lags (a campaign refused a moment ago may still be
    listed as running); the execution's own record says whether it still runs."""
    description = await client.get_workflow_handle(workflow_id, run_id=run_id).describe()
    return description.status == WorkflowExecutionStatus.RUNNING


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
    from gpuyantra.ops.open import is_open

    try:
        for name in names:
            if not is_open(name):  # open targets are made by the server's profile, not registered here
                get_op(name)
    except UnknownOpError as exc:
        return str(exc)
    return None


def refusal(server_url: str, running_id: str) -> str:
    return (
        f"campaign refused: workflow {running_id} is already optimizing {server_url}; wait for it "
        f"or cancel it: temporal workflow cancel --workflow-id {running_id}"
    )


async def launch(client: Client, params: CampaignInput, workflow_id: str) -> WorkflowHandle:
    """Start the campaign unless one already runs against its server (CampaignRefused)."""
    running = await running_campaign(client, params.server_url)
    if running is not None:
        raise CampaignRefused(refusal(params.server_url, running))
    return await client.start_workflow("OptimizeCampaign", params, id=workflow_id, task_queue=config.CONTROL_TASK_QUEUE)


def started_answer(workflow_id: str, params: CampaignInput) -> dict[str, Any]:
    return {"workflow_id": workflow_id, "status": "started", "input": dataclasses.asdict(params)}


async def start_campaign(
    address: str, params: CampaignInput, wait: bool, workflow_id: str | None = None
) -> dict[str, Any]:
    client = await connect(address)
    workflow_id = workflow_id or new_workflow_id(params.server_url, ops=params.ops)
    handle = await launch(client, params, workflow_id)
    if not wait:
        return started_answer(workflow_id, params)
    return await handle.result()


async def follow(handle: WorkflowHandle, emit: Callable[[str], None], poll_s: float | None = None) -> dict[str, Any]:
    """The campaign's result; meanwhile one line per change of stage, target stage or iteration,
    read from the `progress` query every `poll_s` (POLL_S) seconds."""
    poll_s = poll_s or POLL_S
    result = asyncio.ensure_future(handle.result())
    seen: dict[str, str] = {}
    try:
        while True:
            try:
                progress = await handle.query("progress")
            except Exception:  # noqa: BLE001 - no workflow task has run yet, or the run just closed
                progress = None
            for line in progress_lines(seen, progress):
                emit(line)
            done, _ = await asyncio.wait({result}, timeout=poll_s)
            if done:
                return result.result()
    finally:
        result.cancel()


def progress_lines(seen: dict[str, str], progress: Any) -> list[str]:
    """Lines for what changed in `progress` since `seen` (updated in place)."""
    if not isinstance(progress, dict):
        return []
    now = {"campaign": f"stage {progress.get('stage')}"}
    trails: list[str] = []
    for key, target in sorted((progress.get("targets") or {}).items()):
        iteration = f" (iteration {target['iteration']})" if target.get("iteration") else ""
        now[key] = f"{key}: {target.get('stage')}{iteration}"
        trail = target.get("trail")
        if isinstance(trail, list):  # every stage since the last poll, not only the current one
            done = int(seen.get(f"{key}#trail", 0))
            trails += [f"{key}: {stage}" for stage in trail[done:]]
            seen[f"{key}#trail"] = str(len(trail))
            seen[key] = now[key]
    if progress.get("waiting"):  # what the campaign waits for, once each time it changes
        now["waiting"] = str(progress["waiting"])
    notices = progress.get("notices") or []
    lines = [text for key, text in now.items() if seen.get(key) != text] + trails
    lines += [f"notice: {notice}" for notice in notices[int(seen.get("notices", 0)) :]]
    seen.update(now, notices=str(len(notices)))
    return lines


# ------------------------------------------------------------------------------- listing


async def list_campaigns(
    client: Client, limit: int = 50, query_within_s: float = QUERY_WITHIN_S
) -> list[dict[str, Any]]:
    """The newest `limit` campaigns, running ones first, each a `campaign_row`; running ones carry
    their `progress` query's answer (asked concurrently, each bounded by `query_within_s`)."""
    executions = [e async for e in client.list_workflows(CAMPAIGNS, limit=limit)]
    answers = await asyncio.gather(*(_progress(client, e, query_within_s) for e in executions))
    now = datetime.now(UTC)
    rows = [campaign_row(e, answer, now) for e, answer in zip(executions, answers)]
    return sorted(rows, key=lambda row: (row["status"] != "running", -row["started_ts"]))


async def _progress(client: Client, execution: WorkflowExecution, within_s: float) -> tuple[Any, str | None]:
    """(the progress query's answer, None), or (None, why there is none) as one line; closed
    campaigns are not asked (their result, not their progress, tells what they did)."""
    if execution.status != WorkflowExecutionStatus.RUNNING:
        return None, None
    handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
    try:
        rpc = timedelta(seconds=within_s)
        return await asyncio.wait_for(handle.query("progress", rpc_timeout=rpc), within_s + 0.5), None
    except (TimeoutError, RPCError):
        return None, f"no worker answered the progress query within {within_s:g} s (is `gpuyantra worker cpu` running?)"
    except Exception as exc:  # noqa: BLE001 - shown as the campaign's one-line status, never raised
        return None, f"progress query failed: {one_line(exc)}"


def campaign_row(execution: WorkflowExecution, answer: tuple[Any, str | None], now: datetime) -> dict[str, Any]:
    """One campaign as JSON: id, status, times and, for a running one, `progress_fields`."""
    progress, problem = answer
    started, closed = execution.start_time, execution.close_time
    status = execution.status.name.lower() if execution.status is not None else "unknown"
    return {
        "id": execution.id,
        "run_id": execution.run_id,
        "status": status,
        "model": execution.typed_search_attributes.get(MODEL_KEY),
        "deployed": execution.typed_search_attributes.get(DEPLOYED_KEY),
        "best_speedup": execution.typed_search_attributes.get(BEST_SPEEDUP_KEY),
        "started": started.isoformat(timespec="seconds"),
        "started_ts": started.timestamp(),
        "closed": closed.isoformat(timespec="seconds") if closed else None,
        "elapsed_s": round(((closed or now) - started).total_seconds(), 1),
        **progress_fields(progress if status == "running" else None),
        "progress_error": problem,
    }


def progress_fields(progress: Any) -> dict[str, Any]:
    """Stage, per-target stage / iteration / best reward, and the best reward of all targets, from
    the `progress` query's answer (workflows/campaign.py); empty values when there is none."""
    if not isinstance(progress, dict):
        return {"stage": None, "deploying": None, "targets": [], "best_reward": None, "notices": [], "waiting": None}
    targets = [
        {
            "target": key,
            "stage": target.get("stage"),
            "iteration": target.get("iteration"),
            "best_reward": target.get("best_reward"),
        }
        for key, target in sorted((progress.get("targets") or {}).items())
        if isinstance(target, dict)
    ]
    rewards = [t["best_reward"] for t in targets if isinstance(t["best_reward"], int)]
    return {
        "stage": progress.get("stage"),
        "deploying": progress.get("deploying"),
        "targets": targets,
        "best_reward": max(rewards) if rewards else None,
        "notices": list(progress.get("notices") or []),
        "waiting": progress.get("waiting"),  # what the campaign waits for (no GPU worker of its kind polls)
    }


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`: what a status line shows of an error, never a traceback."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
