"""CPU task queue: the author (template or LLM) and the skill library."""

from __future__ import annotations

import asyncio
import platform
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from gpuyantra.campaign.records import (
    CampaignInput,
    LearnInput,
    OutcomeInput,
    PreflightAnswer,
    RetrieveInput,
    RetrieveResult,
    ServedMemoryInput,
    ServedRollback,
    ServedRollbackInput,
    SkillCandidate,
    SkillSeed,
    Target,
    WriteInput,
    WriteResult,
)
from gpuyantra.campaign.results import Strategy


@activity.defn(name="retrieve_skills")
def retrieve_skills(request: RetrieveInput) -> RetrieveResult:
    from gpuyantra.ops.open import ensure_open_target
    from gpuyantra.skills import Fingerprint, SkillStore, ucb1_choose

    ensure_open_target(request.target)  # the fingerprint's roofline reads the op's bytes model
    fingerprint = Fingerprint.from_target(request.target, request.hardware)  # reads profile fields Target omits
    with SkillStore() as store:
        skills = store.retrieve(fingerprint, Target.from_dict(request.target).op, request.hardware)
    chosen = ucb1_choose(skills)
    return RetrieveResult(
        candidates=[
            SkillCandidate(id=s.id, op=s.op, hardware=s.hardware, reward=s.reward, pulls=s.pulls) for s in skills
        ],
        seed=None
        if chosen is None
        else SkillSeed(id=chosen.id, op=chosen.op, source=chosen.source, strategy=chosen.strategy),
    )


@activity.defn(name="record_outcome")
def record_outcome(request: OutcomeInput) -> None:
    from gpuyantra.skills import SkillStore

    with SkillStore() as store:
        store.record_outcome(request.skill_id, request.reward)


@activity.defn(name="served_rollbacks")
def served_rollbacks(request: ServedMemoryInput) -> list[ServedRollback]:
    """When serving `model` rolled this kernel back for speed before (oldest first; [] if never)."""
    from gpuyantra.skills import SkillStore

    with SkillStore() as store:
        return [ServedRollback.from_dict(entry) for entry in store.served_rollbacks(request.skill_id, request.model)]


@activity.defn(name="record_served_rollback")
def record_served_rollback(request: ServedRollbackInput) -> None:
    from gpuyantra.skills import SkillStore

    entry = {"model": request.model, "campaign": request.campaign_id, "reason": request.reason}
    with SkillStore() as store:
        store.record_served_rollback(request.skill_id, {**entry, "batches": request.batches})


@activity.defn(name="write_candidate")
def write_candidate(request: WriteInput) -> WriteResult:
    from gpuyantra.authors import Attempt, WriteRequest, get_author
    from gpuyantra.ops.open import ensure_open_target

    ensure_open_target(request.target)  # an open op travels with its target
    target = Target.from_dict(request.target)
    seed = request.seed
    # A seed from another family (transfer) contributes the knobs both families share, not its source.
    same_family = seed is not None and seed.op == target.op
    seed_strategy = seed.strategy if seed is not None else None
    if not same_family:
        seed_strategy = shared_knobs(target.op, seed_strategy)
    written = get_author().write(
        WriteRequest(
            op=target.op,
            module_class=target.module_class,
            adapter=target.adapter,
            shapes=target.shapes,
            dtype=target.dtype or "float32",  # a target seen in no call has no dtype: the author's default
            hardware=request.hardware,
            seed_source=seed.source if seed is not None and same_family else None,
            seed_strategy=seed_strategy,
            history=[Attempt(**attempt) for attempt in request.history],
            iteration=request.iteration,
            param_shapes=target.param_shapes or {},
        )
    )
    return WriteResult(source=written.source, strategy=written.strategy, author=written.author, notes=written.notes)


def shared_knobs(op: str, strategy: Strategy | None) -> Strategy | None:
    """The part of another family's strategy that `op`'s template understands, or None."""
    from gpuyantra.authors.template import STRATEGY_SPACES

    space = STRATEGY_SPACES.get(op) or [{}]
    known = set().union(*(point.keys() for point in space))
    kept = {key: value for key, value in (strategy or {}).items() if key in known}
    if not kept:
        return None
    # Fill the knobs the seed lacks from the family's first point so the strategy is complete.
    return {**space[0], **kept}


@activity.defn(name="learn_skill")
def learn_skill(request: LearnInput) -> str:
    import torch
    import triton

    from gpuyantra.campaign.policy import campaign_reward, campaign_speedups
    from gpuyantra.ops.open import ensure_open_target
    from gpuyantra.skills import Fingerprint, Skill, SkillStore

    ensure_open_target(request.target)
    verdict, target = request.verdict, Target.from_dict(request.target)
    speedup_vs_eager, speedup_vs_compile = campaign_speedups(verdict)
    fingerprint = Fingerprint.from_target(request.target, request.hardware)  # reads profile fields Target omits
    skill = Skill(
        op=target.op,
        hardware=request.hardware,
        source=request.source,
        adapter=target.adapter,
        strategy=request.strategy,
        reward=float(campaign_reward(verdict)),  # what the campaign judged the target's kernel at
        speedup_vs_eager=speedup_vs_eager,
        speedup_vs_compile=speedup_vs_compile,
        shapes=verdict.shapes or target.shapes,
        dtypes=verdict.dtypes or [],
        fingerprint=fingerprint.to_payload(),
        module_class=target.qualified_class or "",
        provenance={
            "campaign": request.campaign_id,
            "iteration": request.iteration,
            "author": request.author,
            "module_class": target.module_class,
        },
        versions={"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()},
    )
    with SkillStore() as store:
        return store.upsert(skill)


@activity.defn(name="preflight_campaign")
async def preflight_campaign(params: CampaignInput) -> PreflightAnswer:
    """Refuse, before any GPU work, a server this worker does not trust, unknown op names and a
    second campaign on the same server.
    Answers which of gpuyantra's search attributes the namespace has registered: the workflow sets
    only those (setting an unregistered one would fail every workflow task of the campaign)."""
    from gpuyantra.campaign_client import refusal, running_campaign, unknown_ops
    from gpuyantra.preflight import campaign_problems
    from gpuyantra.trusted_servers import UntrustedServer, resolve

    try:
        resolve(params.server_url)  # the GPU activities check again, with the GPU worker's own list
    except UntrustedServer as exc:
        raise ApplicationError(str(exc), type="UntrustedServer", non_retryable=True) from None
    unknown = await asyncio.to_thread(unknown_ops, params.ops or [])  # the registry imports torch
    if unknown:
        raise ApplicationError(f"invalid campaign input: {unknown}", type="InvalidInput", non_retryable=True)
    problems = await asyncio.to_thread(campaign_problems, params.server_url, params.min_reward, params.device)
    if problems:  # a key the server does not share, a reward the device cannot score: one line each
        raise ApplicationError("; ".join(problems), type="PreflightFailed", non_retryable=True)
    info = activity.info()
    assert info.workflow_id is not None  # an activity of the campaign workflow
    running = await running_campaign(
        activity.client(),
        params.server_url,
        info.workflow_id,
        started=await _started(info.workflow_id, info.workflow_run_id),
    )
    if running is not None:
        raise ApplicationError(refusal(params.server_url, running), type="CampaignConflict", non_retryable=True)
    return PreflightAnswer(search_attributes=await registered_search_attributes(activity.client(), info.namespace))


async def registered_search_attributes(client: Any, namespace: str) -> list[str]:
    """Those of config.SEARCH_ATTRIBUTES the namespace has, with the type gpuyantra sets; none when
    the server does not say (no operator API, no permission): the campaign then runs unsearchable."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest

    from gpuyantra.config import SEARCH_ATTRIBUTES, indexed_value_type

    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace), timeout=timedelta(seconds=10)
        )
    except Exception:  # noqa: BLE001 - unsearchable is fine, a failed campaign is not
        activity.logger.warning("cannot list search attributes; the campaign sets none", exc_info=True)
        return []
    kinds = {name: IndexedValueType.Name(kind) for name, kind in listed.custom_attributes.items()}
    return sorted(name for name, kind in SEARCH_ATTRIBUTES.items() if kinds.get(name) == indexed_value_type(kind))


async def _started(workflow_id: str, run_id: str | None) -> datetime:
    description = await activity.client().get_workflow_handle(workflow_id, run_id=run_id).describe()
    return description.start_time


ACTIVITIES: list[Callable[..., Any]] = [
    retrieve_skills,
    record_outcome,
    served_rollbacks,
    record_served_rollback,
    write_candidate,
    learn_skill,
    preflight_campaign,
]
