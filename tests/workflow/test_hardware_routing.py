"""Verification routed by hardware kind, on a real Temporal dev server: GPU-role workers declaring
different kinds (scripted activities standing in for the GPU work, the real queues, identities and
GPU-worker lookup), campaigns against servers of each kind, and a campaign whose kind no worker polls."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

import gpuyantra.campaign.records as records
from activities.cpu import preflight_campaign  # the real one: one campaign per server
from gpuyantra.config import CONTROL_TASK_QUEUE, CPU_TASK_QUEUE, GPU_TASK_QUEUE, gpu_device_queue, gpu_kind_queue
from gpuyantra.hardware import DeviceFacts, hardware_kind
from workers import routing
from workers.main import gpu_queues
from workflows.campaign import OptimizeCampaign

TARGET = {"op": "rms_norm", "module_class": "N", "qualified_class": "x.N", "modules": 2, "shapes": [[1, 64]]}


# ------------------------------------------------------------------------------------------ units
@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "nvidia-a100-40gb"),
        ("NVIDIA H100 PCIe", "nvidia-h100-pcie"),
        ("NVIDIA H200", "nvidia-h200"),
        ("Tesla T4", "nvidia-t4"),
        ("cpu", "cpu"),
        ("nvidia-h100-80gb", "nvidia-h100-80gb"),  # a kind stays itself
    ],
)
def test_hardware_kind_keeps_what_changes_timing(name: str, kind: str) -> None:
    assert hardware_kind(name) == kind


def test_a_verification_prefers_a_gpu_the_server_does_not_use() -> None:
    kind, serving = "nvidia-h100-80gb", "GPU-aaa"
    assert routing.choose_verify_queue(kind, [], serving, 0) is None  # none polls: the campaign waits
    only_serving = routing.choose_verify_queue(kind, [serving], serving, 0)
    assert only_serving == gpu_kind_queue(kind)  # the serving GPU's own worker, as before routing
    others = [routing.choose_verify_queue(kind, [serving, "GPU-ccc", "GPU-bbb"], serving, turn) for turn in range(4)]
    assert others == [gpu_device_queue(kind, d) for d in ("GPU-bbb", "GPU-ccc", "GPU-bbb", "GPU-ccc")]
    unknown = routing.choose_verify_queue(kind, [serving, "GPU-bbb"], None, 0)
    assert unknown == gpu_kind_queue(kind)  # the server's GPU unknown: any worker of the kind


def test_a_gpu_workers_identity_names_its_kind_and_device() -> None:
    identity = routing.worker_identity("nvidia-h200", "GPU-5c1f", "box", pid=7)
    assert routing.parse_identity(identity) == routing.Poller("nvidia-h200", "GPU-5c1f", identity)
    assert routing.parse_identity("7@box") is None  # a worker of another kind of program


def facts(kind: str, device_key: str) -> DeviceFacts:
    return DeviceFacts(kind=kind, device="cpu", device_name="cpu", device_key=device_key, host="box")


def test_a_gpu_worker_polls_the_shared_its_kinds_and_its_devices_queue() -> None:
    assert gpu_queues(None) == [GPU_TASK_QUEUE]
    assert gpu_queues(facts("kind-a", "box:cpu")) == [
        GPU_TASK_QUEUE,
        gpu_kind_queue("kind-a"),
        gpu_device_queue("kind-a", "box:cpu"),
    ]


# ----------------------------------------------------------------------- campaigns on the server
class Fleet:
    """Scripted GPU and CPU work. Each server's profile names its hardware kind; each GPU-role worker
    records the verifications it ran (worker name, task queue)."""

    def __init__(self, kinds: dict[str, str], serving_devices: dict[str, str] | None = None) -> None:
        self.kinds = kinds  # server URL -> the hardware kind its profile reports
        self.serving_devices = serving_devices or {}  # server URL -> the GPU its profile names (device_key)
        self.verified: list[tuple[str, str, str]] = []  # (campaign id, worker, task queue)

    def gpu_activities(self, worker: str) -> list[Any]:
        @activity.defn(name="profile_server")
        def profile_server(call: records.ServerCall) -> dict:
            device = self.serving_devices.get(call.server_url)
            return {
                "hardware": "Scripted GPU",
                "hardware_kind": self.kinds[call.server_url],
                "device_key": device,
                "targets": [TARGET],
            }

        @activity.defn(name="benchmark_server")
        def benchmark_server(call: records.BenchmarkInput) -> dict:
            return {"tokens_per_s": 100.0, "relative_spread": 0.0}

        @activity.defn(name="verify_candidate")
        def verify_candidate(request: records.VerifyInput) -> dict:
            self.verified.append((request.campaign_id, worker, activity.info().task_queue))
            return {"reward": 1, "accepted": True, "device": "cpu", "timed_on": {"worker": worker}}

        @activity.defn(name="deploy_kernel")
        def deploy_kernel(request: records.DeployInput) -> dict:
            return {"swap_id": "s1", "modules": 2}

        return [profile_server, benchmark_server, verify_candidate, deploy_kernel]

    @staticmethod
    def cpu_activities() -> list[Any]:
        @activity.defn(name="retrieve_skills")
        def retrieve_skills(request: records.RetrieveInput) -> records.RetrieveResult:
            return records.RetrieveResult(candidates=[], seed=None)

        @activity.defn(name="write_candidate")
        def write_candidate(request: records.WriteInput) -> records.WriteResult:
            return records.WriteResult(source=f"# v{request.iteration}", strategy={}, author="t")

        @activity.defn(name="record_outcome")
        def record_outcome(request: records.OutcomeInput) -> None:
            return None

        @activity.defn(name="learn_skill")
        def learn_skill(request: records.LearnInput) -> str:
            return "skill-1"

        @activity.defn(name="served_rollbacks")
        def served_rollbacks(request: records.ServedMemoryInput) -> list:
            return []

        @activity.defn(name="record_served_rollback")
        def record_served_rollback(request: records.ServedRollbackInput) -> None:
            return None

        return [
            retrieve_skills,
            write_candidate,
            record_outcome,
            learn_skill,
            served_rollbacks,
            record_served_rollback,
            preflight_campaign,
            *routing.ACTIVITIES,
        ]


@contextlib.asynccontextmanager
async def gpu_worker(
    client: Client, fleet: Fleet, name: str, kind: str, pool: concurrent.futures.Executor
) -> AsyncIterator[None]:
    """A GPU-role worker of `kind`: the queues and identity `gpuyantra worker gpu --hardware-kind`
    polls with (workers/main.py), the scripted activities, a client of its own (as its own process
    has: one client runs one worker per queue)."""
    device = facts(kind, f"{name}:cpu")
    identity = routing.worker_identity(kind, device.device_key, device.host)
    client = await Client.connect(client.service_client.config.target_host)
    async with contextlib.AsyncExitStack() as stack:
        for queue in gpu_queues(device):
            activities = fleet.gpu_activities(name)
            await stack.enter_async_context(
                Worker(client, task_queue=queue, activities=activities, activity_executor=pool, identity=identity)
            )
        yield


@contextlib.asynccontextmanager
async def fleet_workers(
    client: Client, control: str, fleet: Fleet, gpus: dict[str, str], pool: concurrent.futures.Executor
) -> AsyncIterator[None]:
    """The campaign's control and CPU workers, and a GPU-role worker per name in `gpus` (its kind)."""
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(Worker(client, task_queue=control, workflows=[OptimizeCampaign]))
        cpu = Worker(client, task_queue=CPU_TASK_QUEUE, activities=Fleet.cpu_activities(), activity_executor=pool)
        await stack.enter_async_context(cpu)
        for name, kind in gpus.items():
            await stack.enter_async_context(gpu_worker(client, fleet, name, kind, pool))
        yield


async def start(client: Client, control: str, server: str) -> WorkflowHandle:
    params = records.CampaignInput(server_url=server, ops=["rms_norm"], min_reward=1, max_iterations=2)
    return await client.start_workflow(
        OptimizeCampaign.run, params, id=f"route-{uuid.uuid4().hex[:8]}", task_queue=control
    )


async def started_identities(handle: WorkflowHandle) -> dict[str, set[str]]:
    """The workflow history's verify_candidate tasks: task queue each was scheduled on, and the
    identity of each worker that started one."""
    history = await handle.fetch_history()
    scheduled = {
        event.event_id: event.activity_task_scheduled_event_attributes
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    out: dict[str, set[str]] = {"queues": set(), "identities": set()}
    for event in history.events:
        if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            continue
        started = event.activity_task_started_event_attributes
        task = scheduled[started.scheduled_event_id]
        if task.activity_type.name == "verify_candidate":
            out["queues"].add(task.task_queue.name)
            out["identities"].add(started.identity)
    return out


async def test_each_campaign_verifies_only_on_its_servers_kind(env) -> None:
    suffix = uuid.uuid4().hex[:6]
    kind_a, kind_b = f"kind-a-{suffix}", f"kind-b-{suffix}"
    fleet = Fleet({"http://x": kind_a, "http://y": kind_b})
    control = CONTROL_TASK_QUEUE + suffix
    client = env.client
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        async with fleet_workers(client, control, fleet, {"worker-a": kind_a, "worker-b": kind_b}, pool):
            first, second = await start(client, control, "http://x"), await start(client, control, "http://y")
            results = await asyncio.gather(first.result(), second.result())
    assert [r["deployed"][0]["op"] for r in results] == ["rms_norm", "rms_norm"]  # both campaigns ran through
    assert results[0]["deployed"][0]["verdict"]["timed_on"] == {"worker": "worker-a"}  # verdicts name the device
    ran = {(campaign, worker, queue) for campaign, worker, queue in fleet.verified}
    assert {(c, w) for c, w, _ in ran} == {(first.id, "worker-a"), (second.id, "worker-b")}
    assert {q for _, _, q in ran} == {gpu_kind_queue(kind_a), gpu_kind_queue(kind_b)}
    for handle, kind, worker in ((first, kind_a, "worker-a"), (second, kind_b, "worker-b")):
        seen = await started_identities(handle)
        assert seen["queues"] == {gpu_kind_queue(kind)}
        assert seen["identities"] == {routing.worker_identity(kind, f"{worker}:cpu", "box")}


async def test_with_no_worker_of_its_kind_a_campaign_waits_and_says_so(env) -> None:
    suffix = uuid.uuid4().hex[:6]
    kind = f"kind-none-{suffix}"
    fleet = Fleet({"http://s.test": kind})
    control = CONTROL_TASK_QUEUE + suffix
    client = env.client
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        # Another kind's worker: it reaches the server (profile, benchmark), never verifies for it.
        async with fleet_workers(client, control, fleet, {"worker-other": f"kind-other-{suffix}"}, pool):
            handle = await start(client, control, "http://s.test")
            progress: dict[str, Any] = {}
            for _ in range(100):  # bounded: the profile and the first lookup take well under a second
                progress = await handle.query(OptimizeCampaign.progress)
                if progress.get("waiting"):
                    break
                await asyncio.sleep(0.1)
            assert progress["waiting"].startswith(routing.waiting_note(kind))
            # The worker of the other kind is named: a kind spelled two ways reads in one line.
            assert f"kind-other-{suffix}" in progress["waiting"].split("; ")[-1]
            assert progress["targets"]["rms_norm:N"]["stage"] == "waiting-for-gpu-worker"
            assert fleet.verified == []  # nothing was timed on the wrong hardware meanwhile
            async with gpu_worker(client, fleet, "worker-late", kind, pool):  # a worker of its kind joins
                result = await handle.result()
            trail = (await handle.query(OptimizeCampaign.progress))["targets"]["rms_norm:N"]["trail"]
    assert result["deployed"][0]["op"] == "rms_norm"
    assert {worker for _, worker, _ in fleet.verified} == {"worker-late"}
    assert trail[trail.index("waiting-for-gpu-worker (iteration 1)") + 1] == "verify (iteration 1)"


async def test_verifications_go_to_the_gpu_the_server_does_not_use(env) -> None:
    suffix = uuid.uuid4().hex[:6]
    kind = f"kind-two-{suffix}"
    fleet = Fleet({"http://x": kind}, serving_devices={"http://x": "on-server:cpu"})  # the server's GPU
    control = CONTROL_TASK_QUEUE + suffix
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        async with fleet_workers(env.client, control, fleet, {"on-server": kind, "spare": kind}, pool):
            # Until Temporal lists both as pollers the campaign cannot tell the devices apart (it then
            # uses the kind's queue, which either may take): started once both are seen.
            await pollers_seen(env.client, gpu_kind_queue(kind), 2)
            handle = await start(env.client, control, "http://x")
            result = await handle.result()
    assert result["deployed"][0]["op"] == "rms_norm"
    assert {(worker, queue) for _, worker, queue in fleet.verified} == {("spare", gpu_device_queue(kind, "spare:cpu"))}


async def pollers_seen(client: Client, queue: str, count: int, within_s: float = 120.0) -> None:
    """Bounded: a loaded machine took over 30 s to list a just-started worker's polls."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    for _ in range(int(within_s / 0.2)):
        if len((await client.workflow_service.describe_task_queue(request)).pollers) >= count:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"fewer than {count} pollers on {queue} within {within_s:g} s")


async def test_a_gpu_worker_with_device_facts_polls_its_kind_and_device_queues(env) -> None:
    from workers.main import build_workers

    device = facts("kind-x", "box:cpu")
    client = await Client.connect(env.client.service_client.config.target_host)  # one worker per queue each
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as executor:
        workers = build_workers(client, "gpu", executor, gpu_slots=1, facts=device)
        identities = {w.config().get("identity") for w in workers}
    assert [w.task_queue for w in workers] == gpu_queues(device)
    assert identities == {routing.worker_identity("kind-x", "box:cpu", "box")}
