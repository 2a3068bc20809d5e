"""Run the workers of one role against a Temporal server until cancelled."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable

from temporalio.client import Client
from temporalio.worker import Worker

from gpuyantra import config
from gpuyantra.hardware import DeviceFacts

ROLES = ("gpu", "cpu", "all")
# GPU-queue activities in flight at once on a CUDA device. Verifications overlap their setup,
# compilation and correctness work; their timing phases still run one at a time (the verifier's
# GPU-wide timing lock), so no verdict is measured under another's load. Enough slots that a
# deployment or a served-speed check never queues behind a campaign's verifications.
CUDA_GPU_SLOTS = 8
log = logging.getLogger("gpuyantra.worker")


def default_gpu_slots(device: str) -> int:
    """On a CPU the interpreter's verifications only share the same cores: one at a time."""
    return CUDA_GPU_SLOTS if device.startswith("cuda") else 1


def gpu_queues(facts: DeviceFacts | None) -> list[str]:
    """What a GPU worker polls: the shared GPU queue (work that needs a server's reach, and campaigns
    that predate routing), and with its device's facts its hardware kind's queue and its device's."""
    if facts is None:
        return [config.GPU_TASK_QUEUE]
    return [
        config.GPU_TASK_QUEUE,
        config.gpu_kind_queue(facts.kind),
        config.gpu_device_queue(facts.kind, facts.device_key),
    ]


def build_workers(
    client: Client,
    role: str,
    executor: concurrent.futures.Executor,
    gpu_slots: int = 1,
    facts: DeviceFacts | None = None,
) -> list[Worker]:
    """The workers a role runs. The workflow runs beside the CPU activities (no GPU needed); a GPU
    worker with `facts` polls its kind's and device's queues too, under an identity naming them."""
    from activities import cpu, gpu
    from workers import routing
    from workflows.campaign import OptimizeCampaign
    from workflows.verify import VerifyKernel

    workers: list[Worker] = []
    if role in ("cpu", "all"):
        workers.append(Worker(client, task_queue=config.CONTROL_TASK_QUEUE, workflows=[OptimizeCampaign, VerifyKernel]))
        workers.append(
            Worker(
                client,
                task_queue=config.CPU_TASK_QUEUE,
                activities=[*cpu.ACTIVITIES, *routing.ACTIVITIES],
                activity_executor=executor,
                max_concurrent_activities=4,
            )
        )
    if role in ("gpu", "all"):
        # Each queue its own slots: a verification on the kind's queue never holds a served-speed
        # check or a deployment on the shared one back.
        identity = routing.worker_identity(facts.kind, facts.device_key, facts.host) if facts else None
        workers += [
            Worker(
                client,
                task_queue=queue,
                activities=gpu.ACTIVITIES,
                activity_executor=executor,
                max_concurrent_activities=gpu_slots,
                identity=identity,
            )
            for queue in gpu_queues(facts)
        ]
    return workers


MODEL_CODE = "transformers.modeling_utils"  # what a verdict's contract layer imports first, ~12 s cold


def _in_background(name: str, work: Callable[[], object]) -> threading.Thread:
    """`work` on a daemon thread while the worker waits for work; a head start only, so a failure is
    dropped (the verification that needs it does it itself and reports what goes wrong)."""

    def run() -> None:
        with contextlib.suppress(Exception):
            work()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _import_model_code_in_background() -> threading.Thread:
    """Import the model library's code: the first verifications of a campaign spent 12-15 s in their
    contract layer importing it (measured on an H200 host). Logged when done: a verification started
    before then waits for it."""

    from gpuyantra.ops.base import import_model_code

    def import_the_model_code() -> None:
        started = time.monotonic()
        import_model_code(MODEL_CODE)  # a verdict's contract importing a model's module waits for it
        log.info("model code (%s) imported in %.1f s", MODEL_CODE, time.monotonic() - started)

    return _in_background("import-model-code", import_the_model_code)


def _measure_copy_bandwidth() -> None:
    import dataclasses

    import torch

    from gpuyantra.hardware import announce, announced
    from gpuyantra.verifier import baselines, bench

    name = torch.cuda.get_device_name()
    baselines.measure_bandwidth_if_missing(name, bench.measure_copy_bandwidth)
    facts = announced()
    if facts is not None and facts.copy_gb_per_s is None:  # announced before it was measured: again, with it
        measured = dataclasses.replace(facts, copy_gb_per_s=baselines.bandwidth_cache().get(name))
        announce(measured)
        log.info("device facts %s", measured.to_dict())


def _measure_copy_bandwidth_in_background() -> threading.Thread:
    """The GPU's copy bandwidth (the physical floor verdicts are judged against), measured once
    (`baselines.measure_bandwidth_if_missing`), so no verification's child waits for the GPU alone to
    measure it."""
    return _in_background("measure-copy-bandwidth", _measure_copy_bandwidth)


def _start_sandbox_spares(count: int) -> None:
    """One warm verifier child per GPU slot, started now: a campaign's first verifications run at once."""
    from gpuyantra.verifier.sandbox import keep_spare, set_spare_count

    set_spare_count(count)
    keep_spare("cuda")


def _start_fork_server(device: str) -> None:
    """Verifications on a CPU keep no warm spare (a spare is there for the CUDA context's start), but
    their children are forked with torch imported: 2-3 CPU-s saved per candidate."""
    from gpuyantra.verifier.sandbox import start_fork_server

    start_fork_server(device)


async def run_workers(
    role: str,
    address: str,
    ready: asyncio.Event | None = None,
    gpu_slots: int | None = None,
    hardware_kind: str | None = None,
    machine_device: str | None = None,
) -> None:
    """Run `role`'s workers until cancelled. `hardware_kind` overrides the kind the GPU worker
    derives from its device's name; `machine_device` is how the machine numbers the one GPU this
    process sees (`gpuyantra worker gpu --device cuda:1`)."""
    if role not in ROLES:
        raise ValueError(f"unknown worker role {role!r}; choose one of {', '.join(ROLES)}")
    sys.setswitchinterval(config.switch_interval_s())
    from gpuyantra.campaign_client import connect
    from gpuyantra.hardware import announce, device_facts
    from gpuyantra.triton_env import prepare

    client = await connect(address)  # first: a wrong address fails in seconds, before torch loads
    device = prepare()
    facts = device_facts(device, hardware_kind, machine_device) if role in ("gpu", "all") else None
    if role in ("gpu", "all"):
        _import_model_code_in_background()
    slots = gpu_slots if gpu_slots is not None else default_gpu_slots(device)
    if facts is not None:
        announce(facts)
    if role in ("gpu", "all") and device == "cuda":
        _start_sandbox_spares(slots)
        _measure_copy_bandwidth_in_background()
    elif role in ("gpu", "all"):
        _start_fork_server(device)
    gpu_threads = slots * len(gpu_queues(facts)) if role in ("gpu", "all") else 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=4 + gpu_threads) as executor:
        workers = build_workers(client, role, executor, slots, facts)
        log.info("worker %s polling %s on %s (device %s)", role, [w.task_queue for w in workers], address, device)
        if facts is not None:  # what this worker holds, announced once (verdicts repeat it as `timed_on`)
            log.info("device facts %s", facts.to_dict())
        gpu_note = f", {slots} GPU-queue slot(s) per queue" if role in ("gpu", "all") else ""
        held = f"; holds {facts.describe()}" if facts is not None else ""
        print(
            f"gpuyantra worker {role}: polling {', '.join(w.task_queue for w in workers)} at {address} "
            f"(kernels on {device}{gpu_note}){held}",
            flush=True,
        )
        if ready is not None:
            ready.set()
        await asyncio.gather(*(worker.run() for worker in workers))
