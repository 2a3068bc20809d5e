# Over 600 lines: one Temporal workflow class: its stages share the workflow's state and replay as one unit.
"""OptimizeCampaign: profile → retrieve skills → write → verify → learn → deploy, per target op.

The targets' write/verify searches run concurrently; swaps into the server and the served-speed
check after each run one at a time (a lock), each as soon as its search is done.
The write/verify loop exits in Python, never by model judgement: at the best reward the verifying
device can give (gpuyantra/rewards.py: +3 on CUDA, +1 on CPU where speed is not judged), or after
max_iterations.
Served speed is measured at each decode batch the server says matters (its profile's
`served_batches`: one row and its batched decode), and a swap is rolled back when served tokens/s at
any of them dropped by more than that batch's spread measured before and after it, and the drop held
when the swap was measured off and on in turns (`compare_swap`)
(gpuyantra/served_speed.py:judge_batches). Activities are called by reference, so their input and
result types are checked here; their modules import torch only inside the activities, so importing
them (passed through the sandbox) brings no torch into the workflow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar, cast

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities import cpu, gpu  # torch only inside the activities' bodies
    from gpuyantra.campaign.inputs import InvalidInput, parse_campaign_input, signal_op
    from gpuyantra.campaign.policy import at_ceiling, campaign_reward, campaign_speedups  # stdlib only
    from gpuyantra.campaign.records import (
        BenchmarkInput,
        CampaignInput,
        CampaignResult,
        CompareInput,
        DeployInput,
        LearnInput,
        OutcomeInput,
        RetrieveInput,
        RollbackInput,
        ServedMemoryInput,
        ServedRollback,
        ServedRollbackInput,
        ServerCall,
        ServerProfile,
        SkillSeed,
        SwapAnswer,
        Target,
        VerdictSummary,
        VerifyInput,
        WriteInput,
        WriteResult,
    )
    from gpuyantra.campaign.results import (
        AttemptReport,
        AuthorAttempt,
        BenchRow,
        CampaignProgress,
        CampaignResultJson,
        JudgedOn,
        PairedBatchFigures,
        PairedCheck,
        Strategy,
        TargetEntry,
        TargetProgress,
        VerdictDigest,
        variant_of,
    )
    from gpuyantra.config import CONTROL_TASK_QUEUE, CPU_TASK_QUEUE, GPU_TASK_QUEUE  # stdlib only
    from gpuyantra.hardware import hardware_kind  # stdlib only at import
    from gpuyantra.rewards import ceiling  # stdlib only
    from gpuyantra.served_speed import (  # stdlib only
        Measurement,
        batch_figures,
        batch_warnings,
        figures,
        judge_batches,
        judge_paired,
        judge_swap,
        judged_figures,
        lock_warning,
        paired_reason,
        per_batch,
        rollback_reason,
    )
    from workers import routing as routing_activities  # stdlib and temporalio only
    from workers.routing import choose_verify_queue, waiting_note  # stdlib and temporalio only
    from workflows.targets import choose_targets, measured_noise

A = TypeVar("A")  # an activity's input
R = TypeVar("R")  # an activity's result

# GPU activities heartbeat every few seconds: a crashed GPU worker's task moves to another worker
# after this long, not after the whole start-to-close timeout.
HEARTBEAT_TIMEOUT = timedelta(seconds=30)
MAX_NOTICES = 20  # rejected signals kept for the progress query; bounded so a flood cannot grow state
RETRY = RetryPolicy(
    maximum_attempts=3,
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    non_retryable_error_types=["BadRequest", "Unauthorized", "ServerUnreachable"],
)

# The GPU-worker lookup: a CPU worker that predates it answers NotFoundError (not registered), and
# the campaign verifies on the shared GPU queue as before.
LOOKUP_RETRY = RetryPolicy(
    maximum_attempts=3, initial_interval=timedelta(seconds=1), non_retryable_error_types=["NotFoundError"]
)

# config.SEARCH_ATTRIBUTES, typed. Set only when preflight_campaign reports them registered, so a
# server without them runs campaigns exactly as before (an unregistered one fails every workflow task).
MODEL_KEY = SearchAttributeKey.for_keyword("GpuyantraModel")
OPS_KEY = SearchAttributeKey.for_keyword_list("GpuyantraOps")
HARDWARE_KEY = SearchAttributeKey.for_keyword("GpuyantraHardware")
DEPLOYED_KEY = SearchAttributeKey.for_int("GpuyantraDeployed")
BEST_SPEEDUP_KEY = SearchAttributeKey.for_float("GpuyantraBestSpeedup")
SEARCH_KEYS = (MODEL_KEY, OPS_KEY, HARDWARE_KEY, DEPLOYED_KEY, BEST_SPEEDUP_KEY)
# What each target's result keeps of a verdict's `bench` rows: what `gpuyantra report` shows.
BENCH_KEYS = ("shape", "kernel_us", "eager_us", "compile_us", "compile_ro_us", "floor_us", "bytes")

__all__ = ["OptimizeCampaign", "CONTROL_TASK_QUEUE"]


@dataclass(frozen=True)
class Passed:
    """A candidate the verifier accepted, and which attempt wrote it."""

    verdict: VerdictSummary
    written: WriteResult
    iteration: int


@dataclass(frozen=True)
class Outcome:
    """One target's end: its result entry (docs/CONTRACTS.md section 6), and whether it was deployed."""

    entry: TargetEntry
    deployed: bool = False


@dataclass
class Search:
    """One target's write/verify loop so far (workflow state only: nothing here is sent as it is)."""

    seed: SkillSeed | None
    history: list[AuthorAttempt] = field(default_factory=list)  # what the author sees of earlier attempts
    attempts: list[AttemptReport] = field(default_factory=list)  # what the result reports of them
    last: VerdictSummary = field(default_factory=VerdictSummary)
    best: Passed | None = None  # the accepted candidate with the highest reward; the earliest on ties

    def record(self, iteration: int, written: WriteResult, verdict: VerdictSummary) -> None:
        self.last = verdict
        self.history.append(
            {
                "strategy": written.strategy,
                "reward": campaign_reward(verdict),
                "failures": verdict.failures,
                "kernel_us": verdict.kernel_us,
                "floor_us": verdict.floor_us,
            }
        )
        self.attempts.append(
            {
                "iteration": iteration,
                "strategy": written.strategy,
                "author": written.author,
                "reward": campaign_reward(verdict),
                "failures": verdict.failures[:5],
                "kernel_us": verdict.kernel_us,
                "floor_us": verdict.floor_us,
                "candidate_path": verdict.candidate_path,
            }
        )
        if verdict.accepted and (self.best is None or campaign_reward(verdict) > campaign_reward(self.best.verdict)):
            self.best = Passed(verdict, written, iteration)


def enter(progress: TargetProgress, stage: str) -> None:
    """A target's progress moves to `stage`; `trail` keeps every stage it passed through, so a
    follower polling now and then still sees a stage that lasted a moment (a reused verdict)."""
    progress["stage"] = stage
    iteration = f" (iteration {progress['iteration']})" if progress.get("iteration") else ""
    progress.setdefault("trail", []).append(f"{stage}{iteration}")


# How long the GPU workers found for a kind are trusted before asking Temporal again (workers that
# join mid-campaign take verifications after at most this long), and the waits between asks while
# none polls: short first (a worker starting now), then at most a minute.
VERIFIERS_FRESH = timedelta(seconds=60)
WAIT_FOR_VERIFIERS = (timedelta(seconds=5), timedelta(seconds=60))


@dataclass
class Routing:
    """Where a campaign's verifications go: GPU workers of the server's hardware kind, preferring a
    device the server does not use (workers/routing.py:choose_verify_queue)."""

    kind: str
    serving_device: str | None  # the server's GPU (its profile's device_key), when it says
    devices: list[str] | None = None  # device keys of the kind's workers, as last looked up
    looked_up: float | None = None  # workflow time (s) of that lookup
    turn: int = 0  # verifications routed so far: device queues take them in turns
    other_kinds: list[str] = field(default_factory=list)  # GPU workers of other kinds seen at the lookup
    lookup: asyncio.Lock = field(default_factory=asyncio.Lock)  # one lookup at a time


def server_kind(profile: ServerProfile) -> str:
    """The served GPU's hardware kind: the profile's `hardware_kind` when it gives one, else derived
    from the device name it reports as `hardware` (gpuyantra/hardware.py:hardware_kind)."""
    return profile.hardware_kind or hardware_kind(profile.hardware if profile.hardware != "unknown" else "cpu")


@workflow.defn(name="OptimizeCampaign")
class OptimizeCampaign:
    def __init__(self) -> None:
        # stage: the campaign's; targets: each target's own stage; deploying: the target holding the server
        self._progress: CampaignProgress = {"stage": "starting", "targets": {}, "deploying": None, "notices": []}
        self._approved: set[str] = set()
        self._rejected_by_user: set[str] = set()
        self._target_ops: set[str] = set()  # known once the profile is in; signals naming others get a notice
        self._deploy_lock = asyncio.Lock()  # one swap and its served-speed check at a time
        self._served: Measurement | None = None  # latest served-speed measurement of what is deployed now
        self._benchmark: BenchmarkInput | None = None  # the server and the decode batches every check measures
        self._warnings: list[str] = []
        self._searchable: set[str] = set()  # search attributes the namespace has registered (preflight says)
        self._deployed_count = 0
        self._best_speedup: float | None = None
        self._model = ""  # the served model's name, as the profile gives it (served-speed memory)
        self._campaign_id = ""
        self._routing: Routing | None = None  # None: every verification on the shared GPU queue

    @workflow.query
    def progress(self) -> CampaignProgress:
        return self._progress

    # Signals take raw arguments (*args) and never raise: an exception in a handler fails the
    # workflow task, which Temporal retries forever. A malformed signal becomes a notice instead.
    @workflow.signal
    def approve(self, *args: Any) -> None:
        """Approve deploying one op (`"rms_norm"`), or every op (`"*"`, or no argument)."""
        self._take_decision("approve", args, self._approved)

    @workflow.signal
    def reject(self, *args: Any) -> None:
        """Refuse deploying one op, or every op (`"*"`, or no argument); the op is reported, not deployed."""
        self._take_decision("reject", args, self._rejected_by_user)

    def _take_decision(self, signal: str, args: tuple[Any, ...], into: set[str]) -> None:
        op, notice = signal_op(signal, args)
        if op is not None:
            into.add(op)
            if op != "*" and self._target_ops and op not in self._target_ops:
                targets = ", ".join(sorted(self._target_ops))
                notice = f"{signal} {op!r} matches no target of this campaign ({targets})"
        if notice is not None:
            self._progress["notices"] = [*self._progress["notices"], notice][-MAX_NOTICES:]

    @workflow.run
    async def run(self, *args: Any) -> CampaignResultJson:
        # Raw JSON in, checked here: a bad input fails this run at once with the field named, where
        # the SDK's own decoding into CampaignInput would fail the workflow task again and again.
        try:
            params = parse_campaign_input(args)
        except InvalidInput as exc:
            raise ApplicationError(str(exc), type="InvalidInput", non_retryable=True) from None
        campaign_id = workflow.info().workflow_id
        server = ServerCall(params.server_url)
        self._stage("preflight")
        await self._preflight(params)
        self._search(DEPLOYED_KEY.value_set(0), *([OPS_KEY.value_set(params.ops)] if params.ops else []))
        self._stage("profile")
        profile = await self._gpu(gpu.profile_server, server, timedelta(minutes=10))
        hardware = profile.hardware
        if (params.device or "cuda").startswith("cuda"):
            # Verdicts are timed: only workers of the server's kind verify (CPU: any worker will do).
            self._routing = Routing(server_kind(profile), profile.device_key)
        self._model, self._campaign_id = profile.model or "", campaign_id
        self._benchmark = BenchmarkInput(params.server_url, profile.served_batches)
        # The served speed's noise decides which estimated gains are worth a search.
        self._stage("e2e-before")
        before = self._served = await self._gpu(gpu.benchmark_server, self._benchmark, timedelta(minutes=10))
        ranked = [Target.from_dict(t) for t in profile.targets]
        choice = choose_targets(ranked, params.ops, params.max_targets, measured_noise(before))
        targets, skipped = choice.chosen, choice.skipped
        self._announce_targets(params, profile, targets)

        self._stage("targets")
        outcomes = await asyncio.gather(
            *(self._optimize_target(campaign_id, params, target, hardware) for target in targets)
        )
        deployed = [outcome.entry for outcome in outcomes if outcome.deployed]
        rejected: list[TargetEntry] = [
            {"op": op, "reason": f"the served model has no module computing {op}"}
            for op in (params.ops or [])
            if not any(t.op == op for t in targets) and not any(entry["op"] == op for entry in skipped)
        ]
        rejected += [outcome.entry for outcome in outcomes if not outcome.deployed]

        self._stage("e2e-after")
        # The last check measured what is deployed now (a swap kept after its check, or the state a
        # rollback put back): measuring again would cost a benchmark and tell nothing new.
        after = self._served or before
        if deployed:
            for warning in batch_warnings("campaign", before, after, f"{len(deployed)} kernel(s) deployed"):
                self._warn(warning)
        profile_after = None
        # Where the step's time goes once the kernels are in (the report draws both profiles).
        if deployed:
            self._stage("profile-after")
            profile_after = await self._gpu(gpu.profile_server, server, timedelta(minutes=10))
        self._stage("done")
        return CampaignResult(
            workflow_id=campaign_id,
            server=params.server_url,
            model=profile.model,
            hardware=hardware,
            deployed=deployed,
            rejected=rejected,
            skipped=skipped,
            e2e={"tokens_per_s_before": before.tokens_per_s, "tokens_per_s_after": after.tokens_per_s},
            served_speed={
                "before": figures(before),
                "after": figures(after),
                "after_source": "last check",
                "batches": batch_figures(before, after),
            },
            profile=profile.digest,
            profile_after=profile_after.digest if profile_after is not None else None,
            warnings=self._warnings,
        ).to_dict()

    def _announce_targets(self, params: CampaignInput, profile: ServerProfile, targets: list[Target]) -> None:
        """The targets' ops answer signals; the model, hardware and ops become search attributes."""
        self._target_ops = {t.op for t in targets}
        self._search(
            HARDWARE_KEY.value_set(profile.hardware),
            *([MODEL_KEY.value_set(profile.model)] if profile.model else []),
            *([] if params.ops else [OPS_KEY.value_set(sorted(self._target_ops))]),
        )

    async def _optimize_target(self, campaign_id: str, params: CampaignInput, target: Target, hardware: str) -> Outcome:
        progress = self._progress["targets"].setdefault(target.key, {})
        search = await self._write_and_verify(campaign_id, params, target, hardware, progress)
        best = search.best
        if best is None:
            return Outcome(not_passed_entry(target, search))

        enter(progress, "learn")
        skill_id = await workflow.execute_activity(
            cpu.learn_skill,
            LearnInput(
                campaign_id=campaign_id,
                target=target.to_dict(),
                hardware=hardware,
                iteration=best.iteration,
                source=best.written.source,
                strategy=best.written.strategy,
                verdict=best.verdict,
                author=best.written.author,
            ),
            task_queue=CPU_TASK_QUEUE,
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=RETRY,
        )
        summary = passed_summary(target, search, best, skill_id)
        if campaign_reward(best.verdict) < params.min_reward:
            return Outcome({**summary, "reason": below_min_reward(best.verdict, params.min_reward)})
        if not params.redeploy_rolled_back:
            earlier = await self._served_rollbacks(skill_id)
            if earlier:
                return Outcome({**summary, "reason": not_redeployed(earlier, self._model)})
        if params.require_approval and not await self._wait_for_approval(target.op, progress):
            return Outcome({**summary, "reason": "deployment not approved"})

        enter(progress, "waiting-to-deploy")
        async with self._deploy_lock:
            self._progress["deploying"] = target.key
            try:
                outcome = await self._deploy(params, target, summary, best, progress)
            finally:
                self._progress["deploying"] = None
            if outcome.deployed:
                self._count_deployed(best.verdict)
            return outcome

    async def _write_and_verify(
        self, campaign_id: str, params: CampaignInput, target: Target, hardware: str, progress: TargetProgress
    ) -> Search:
        """Retrieve a seed skill, then write and verify candidates until one reaches its device's
        ceiling reward or max_iterations runs out."""
        enter(progress, "retrieve")
        retrieved = await workflow.execute_activity(
            cpu.retrieve_skills,
            RetrieveInput(target=target.to_dict(), hardware=hardware),
            task_queue=CPU_TASK_QUEUE,
            start_to_close_timeout=timedelta(minutes=2),
            retry_policy=RETRY,
        )
        search = Search(seed=retrieved.seed)
        for iteration in range(1, params.max_iterations + 1):
            progress["iteration"] = iteration
            enter(progress, "write")
            written = await workflow.execute_activity(
                cpu.write_candidate,
                WriteInput(
                    target=target.to_dict(),
                    hardware=hardware,
                    iteration=iteration,
                    seed=retrieved.seed,
                    history=search.history,
                ),
                task_queue=CPU_TASK_QUEUE,
                start_to_close_timeout=timedelta(minutes=5),
                retry_policy=RETRY,
                summary=f"write {target.op} iteration {iteration}",
            )
            enter(progress, "verify")
            verdict = await self._gpu(
                gpu.verify_candidate,
                VerifyInput(
                    campaign_id=campaign_id,
                    target=target.to_dict(),
                    iteration=iteration,
                    source=written.source,
                    device=params.device,
                ),
                timedelta(minutes=20),
                summary=f"verify {target.key} iteration {iteration}: {strategy_text(written.strategy)}",
                task_queue=await self._verify_queue(progress),
            )
            # Query state only (no command): the dashboard and `status` show it; replay-safe.
            reward = campaign_reward(verdict)
            progress["best_reward"] = max(reward, progress.get("best_reward", reward))
            search.record(iteration, written, verdict)
            if search.seed is not None and iteration == 1:
                # The seed skill's bandit arm is paid with the attempt it seeded, whatever came of it.
                await workflow.execute_activity(
                    cpu.record_outcome,
                    OutcomeInput(skill_id=search.seed.id, reward=float(reward)),
                    task_queue=CPU_TASK_QUEUE,
                    start_to_close_timeout=timedelta(minutes=1),
                    retry_policy=RETRY,
                )
            if at_ceiling(verdict):
                break
        return search

    def _count_deployed(self, verdict: VerdictSummary) -> None:
        """The deployed count and best speedup, for the search attributes."""
        self._deployed_count += 1
        speedup = verdict.speedup_vs_eager
        if isinstance(speedup, (int, float)) and (self._best_speedup is None or speedup > self._best_speedup):
            self._best_speedup = float(speedup)
        self._search(
            DEPLOYED_KEY.value_set(self._deployed_count),
            *([BEST_SPEEDUP_KEY.value_set(self._best_speedup)] if self._best_speedup else []),
        )

    async def _deploy(
        self,
        params: CampaignInput,
        target: Target,
        summary: TargetEntry,
        best: Passed,
        progress: TargetProgress,
    ) -> Outcome:
        """Swap, measure served speed, keep or roll back. Called with the deploy lock held."""
        enter(progress, "deploy")
        verdict = best.verdict
        try:
            swap = await self._gpu(
                gpu.deploy_kernel,
                DeployInput(
                    server_url=params.server_url,
                    target=target.to_dict(),
                    source=best.written.source,
                    attestation=verdict.attestation,
                    rows_gate=verdict.rows_gate,
                ),
                timedelta(minutes=10),
                summary=f"deploy {target.op}",
            )
        except ActivityError as exc:
            return Outcome({**summary, "reason": f"swap failed: {root_message(exc)}"})
        summary["modules"], summary["swap_id"] = swap.modules, swap.swap_id
        judged = verdict.speed_judged  # the interpreter's speed says nothing about the server's
        # Served speed is the number users see: a kernel fast in isolation can still slow a
        # launch-bound decode step, or help one row and hurt a batch. Roll back a drop at any
        # measured batch larger than that batch's own spread.
        enter(progress, "e2e-check")
        before = self._served
        after = await self._gpu(
            gpu.benchmark_server,
            self._benchmark or BenchmarkInput(params.server_url),
            timedelta(minutes=10),
            summary=f"served speed after deploying {target.op}",
        )
        first = judge_swap(before, after)  # the top-level (smallest) batch, as results had
        judgement = judge_batches(before, after)
        summary["e2e_tokens_per_s"] = {"before": before.tokens_per_s if before else None, "after": after.tokens_per_s}
        summary["served_speed"] = {
            "before": figures(before),
            "after": figures(after),
            "judged": judged,
            "drop": first["drop"],
            "noise": first["noise"],
            "batches": judged_figures(before, after, judgement),
            "dropped_batches": judgement["dropped"] if judged else [],
        }
        self._warn(lock_warning(f"served speed after deploying {target.op}", after))
        paired = None
        if judged and judgement["decision"] == "rollback":
            # `before` may be minutes old: confirm the drop with the swap off and on in one window.
            paired = await self._paired_check(params, target, swap, after)
            if paired is not None:
                summary["served_speed"]["paired"] = paired
                judgement = paired["judged"]
        if judged and judgement["decision"] == "rollback":
            await self._gpu(
                gpu.rollback_swap,
                RollbackInput(server_url=params.server_url, swap_id=swap.swap_id),
                timedelta(minutes=5),
                summary=f"roll back {target.op}",
            )
            if paired is not None:
                reason = f"rolled back: {paired_reason(judgement)}; {target.regime or 'unknown'} regime"
            else:
                reason = rollback_reason(before, after, judgement, target.regime or "unknown")
            await self._remember_rollback(summary, reason, judgement)
            return Outcome({**summary, "reason": reason})
        if paired is not None:
            self._warn(f"{target.op} kept: the first check read a drop; {paired_reason(judgement)}")
        else:
            notes = {
                batch: kept_note(one["noise"]) if judged else f"kept: speed is not judged on a {verdict.device} verdict"
                for batch, one in judgement["batches"].items()
            }
            for warning in batch_warnings(f"{target.op} deployed", before, after, notes):
                self._warn(warning)
        self._served = after
        enter(progress, "deployed")
        return Outcome(summary, deployed=True)

    async def _served_rollbacks(self, skill_id: str) -> list[ServedRollback]:
        """When serving this model rolled the kernel of `skill_id` back for speed before."""
        return await workflow.execute_activity(
            cpu.served_rollbacks,
            ServedMemoryInput(skill_id=skill_id, model=self._model),
            task_queue=CPU_TASK_QUEUE,
            start_to_close_timeout=timedelta(minutes=1),
            retry_policy=RETRY,
        )

    async def _remember_rollback(self, summary: TargetEntry, reason: str, judgement: Mapping[str, Any]) -> None:
        """Keep the rollback with the kernel's skill: the next campaign on this model does not deploy
        the same kernel again to measure the same loss."""
        await workflow.execute_activity(
            cpu.record_served_rollback,
            ServedRollbackInput(
                skill_id=str(summary.get("skill_id")),
                model=self._model,
                campaign_id=self._campaign_id,
                reason=reason,
                batches=[int(b) for b in judgement.get("dropped") or []],
            ),
            task_queue=CPU_TASK_QUEUE,
            start_to_close_timeout=timedelta(minutes=1),
            retry_policy=RETRY,
        )

    async def _paired_check(
        self, params: CampaignInput, target: Target, swap: SwapAnswer, after: Measurement
    ) -> PairedCheck | None:
        """The swap measured off and on in turns (compare_swap) at the batches `after` measured: the
        result's `paired` figures; None when the server cannot (then the first judgement stands)."""
        batches = sorted(per_batch(after))
        try:
            answer = await self._gpu(
                gpu.compare_swap,
                CompareInput(server_url=params.server_url, swap_id=swap.swap_id, batches=batches),
                timedelta(minutes=10),
                summary=f"paired served speed of {target.op}",
            )
        except ActivityError as exc:
            self._warn(f"paired served speed of {target.op} failed ({root_message(exc)}): the first check decides")
            return None
        if answer.measured != "paired":
            return None
        self._warn(lock_warning(f"paired served speed of {target.op}", answer))
        per_batch_figures: dict[str, PairedBatchFigures] = {
            str(entry.batch): {
                "with": figures(entry.with_swap),
                "without": figures(entry.without),
                "drops": entry.drops,
            }
            for entry in answer.batches
        }
        return {"judged": judge_paired(answer), "seconds": answer.seconds, "batches": per_batch_figures}

    async def _wait_for_approval(self, op: str, progress: TargetProgress) -> bool:
        enter(progress, "awaiting-approval")
        decided = lambda: bool({op, "*"} & (self._approved | self._rejected_by_user))  # noqa: E731
        await workflow.wait_condition(decided)
        return not ({op, "*"} & self._rejected_by_user)

    async def _preflight(self, params: CampaignInput) -> None:
        """Op names (the registry needs torch) and one campaign per server (needs the Temporal
        client) are checked by an activity; its refusal ends the campaign with the same message."""
        try:
            answer = await workflow.execute_activity(
                cpu.preflight_campaign,
                params,
                task_queue=CPU_TASK_QUEUE,
                start_to_close_timeout=timedelta(minutes=1),
                retry_policy=RETRY,
            )
            self._searchable = set(answer.search_attributes)
        except ActivityError as exc:
            cause = exc.cause
            if isinstance(cause, ApplicationError) and cause.type in ("InvalidInput", "CampaignConflict"):
                raise ApplicationError(cause.message, type=cause.type, non_retryable=True) from exc
            raise ApplicationError(
                f"preflight_campaign failed: {root_message(exc)}", type="PreflightFailed", non_retryable=True
            ) from exc

    async def _verify_queue(self, progress: TargetProgress) -> str:
        """The task queue of a target's next verification: the shared GPU queue without routing; else
        a worker of the server's kind (workers/routing.py), waiting, and saying so in the progress,
        while none polls."""
        routing = self._routing
        if routing is None:
            return GPU_TASK_QUEUE
        waits = 0
        while True:
            devices = await self._verifier_devices(routing)
            if devices is None:  # a CPU worker without the lookup: the shared queue, as before routing
                self._routing = None
                return GPU_TASK_QUEUE
            queue = choose_verify_queue(routing.kind, devices, routing.serving_device, routing.turn)
            if queue is not None:
                routing.turn += 1
                self._progress.pop("waiting", None)
                if waits:
                    enter(progress, "verify")
                return queue
            self._progress["waiting"] = waiting_note(routing.kind, routing.other_kinds)
            if not waits:
                enter(progress, "waiting-for-gpu-worker")
            first, longest = WAIT_FOR_VERIFIERS
            await workflow.sleep(min(first * 2**waits, longest))
            waits += 1

    async def _verifier_devices(self, routing: Routing) -> list[str] | None:
        """The device keys of the GPU workers of the campaign's kind (none: []), looked up again once
        VERIFIERS_FRESH old or while none was found; None when the CPU worker cannot look them up."""
        async with routing.lookup:
            now = workflow.time()
            fresh = routing.looked_up is not None and now - routing.looked_up < VERIFIERS_FRESH.total_seconds()
            if routing.devices and fresh:
                return routing.devices
            try:
                answer = await workflow.execute_activity(
                    routing_activities.gpu_workers,
                    routing.kind,
                    task_queue=CPU_TASK_QUEUE,
                    start_to_close_timeout=timedelta(minutes=1),
                    retry_policy=LOOKUP_RETRY,
                )
            except ActivityError as exc:
                if isinstance(exc.cause, ApplicationError) and exc.cause.type == "NotFoundError":
                    return None
                raise
            routing.devices, routing.looked_up = list(answer.devices), now
            routing.other_kinds = list(answer.other_kinds)
            self._progress["verifiers"] = {"kind": routing.kind, "workers": answer.pollers}
            return routing.devices

    async def _gpu(
        self,
        activity: Callable[[A], R],
        arg: A,
        timeout: timedelta,
        summary: str | None = None,
        task_queue: str = GPU_TASK_QUEUE,
    ) -> R:
        try:
            return await workflow.execute_activity(
                activity,
                arg,
                task_queue=task_queue,
                start_to_close_timeout=timeout,
                retry_policy=RETRY,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                summary=summary,
            )
        except ActivityError as exc:
            if activity in (gpu.profile_server, gpu.benchmark_server):
                name = getattr(activity, "__name__", "activity")
                raise ApplicationError(f"{name} failed: {root_message(exc)}", non_retryable=True) from exc
            raise

    def _stage(self, stage: str) -> None:
        self._progress["stage"] = stage

    def _warn(self, warning: str | None) -> None:
        if warning:
            self._warnings.append(warning)

    def _search(self, *updates: SearchAttributeUpdate) -> None:
        """Upsert those of `updates` the namespace has registered; nothing on a server without them."""
        kept = [update for update in updates if update.key.name in self._searchable]
        if kept:
            workflow.upsert_search_attributes(kept)


def not_passed_entry(target: Target, search: Search) -> TargetEntry:
    """The result's entry of a target no candidate of which passed: why, from the last failures."""
    last = search.history[-1]["failures"] if search.history else []
    reason = "; ".join(f"{f['layer']}/{f['rule']}: {f['message']}" for f in last[:3]) or "no candidate"
    return {
        "op": target.op,
        "module_class": target.module_class,
        "reason": f"no candidate passed verification in {len(search.history)} iterations ({reason})",
        "iterations": len(search.history),
        "verdict": verdict_digest(search.last),
        "attempts": search.attempts,
    }


def not_redeployed(earlier: list[ServedRollback], model: str) -> str:
    """Why a verified kernel is kept out: serving rolled the same kernel back before."""
    last = earlier[-1]
    times = f"{len(earlier)} times" if len(earlier) > 1 else "once"
    return (
        f"not deployed: serving {model or 'this model'} rolled this same kernel back for speed {times} "
        f"(last in campaign {last.campaign or '?'}: {last.reason or 'no reason kept'}); "
        "redeploy_rolled_back tries it again"
    )


def passed_summary(target: Target, search: Search, best: Passed, skill_id: str) -> TargetEntry:
    """The result's entry of a target with an accepted candidate (deployed or not: a reason says why not)."""
    verdict = best.verdict
    speedup_vs_eager, speedup_vs_compile = campaign_speedups(verdict)  # what the campaign decided on
    return {
        "op": target.op,
        "module_class": target.module_class,
        **variant_of(target.variant),
        "modules": target.modules,
        "reward": campaign_reward(verdict),
        "speedup_vs_eager": speedup_vs_eager,
        "speedup_vs_compile": speedup_vs_compile,
        "skill_id": skill_id,
        "iterations": len(search.history),
        "seed_skill_id": search.seed.id if search.seed else None,
        "verdict": verdict_digest(verdict),
        "best_iteration": best.iteration,
        "attempts": search.attempts,
    }


def kept_note(noise: float | None) -> str:
    """Why a slower batch did not roll a swap back."""
    if noise is None:  # one measured from live traffic, the other by a benchmark: never compared
        return "measured differently before and after, so not compared; kept"
    return f"within the measured noise of {noise:.1%}, so kept"


def below_min_reward(verdict: VerdictSummary, min_reward: int) -> str:
    reason = f"best reward {campaign_reward(verdict)} is below min_reward {min_reward}"
    if not verdict.speed_judged:
        reason += f" (on CPU speed is not judged: {ceiling('cpu'):+d} is the most a kernel can score)"
    return reason


def strategy_text(strategy: Strategy | None, limit: int = 120) -> str:
    """`BLOCK=1024 num_warps=4`: an author's strategy in an activity summary."""
    text = " ".join(f"{key}={value}" for key, value in (strategy or {}).items()) or "default strategy"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def verdict_digest(verdict: VerdictSummary) -> VerdictDigest:
    """The figures of a verdict the result reports (no attestation, no per-stage timings); the
    campaign's served decode judgement only where there is one. Keys in the order the result has
    always had them."""
    judged: JudgedOn = {"judged_on": verdict.judged_on} if verdict.judged_on else {}
    return {
        "accepted": verdict.accepted,
        "reward": verdict.reward,
        "device": verdict.device,
        "failures": verdict.failures,
        "speedup_vs_eager": verdict.speedup_vs_eager,
        "speedup_vs_compile": verdict.speedup_vs_compile,
        "kernel_us": verdict.kernel_us,
        "eager_us": verdict.eager_us,
        "compile_us": verdict.compile_us,
        "compile_ro_us": verdict.compile_ro_us,
        "floor_us": verdict.floor_us,
        "shapes": verdict.shapes,
        "dtypes": verdict.dtypes,
        "candidate_path": verdict.candidate_path,
        **judged,
        "timed_on": verdict.timed_on,
        "bench": [bench_row(row) for row in verdict.bench],
    }


def bench_row(row: Mapping[str, Any]) -> BenchRow:
    """A verdict's bench row as the result keeps it: the keys of BENCH_KEYS the row has."""
    return cast(BenchRow, {key: row.get(key) for key in BENCH_KEYS if key in row})


def root_message(exc: BaseException) -> str:
    """The message the activity raised (its ApplicationError), not Temporal's wrapper."""
    cause = exc.__cause__
    return str(cause) if cause is not None and str(cause) else str(exc)
