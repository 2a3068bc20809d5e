"""Run the workers of one role against a Temporal server until cancelled."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

from temporalio.client import Client
from temporalio.worker import Worker

from gpuyantra import config

ROLES = ("gpu", "cpu", "all")
log = logging.getLogger("gpuyantra.worker")


def build_workers(client: Client, role: str, executor: concurrent.futures.Executor) -> list[Worker]:
    """The workers a role runs. The workflow runs beside the CPU activities (no GPU needed)."""
    from activities import cpu, gpu
    from workflows.campaign import OptimizeCampaign

    workers: list[Worker] = []
    if role in ("cpu", "all"):
        workers.append(Worker(client, task_queue=config.CONTROL_TASK_QUEUE, workflows=[OptimizeCampaign]))
        workers.append(
            Worker(
                client,
                task_queue=config.CPU_TASK_QUEUE,
                activities=cpu.ACTIVITIES,
                activity_executor=executor,
                max_concurrent_activities=4,
            )
        )
    if role in ("gpu", "all"):
        # One verification at a time: timings must not share the device with each other.
        workers.append(
            Worker(
                client,
                task_queue=config.GPU_TASK_QUEUE,
                activities=gpu.ACTIVITIES,
                activity_executor=executor,
                max_concurrent_activities=1,
            )
        )
    return workers


async def run_workers(role: str, address: str, ready: asyncio.Event | None = None) -> None:
    if role not in ROLES:
        raise ValueError(f"unknown worker role {role!r}; choose one of {', '.join(ROLES)}")
    from gpuyantra.campaign_client import connect
    from gpuyantra.triton_env import prepare

    client = await connect(address)  # first: a wrong address fails in seconds, before torch loads
    device = prepare()
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as executor:
        workers = build_workers(client, role, executor)
        log.info("worker %s polling %s on %s (device %s)", role, [w.task_queue for w in workers], address, device)
        print(
            f"gpuyantra worker {role}: polling {', '.join(w.task_queue for w in workers)} at {address} "
            f"(kernels on {device})",
            flush=True,
        )
        if ready is not None:
            ready.set()
        await asyncio.gather(*(worker.run() for worker in workers))
