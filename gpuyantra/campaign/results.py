"""The campaign's JSON-shaped records: its result's entries (docs/CONTRACTS.md section 6), the
`progress` query, and the verdict a `VerifyKernel` run returns (section 4). Stdlib only: the
workflow sandbox imports it.

These are TypedDicts, not dataclasses like the activity records of `records.py`, because their JSON
has keys that are absent rather than null (`variant`, `judged_on`, `paired`, `skipped`, a rejected
op's bare `{"op", "reason"}`): a TypedDict is the dict itself at runtime, so the JSON a client reads
and the payloads recorded in workflow histories stay exactly what they were, while the type checker
holds every producer and consumer to the same keys.

Free-form parts keep a named alias: a strategy's knobs (each template has its own), a failure's
fields beyond the verifier's three, and the served-speed figures (gpuyantra/served_speed.py builds
and owns those).
"""

from __future__ import annotations

from typing import Any, NotRequired, Required, TypedDict

# An author's knobs (`{"BLOCK": 1024, "num_warps": 4}`): each template family has its own space.
Strategy = dict[str, Any]
# A verifier failure: `layer`, `rule`, `message` (docs/CONTRACTS.md section 4).
Failure = dict[str, Any]
# Served-speed figures of one measurement or judgement: gpuyantra/served_speed.py builds and owns them.
SpeedFigures = dict[str, Any]


# ====================================================================== the result's target entries
class BenchRow(TypedDict, total=False):
    """One timed shape of a verdict, as the result keeps it (the verdict's `bench` row, trimmed)."""

    shape: list[int]
    kernel_us: float | None
    eager_us: float | None
    compile_us: float | None
    compile_ro_us: float | None
    floor_us: float | None
    bytes: int | None


class JudgedOn(TypedDict, total=False):
    """The campaign's judgement on a target's served decode shapes (gpuyantra/campaign/policy.py:
    shapes, why, reward, speedups), present only where it judged one."""

    judged_on: dict[str, Any]


class VerdictDigest(JudgedOn):
    """The figures of a target's best (or last) verdict the result reports: what `gpuyantra report`
    draws. No attestation, no per-stage timings; `judged_on` only where the campaign judged one."""

    accepted: bool
    reward: int
    device: str | None
    failures: list[Failure]
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    kernel_us: float | None
    eager_us: float | None
    compile_us: float | None
    compile_ro_us: float | None
    floor_us: float | None
    shapes: list[list[int]] | None
    dtypes: list[str] | None
    candidate_path: str | None
    timed_on: dict[str, Any] | None  # gpuyantra/hardware.py: DeviceFacts
    bench: list[BenchRow]


class AuthorAttempt(TypedDict):
    """An earlier attempt as the author sees it (WriteInput.history): the fields of
    gpuyantra.authors.Attempt, which write_candidate rebuilds from it."""

    strategy: Strategy
    reward: int
    failures: list[Failure]
    kernel_us: float | None
    floor_us: float | None


class AttemptReport(TypedDict):
    """An attempt as the result reports it (an entry's `attempts`, one per iteration)."""

    iteration: int
    strategy: Strategy
    author: str
    reward: int
    failures: list[Failure]  # the first five
    kernel_us: float | None
    floor_us: float | None
    candidate_path: str | None


# `with` is a keyword: the functional form names the key as the JSON has it.
PairedBatchFigures = TypedDict(
    "PairedBatchFigures",
    {"with": SpeedFigures | None, "without": SpeedFigures | None, "drops": list[float] | None},
)


class PairedCheck(TypedDict):
    """The swap measured off and on in turns (/admin/compare): its judgement and per-batch figures."""

    judged: SpeedFigures  # gpuyantra/served_speed.py: judge_paired
    seconds: float | None
    batches: dict[str, PairedBatchFigures]  # per batch, "1", "8"


class EntryServedSpeed(TypedDict):
    """A deployed target's served-speed check: batch 1's figures before and after, and per batch."""

    before: SpeedFigures | None
    after: SpeedFigures | None
    judged: bool  # speed is judged on a GPU verdict only
    drop: float | None
    noise: float | None
    batches: dict[str, SpeedFigures]
    dropped_batches: list[Any]
    paired: NotRequired[PairedCheck]  # when a drop was checked with the swap off and on


class Variant(TypedDict, total=False):
    """A linear target's projection shape (several targets share its class); absent on other ops."""

    variant: str


class TargetEntry(Variant, total=False):
    """One target's entry in the result's `deployed` or `rejected` (docs/CONTRACTS.md section 6).
    A searched target has every key up to `attempts`; `reason` says why one was not deployed; an
    op the served model has no module for is `{"op", "reason"}` alone."""

    op: Required[str]
    module_class: str
    modules: int
    reward: int
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    skill_id: str
    iterations: int
    seed_skill_id: str | None
    verdict: VerdictDigest
    best_iteration: int
    attempts: list[AttemptReport]
    reason: str
    swap_id: str
    e2e_tokens_per_s: dict[str, float | None]  # before, after
    served_speed: EntryServedSpeed


class SkipEntry(Variant):
    """A target the campaign did not go after (the result's `skipped`)."""

    op: Required[str]
    module_class: Required[str]
    reason: Required[str]


class Skipped(TypedDict, total=False):
    """The result's `skipped`: absent when nothing was skipped."""

    skipped: list[SkipEntry]


class CampaignResultJson(Skipped):
    """The JSON OptimizeCampaign returns (`CampaignResult.to_dict()`); `CampaignResult.from_dict`
    reads it back."""

    workflow_id: str
    server: str
    model: str | None
    hardware: str
    deployed: list[TargetEntry]
    rejected: list[TargetEntry]
    e2e: dict[str, float | None]
    served_speed: SpeedFigures
    profile: dict[str, Any] | None
    profile_after: dict[str, Any] | None
    warnings: list[str]


# ====================================================================== the progress query
class TargetProgress(TypedDict, total=False):
    """One target's progress: its stage now, every stage it passed (`trail`), its iteration and best
    reward so far."""

    stage: str
    trail: list[str]
    iteration: int
    best_reward: int


class VerifierWorkers(TypedDict):
    """The GPU workers a campaign's verifications may go to, as last looked up."""

    kind: str
    workers: list[str]  # the identities of the GPU workers polling (workers/routing.py: GpuWorkers.pollers)


class CampaignProgress(TypedDict):
    """What the `progress` query returns (docs/CONTRACTS.md section 6)."""

    stage: str
    targets: dict[str, TargetProgress]  # by Target.key
    deploying: str | None  # the target holding the server now
    notices: list[str]  # rejected signals, the last 20
    waiting: NotRequired[str]  # while no GPU worker of the server's kind polls
    verifiers: NotRequired[VerifierWorkers]


# ====================================================================== `gpuyantra verify` on a worker
class FileVerdict(TypedDict, total=False):
    """verify_file's answer and VerifyKernel's result: the `verify --json` object (docs/CONTRACTS.md
    section 4; gpuyantra/verifier/verdict.py: Verdict.to_dict, whose extras pass through as they
    are), with the worker's `device`, `timed_on` and `candidate_path`."""

    op: Required[str | None]
    accepted: Required[bool]
    reward: Required[int]
    failures: Required[list[Failure]]
    speedup_vs_eager: Required[float | None]
    speedup_vs_compile: Required[float | None]
    device: str
    timed_on: dict[str, Any]  # gpuyantra/hardware.py: DeviceFacts
    candidate_path: str


def variant_of(variant: str | None) -> Variant:
    """`{"variant": ...}` for a linear target's entry (its projection shape), `{}` for any other
    target, whose entry has no such key."""
    return {"variant": variant} if variant else {}
