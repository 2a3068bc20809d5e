"""The campaign's control flow on a real Temporal dev server, with scripted activities standing in
for the GPU and CPU work, so each exit rule of the write/verify loop is pinned down."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from activities.cpu import preflight_campaign  # the real one: op names and one campaign per server
from gpuyantra.campaign.records import (
    BenchmarkInput,
    CampaignInput,
    CompareInput,
    DeployInput,
    LearnInput,
    OutcomeInput,
    RetrieveInput,
    RetrieveResult,
    RollbackAnswer,
    RollbackInput,
    ServedMemoryInput,
    ServedRollback,
    ServedRollbackInput,
    ServerCall,
    ServerProfile,
    SkillSeed,
    SwapAnswer,
    VerdictSummary,
    VerifyInput,
    WriteInput,
    WriteResult,
)
from gpuyantra.config import CONTROL_TASK_QUEUE, CPU_TASK_QUEUE, GPU_TASK_QUEUE
from gpuyantra.report.page import render_html
from gpuyantra.served_speed import Measurement, PairedAnswer, measurement_of
from workflows.campaign import OptimizeCampaign

TARGET = {
    "op": "rms_norm",
    "module_class": "Qwen2RMSNorm",
    "qualified_class": "x.Qwen2RMSNorm",
    "modules": 5,
    "adapter": [],
    "shapes": [[1, 64]],
    "dtype": "float32",
}


class Script:
    """Rewards the fake verifier hands out, in order, and a log of what was called. The fake server
    serves batch 1 and batch 8 (its profile's `served_batches`): 100 and 800 tokens/s, 10 % more
    once a kernel is in (20 % less with `slower_after_deploy`; `batch8_after` sets batch 8's own)."""

    def __init__(
        self,
        rewards: list[int],
        device: str = "cuda",
        slower_after_deploy: bool = False,
        verifications_meet: int = 0,
        model: str | None = None,
        batch8_after: float | None = None,
        batch8_spread: float = 0.0,
        paired_drops: list[float] | None = None,
        memory: dict[str, list[dict[str, Any]]] | None = None,
        targets: list[dict[str, Any]] | None = None,
    ) -> None:
        self.rewards = rewards
        # What the fake profile ranks (default: rms_norm and softmax, no gains estimated).
        self.targets = targets if targets is not None else [TARGET, {**TARGET, "op": "softmax", "module_class": "S"}]
        # The skill store's served-speed rollbacks by skill id (share one dict between campaigns).
        self.memory = {} if memory is None else memory
        # /admin/compare's paired drops per round (every batch alike); None: a server without the route.
        self.paired_drops = paired_drops
        self.compared: list[CompareInput] = []
        self.batch8_after = batch8_after
        self.batch8_spread = batch8_spread
        self.benchmarked: list[list[int] | None] = []  # the batches each benchmark_server call asked for
        self.model = model  # what the fake profile names as the served model
        self.slower_after_deploy = slower_after_deploy
        self.device = device
        self.calls: list[str] = []
        self.deployed_gates: list[dict[str, list[int]] | None] = []  # each deploy's rows gate
        self.outcomes: list[float] = []
        self.events: list[tuple[str, str]] = []  # (event, op), in the order they happened
        self._events_lock = threading.Lock()
        # First verifications wait for each other (bounded): they finish only if they run at once.
        self.meet = threading.Barrier(verifications_meet, timeout=30) if verifications_meet else None

    def event(self, name: str, op: str = "") -> None:
        with self._events_lock:
            self.events.append((name, op))

    def served(self, batch: int, swapped: bool) -> dict:
        """The fake server's /admin/benchmark answer at `batch`."""
        speed = 100.0 * batch
        if swapped:
            speed = (80.0 if self.slower_after_deploy else 110.0) * batch
            if batch == 8 and self.batch8_after is not None:
                speed = self.batch8_after
        spread = self.batch8_spread if batch == 8 else 0.0
        return {"tokens_per_s": speed, "batch": batch, "relative_spread": spread}

    def activities(self) -> tuple[list[Any], list[Any]]:
        @activity.defn(name="profile_server")
        def profile_server(call: ServerCall) -> ServerProfile:
            self.calls.append("profile")
            return ServerProfile.from_answer(
                {
                    "hardware": "test-gpu",
                    "targets": self.targets,
                    "served_batches": [1, 8],
                    **({"model": self.model} if self.model else {}),
                }
            )

        @activity.defn(name="benchmark_server")
        def benchmark_server(call: BenchmarkInput) -> Measurement:
            self.event("benchmark-start")
            self.benchmarked.append(call.batches)
            time.sleep(0.05)  # a window another deploy could land in, were deploys not serialized
            self.event("benchmark-end")
            swapped = "deploy" in self.calls and "rollback" not in self.calls
            return measurement_of([self.served(batch, swapped) for batch in call.batches or [1]])

        @activity.defn(name="verify_candidate")
        def verify_candidate(request: VerifyInput) -> VerdictSummary:
            reward = self.rewards[min(request.iteration - 1, len(self.rewards) - 1)]
            self.calls.append(f"verify{request.iteration}")
            self.event("verify-start", request.target["op"])
            if self.meet is not None and request.iteration == 1:
                self.meet.wait()
            self.event("verify-end", request.target["op"])
            return VerdictSummary(
                reward=reward,
                accepted=reward >= 1,
                device=self.device,
                failures=[] if reward >= 1 else [{"layer": "correctness", "rule": "mismatch", "message": "m"}],
                speedup_vs_eager=2.0,
                speedup_vs_compile=1.1,
                rows_gate={"kernel": [1], "original": [request.iteration * 8]},
            )

        @activity.defn(name="deploy_kernel")
        def deploy_kernel(request: DeployInput) -> SwapAnswer:
            self.deployed_gates.append(request.rows_gate)
            self.event("deploy-start", request.target["op"])
            time.sleep(0.05)
            self.event("deploy-end", request.target["op"])
            self.calls.append("deploy")
            return SwapAnswer(swap_id="s1", modules=5)

        @activity.defn(name="retrieve_skills")
        def retrieve_skills(request: RetrieveInput) -> RetrieveResult:
            return RetrieveResult(candidates=[], seed=SkillSeed(id="seed-1", op="rms_norm", source="", strategy={}))

        @activity.defn(name="write_candidate")
        def write_candidate(request: WriteInput) -> WriteResult:
            return WriteResult(source=f"# v{request.iteration}", strategy={"i": request.iteration}, author="t")

        @activity.defn(name="record_outcome")
        def record_outcome(request: OutcomeInput) -> None:
            self.outcomes.append(request.reward)

        @activity.defn(name="learn_skill")
        def learn_skill(request: LearnInput) -> str:
            self.calls.append(f"learn{request.iteration}")
            return "skill-1"

        @activity.defn(name="served_rollbacks")
        def served_rollbacks(request: ServedMemoryInput) -> list[ServedRollback]:
            kept = self.memory.get(request.skill_id, [])
            return [ServedRollback.from_dict(r) for r in kept if r["model"] == request.model]

        @activity.defn(name="record_served_rollback")
        def record_served_rollback(request: ServedRollbackInput) -> None:
            entry = {"model": request.model, "campaign": request.campaign_id, "reason": request.reason}
            self.memory.setdefault(request.skill_id, []).append({**entry, "batches": request.batches})

        @activity.defn(name="rollback_swap")
        def rollback_swap(request: RollbackInput) -> RollbackAnswer:
            self.calls.append("rollback")
            return RollbackAnswer(rolled_back=[{"swap_id": request.swap_id}])

        @activity.defn(name="compare_swap")
        def compare_swap(request: CompareInput) -> PairedAnswer:
            self.compared.append(request)
            if self.paired_drops is None:
                return PairedAnswer(measured="none", reason="the server has no /admin/compare")
            batches = []
            for batch in request.batches or [1]:
                without = [100.0 * batch] * len(self.paired_drops)
                with_swap = [speed * (1 - drop) for speed, drop in zip(without, self.paired_drops)]
                batches.append(
                    {
                        "batch": batch,
                        "with": {"tokens_per_s": with_swap[0], "tokens_per_s_samples": with_swap},
                        "without": {"tokens_per_s": without[0], "tokens_per_s_samples": without},
                    }
                )
            return PairedAnswer.from_dict({"measured": "paired", "seconds": 1.0, "batches": batches})

        return (
            [profile_server, benchmark_server, verify_candidate, deploy_kernel, rollback_swap, compare_swap],
            [
                retrieve_skills,
                write_candidate,
                record_outcome,
                learn_skill,
                preflight_campaign,
                served_rollbacks,
                record_served_rollback,
            ],
        )


async def run(client: Client, script: Script, params: CampaignInput) -> dict:
    import concurrent.futures

    gpu, cpu = script.activities()
    queue_suffix = uuid.uuid4().hex[:6]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        async with (
            Worker(client, task_queue=CONTROL_TASK_QUEUE + queue_suffix, workflows=[OptimizeCampaign]),
            Worker(client, task_queue=GPU_TASK_QUEUE, activities=gpu, activity_executor=pool),
            Worker(client, task_queue=CPU_TASK_QUEUE, activities=cpu, activity_executor=pool),
        ):
            return await client.execute_workflow(
                OptimizeCampaign.run,
                params,
                id=f"t-{uuid.uuid4().hex[:8]}",
                task_queue=CONTROL_TASK_QUEUE + queue_suffix,
            )


async def test_loop_stops_at_reward_three_and_deploys(env):
    script = Script(rewards=[-1, 2, 3, 3])
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert [c for c in script.calls if c.startswith("verify")] == ["verify1", "verify2", "verify3"]
    assert "learn3" in script.calls and script.calls[-2:] == ["deploy", "profile"]
    assert script.deployed_gates == [{"kernel": [1], "original": [24]}]  # the deployed verdict's own gate
    assert result["deployed"][0]["iterations"] == 3 and result["deployed"][0]["reward"] == 3
    assert result["profile"]["targets"][0]["op"] == "rms_norm" and result["profile_after"]["hardware"] == "test-gpu"
    assert script.outcomes == [-1.0]  # the seed skill's bandit arm is paid with its own attempt


async def test_below_min_reward_is_learned_but_not_deployed(env):
    script = Script(rewards=[2])
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"], max_iterations=2))
    assert "deploy" not in script.calls and "learn1" in script.calls
    assert result["deployed"] == [] and "below min_reward 3" in result["rejected"][0]["reason"]


async def test_cpu_verdict_stops_after_first_correct_kernel(env):
    script = Script(rewards=[1], device="cpu")
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"], min_reward=1))
    assert [c for c in script.calls if c.startswith("verify")] == ["verify1"]
    assert result["deployed"][0]["reward"] == 1


async def test_no_passing_candidate_reports_reasons(env):
    script = Script(rewards=[-1])
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"], max_iterations=2))
    assert result["deployed"] == []
    assert "no candidate passed verification in 2 iterations" in result["rejected"][0]["reason"]
    assert "correctness/mismatch" in result["rejected"][0]["reason"]


async def test_requested_op_missing_from_model_is_rejected_with_reason(env):
    script = Script(rewards=[3])
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm", "rope"]))
    assert {"op": "rope", "reason": "the served model has no module computing rope"} in result["rejected"]


async def test_swap_that_slows_served_decode_is_rolled_back(env):
    script = Script(rewards=[3], slower_after_deploy=True)
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert script.calls[-2:] == ["deploy", "rollback"] and result["deployed"] == []
    assert "served decode at batch 1 went from 100.0 to 80.0 tokens/s" in result["rejected"][0]["reason"]
    assert result["rejected"][0]["served_speed"]["drop"] == 0.2 and result["warnings"] == []


async def test_a_kernel_serving_rolled_back_is_not_deployed_again_on_that_model(env):
    memory: dict = {}
    first = Script(rewards=[3], slower_after_deploy=True, model="m1", memory=memory)
    await run(env.client, first, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert first.calls[-2:] == ["deploy", "rollback"]
    assert [(r["model"], r["batches"]) for r in memory["skill-1"]] == [("m1", [1, 8])]
    assert "went from 100.0 to 80.0" in memory["skill-1"][0]["reason"]

    again = Script(rewards=[3], slower_after_deploy=True, model="m1", memory=memory)
    result = await run(env.client, again, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert "deploy" not in again.calls and result["deployed"] == []
    reason = result["rejected"][0]["reason"]
    assert reason.startswith("not deployed: serving m1 rolled this same kernel back for speed once")
    assert "went from 100.0 to 80.0" in reason and "redeploy_rolled_back" in reason

    other_model = Script(rewards=[3], slower_after_deploy=True, model="m2", memory=memory)
    await run(env.client, other_model, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert other_model.calls[-2:] == ["deploy", "rollback"]  # measured on its own model

    forced = Script(rewards=[3], model="m1", memory=memory)
    params = CampaignInput(server_url="http://x", ops=["rms_norm"], redeploy_rolled_back=True)
    result = await run(env.client, forced, params)
    assert "deploy" in forced.calls and [d["op"] for d in result["deployed"]] == ["rms_norm"]


async def test_a_drop_the_paired_check_confirms_is_rolled_back_with_its_figures(env):
    script = Script(rewards=[3], slower_after_deploy=True, paired_drops=[0.2, 0.18, 0.21])
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert script.calls[-2:] == ["deploy", "rollback"] and result["deployed"] == []
    assert [(c.swap_id, c.batches) for c in script.compared] == [("s1", [1, 8])]
    rejected = result["rejected"][0]
    assert rejected["reason"].startswith("rolled back: paired measurement")
    assert "batch 1: 20.0% slower with the swap (noise 3.0%)" in rejected["reason"]
    paired = rejected["served_speed"]["paired"]
    assert paired["judged"]["dropped"] == [1, 8] and paired["batches"]["8"]["drops"] is None  # fake leaves them out


async def test_a_drop_the_paired_check_does_not_confirm_is_kept_and_warned(env):
    # The first check read 20% slower against a `before` measured earlier; turned off and on in one
    # window the rounds disagree (one faster, one slower): noise, so the swap stays.
    script = Script(rewards=[3], slower_after_deploy=True, paired_drops=[0.04, -0.03, 0.01])
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert "rollback" not in script.calls and [d["op"] for d in result["deployed"]] == ["rms_norm"]
    assert result["warnings"][0] == (
        "rms_norm kept: the first check read a drop; paired measurement, the swap turned off and on in "
        "the same window: batch 1: 1.0% slower with the swap (noise 7.0%); "
        "batch 8: 1.0% slower with the swap (noise 7.0%)"
    )
    assert result["deployed"][0]["served_speed"]["paired"]["judged"]["decision"] == "keep"


async def test_a_drop_at_batch_eight_rolls_back_though_batch_one_improved(env):
    script = Script(rewards=[3], batch8_after=600.0)
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert script.calls[-2:] == ["deploy", "rollback"] and result["deployed"] == []
    # Before and the check, each at both batches; the campaign's "after" is the measurement of what
    # the rollback put back (the first one), not a third benchmark.
    assert script.benchmarked == [[1, 8], [1, 8]]
    assert result["served_speed"]["after_source"] == "last check"
    assert result["served_speed"]["after"]["tokens_per_s"] == 100.0
    rejected = result["rejected"][0]
    assert rejected["reason"].startswith(
        "rolled back: served decode at batch 8 went from 800.0 to 600.0 tokens/s (25.0% slower, "
    )
    assert "batch 1: 100.0 -> 110.0 tokens/s" in rejected["reason"]
    served = rejected["served_speed"]
    assert served["dropped_batches"] == [8] and served["drop"] == -0.1  # batch 1, on top, as before
    assert served["batches"]["8"]["decision"] == "rollback" and served["batches"]["1"]["decision"] == "keep"
    assert "served decode at batch 8 went from 800.0 to 600.0" in render_html(result)  # the report reads it


async def test_a_dip_at_batch_eight_within_its_spread_is_kept_and_warned(env):
    script = Script(rewards=[3], batch8_after=760.0, batch8_spread=0.1)
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert [d["op"] for d in result["deployed"]] == ["rms_norm"]
    assert result["warnings"] == [
        "rms_norm deployed, batch 8: served speed went from 800.0 to 760.0 tokens/s "
        "(5.0% slower; within the measured noise of 10.0%, so kept)",
        "campaign, batch 8: served speed went from 800.0 to 760.0 tokens/s (5.0% slower; 1 kernel(s) deployed)",
    ]
    by_batch = result["served_speed"]["batches"]
    assert by_batch["1"]["after"]["tokens_per_s"] == 110.0 and by_batch["8"]["after"]["tokens_per_s"] == 760.0
    assert result["served_speed"]["after"]["tokens_per_s"] == 110.0  # batch 1 on top, as before
    assert "batch 8: served speed went from 800.0 to 760.0" in render_html(result)  # the report reads it


async def test_two_targets_verify_concurrently_and_deploy_one_at_a_time(env):
    script = Script(rewards=[3], verifications_meet=2)
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm", "softmax"]))
    assert sorted(d["op"] for d in result["deployed"]) == ["rms_norm", "softmax"]
    order = {event: i for i, event in enumerate(script.events)}
    for op, other in (("rms_norm", "softmax"), ("softmax", "rms_norm")):  # each started before the other ended
        assert order[("verify-start", op)] < order[("verify-end", other)]
    server_side = [name for name, _ in script.events if name.startswith(("deploy", "benchmark"))]
    swap_and_check = ["deploy-start", "deploy-end", "benchmark-start", "benchmark-end"]
    assert server_side == ["benchmark-start", "benchmark-end", *swap_and_check, *swap_and_check]
    # before, two swaps each checked alone; the last check measured what is deployed: the "after"


async def test_swap_that_speeds_served_decode_is_kept_with_e2e_numbers(env):
    script = Script(rewards=[3])
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert result["deployed"][0]["e2e_tokens_per_s"] == {"before": 100.0, "after": 110.0}
    assert result["e2e"] == {"tokens_per_s_before": 100.0, "tokens_per_s_after": 110.0}
    assert result["served_speed"]["before"]["tokens_per_s"] == 100.0
    assert result["served_speed"]["after"]["measured"] == "benchmark" and result["warnings"] == []


async def test_require_approval_waits_for_the_signal(env):
    import asyncio
    import concurrent.futures

    script = Script(rewards=[3])
    gpu, cpu = script.activities()
    queue = CONTROL_TASK_QUEUE + uuid.uuid4().hex[:6]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        async with (
            Worker(env.client, task_queue=queue, workflows=[OptimizeCampaign]),
            Worker(env.client, task_queue=GPU_TASK_QUEUE, activities=gpu, activity_executor=pool),
            Worker(env.client, task_queue=CPU_TASK_QUEUE, activities=cpu, activity_executor=pool),
        ):
            handle = await env.client.start_workflow(
                OptimizeCampaign.run,
                CampaignInput(server_url="http://x", ops=["rms_norm"], require_approval=True),
                id=f"t-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
            )
            for _ in range(100):  # bounded: 10 s
                progress = await handle.query(OptimizeCampaign.progress)
                if any(t.get("stage") == "awaiting-approval" for t in progress["targets"].values()):
                    break
                await asyncio.sleep(0.1)
            assert "deploy" not in script.calls
            await handle.signal(OptimizeCampaign.approve, "rms_norm")
            result = await handle.result()
    assert script.calls[-2:] == ["deploy", "profile"] and result["deployed"][0]["op"] == "rms_norm"
