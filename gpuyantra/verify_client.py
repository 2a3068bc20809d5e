"""`gpuyantra verify` through this machine's GPU worker (the `VerifyKernel` workflow).

A new process pays for its imports before its first verdict: torch and triton in it and in its
sandbox child, the child's CUDA context and torch's compiler modules (the host-op recorder's
dispatch mode imports them): 12-17 s for a warm verdict on an H200 host. The GPU worker `gpuyantra
up` runs keeps sandbox children started and warm: the same verdict took 1.6-3.7 s through it.

A worker counts as up when both queues the workflow needs have a poller seen recently: the control
queue's workflow poller (the `cpu` role runs the workflow) and the GPU queue's activity poller.
Nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any

from gpuyantra import config

CONNECT_WITHIN_S = 1.5  # nothing listening answers at once; a server that does not answer is not used
# Pollers long-poll about a minute at a time; one not seen for longer has stopped (or every slot is busy).
POLLER_SEEN_WITHIN_S = 90.0


class WorkerUnavailable(RuntimeError):
    """No GPU worker of this machine's Temporal can take the verification; the message says why."""


class WorkerLost(WorkerUnavailable):
    """A worker took the verification and its workflow failed (worker gone, timed out)."""


class TargetRefused(RuntimeError):
    """The worker could not make the target the request names (`--problem`, `--module`) an open
    target: a usage error, the worker's one-line reason."""


# The type of the worker's ApplicationError for a target it cannot make (activities/gpu.py verify_file).
TARGET_UNUSABLE = "TargetUnusable"


async def _connect(address: str) -> Any:
    from temporalio.client import Client

    from gpuyantra.temporal_auth import connect_options

    options = connect_options()  # Temporal's TLS and API key, as the workers and `optimize` use them
    if not _listening(address):
        # Said without the SDK: a client whose connection was refused leaves Rust threads that can
        # crash the process as it exits (SIGSEGV/SIGABRT instead of the usage error's exit 2).
        raise WorkerUnavailable(f"no Temporal server answers at {address} (connection refused)")
    try:
        connecting = Client.connect(address, namespace=config.temporal_namespace(), **options)
        return await asyncio.wait_for(connecting, CONNECT_WITHIN_S)
    except Exception as exc:  # noqa: BLE001 - refused, timed out, bad address: all mean "not here"
        raise WorkerUnavailable(f"no Temporal server answers at {address} ({type(exc).__name__})") from None


def _listening(address: str) -> bool:
    """Whether anything accepts TCP connections at `host:port` (True where the address is not of
    that form: the SDK then says what is wrong with it)."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return True
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_WITHIN_S):
            return True
    except OSError:
        return False


async def _polled_recently(client: Any, queue: str, kind: Any) -> bool:
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    reply = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind),
        timeout=timedelta(seconds=5),
    )
    now = time.time()
    return any(now - poller.last_access_time.ToSeconds() < POLLER_SEEN_WITHIN_S for poller in reply.pollers)


async def _check_workers(client: Any, address: str) -> None:
    from temporalio.api.enums.v1 import TaskQueueType

    workflow_kind = TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
    activity_kind = TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
    if not await _polled_recently(client, config.GPU_TASK_QUEUE, activity_kind):
        raise WorkerUnavailable(f"no GPU worker polls {config.GPU_TASK_QUEUE} at {address}")
    if not await _polled_recently(client, config.CONTROL_TASK_QUEUE, workflow_kind):
        raise WorkerUnavailable(f"no worker runs workflows on {config.CONTROL_TASK_QUEUE} at {address}")


def workflow_id(file_name: str) -> str:
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in file_name.rsplit("/", 1)[-1].removesuffix(".py"))
    return f"verify-{stem[:40] or 'candidate'}-{uuid.uuid4().hex[:8]}"


async def _verify(request: dict[str, Any], address: str, timeout_s: float) -> tuple[str, dict[str, Any]]:
    from temporalio.client import WorkflowFailureError

    client = await _connect(address)
    await _check_workers(client, address)
    ident = workflow_id(request["file_name"])
    handle = await client.start_workflow(
        "VerifyKernel",
        request,
        id=ident,
        task_queue=config.CONTROL_TASK_QUEUE,
        execution_timeout=timedelta(seconds=timeout_s),
        result_type=dict,
    )
    try:
        return ident, await handle.result()
    except WorkflowFailureError as exc:
        cause: BaseException = exc
        while getattr(cause, "cause", None) is not None:
            cause = cause.cause  # type: ignore[attr-defined]
        if getattr(cause, "type", None) == TARGET_UNUSABLE:
            raise TargetRefused(getattr(cause, "message", None) or str(cause)) from None
        raise WorkerLost(f"workflow {ident} failed: {cause}") from None


def verify_on_worker(request: dict[str, Any], timeout_s: float) -> tuple[str, dict[str, Any]]:
    """(workflow id, verdict) from this machine's GPU worker, or WorkerUnavailable saying why not
    (TargetRefused: the worker cannot make the named target). `request` holds VerifyFileInput's
    fields as JSON values."""
    return asyncio.run(_verify(request, config.temporal_address(), timeout_s))
