"""Which GPU workers may verify a campaign's candidates, and on which task queue to reach them.

Every GPU worker polls the shared GPU queue, its hardware kind's queue and its own device's queue
(gpuyantra/config.py), under an identity that names its kind and device (`worker_identity`). The
CPU worker's `gpu_workers` activity asks Temporal which of them poll a kind's queue now; the
campaign (workflows/campaign.py, `_verify_queue`) then picks with `choose_verify_queue`. This module
imports only the standard library and temporalio: the workflow imports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from temporalio import activity

from gpuyantra.config import GPU_TASK_QUEUE, gpu_device_queue, gpu_kind_queue

IDENTITY_TAG = "gpuyantra-gpu"


def worker_identity(kind: str, device_key: str, host: str, pid: int | None = None) -> str:
    """`1234@host gpuyantra-gpu nvidia-h100-80gb GPU-5c1f...`: Temporal lists it for every poller."""
    return f"{pid if pid is not None else os.getpid()}@{host} {IDENTITY_TAG} {kind} {device_key}"


@dataclass(frozen=True)
class Poller:
    """A GPU worker as its identity names it."""

    kind: str
    device_key: str
    identity: str


def parse_identity(identity: str) -> Poller | None:
    """The kind and device of a GPU worker's identity; None for any other poller."""
    parts = identity.split(" ")
    if len(parts) != 4 or parts[1] != IDENTITY_TAG:
        return None
    return Poller(kind=parts[2], device_key=parts[3], identity=identity)


def choose_verify_queue(kind: str, devices: list[str], serving_device: str | None, turn: int) -> str | None:
    """Where the `turn`-th verification of a campaign goes: None when no worker of `kind` polls
    (the campaign waits); a device queue of a GPU the server does not use, in turns, when the
    server's GPU is known and other devices of its kind poll; else the kind's queue, which Temporal
    hands to whichever of its workers is free (the serving GPU's own worker included: it verified
    there before routing too)."""
    if not devices:
        return None
    others = sorted(device for device in devices if device != serving_device)
    if serving_device is not None and others:
        return gpu_device_queue(kind, others[turn % len(others)])
    return gpu_kind_queue(kind)


def waiting_note(kind: str, other_kinds: list[str] | tuple[str, ...] = ()) -> str:
    """What a campaign's progress says while no GPU worker of its server's kind polls; `other_kinds`,
    the kinds of the GPU workers that do poll, show a kind named two ways in one line."""
    note = (
        f"waiting for a GPU worker of kind {kind}: none polls {gpu_kind_queue(kind)} "
        f"(start one on such a GPU: gpuyantra worker gpu, or --hardware-kind {kind})"
    )
    if other_kinds:
        note += f"; GPU workers of kind {', '.join(sorted(other_kinds))} poll, none verifies for {kind}"
    return note


@dataclass(frozen=True, kw_only=True)
class GpuWorkers:
    """gpu_workers' answer: a kind's queue, the device keys of its workers and their identities."""

    kind: str
    queue: str
    devices: list[str] = field(default_factory=list)
    pollers: list[str] = field(default_factory=list)
    other_kinds: list[str] = field(default_factory=list)  # kinds of the other GPU workers polling now


@activity.defn(name="gpu_workers")
async def gpu_workers(kind: str) -> GpuWorkers:
    """The GPU workers of `kind` Temporal has seen polling its queue lately (the server keeps a
    poller for a few minutes after its last poll)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    client = activity.client()

    async def polling(queue: str) -> list[Poller]:
        answer = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        return [p for p in (parse_identity(info.identity) for info in answer.pollers) if p]

    queue = gpu_kind_queue(kind)
    pollers = [p for p in await polling(queue) if p.kind == kind]
    # Every GPU worker also polls the shared queue: who polls there, when none of `kind` does.
    others = [] if pollers else sorted({p.kind for p in await polling(GPU_TASK_QUEUE) if p.kind != kind})
    return GpuWorkers(
        kind=kind,
        queue=queue,
        devices=sorted({p.device_key for p in pollers}),
        pollers=sorted(p.identity for p in pollers),
        other_kinds=others,
    )


ACTIVITIES = [gpu_workers]
