"""The campaign's records: what crosses the workflow-activity boundary, shared by the workflow, its
activities and the clients (stdlib only: the workflow sandbox imports it).

Three kinds of types live here:
- the activity inputs (`WriteInput`, `DeployInput`, ...) and results (`RetrieveResult`, `VerdictSummary`,
  `SwapAnswer`, ...): what Temporal serializes (dataclasses; the activities' annotations say which);
- `Target`, the typed view of a profile target that keeps every key it came with (`raw`): inputs
  carry it as the profile's JSON object, so the skill store and the report see the profile's fields
  the campaign does not model. Convert at the edges: `Target.from_dict(request.target)` where one
  comes in, `target.to_dict()` where one goes out; `from_dict(d).to_dict() == d`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, TypeVar

from gpuyantra.campaign.results import AuthorAttempt, CampaignResultJson, SkipEntry, Skipped, Strategy, TargetEntry
from gpuyantra.profile_digest import profile_digest  # stdlib only
from gpuyantra.rewards import REWARD_MAX, REWARD_MIN  # stdlib only
from gpuyantra.served_speed import benchmark_batches  # stdlib only

R = TypeVar("R", bound="JsonRecord")


# ====================================================================== typed views of JSON records
@dataclass(frozen=True, kw_only=True)
class JsonRecord:
    """A typed view of one JSON object. `raw` keeps the object as it came, keys the view does not
    model included, so forwarding a record never drops a field a later reader (the skill store, the
    report) needs, and a key that was absent stays absent."""

    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        names = {f.name for f in fields(cls)} - {"raw"}
        return cls(**{key: value for key, value in data.items() if key in names}, raw=dict(data))

    def to_dict(self) -> dict[str, Any]:
        """`raw` with the typed fields written over it; a field `raw` lacks is added only when it is
        required or differs from its default (so a record built in code says everything it holds)."""
        out = dict(self.raw)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "raw" and (f.name in out or _required(f) or value != _default(f)):
                out[f.name] = value
        return out


def known_fields(cls: type[Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `data` that are fields of the dataclass `cls` (an answer may say more)."""
    names = {f.name for f in fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def _required(f: Field[Any]) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


@dataclass(frozen=True, kw_only=True)
class Target(JsonRecord):
    """One profile target (gpuyantra/profiler/): an op family bound to a module class (and, for a
        linear, to one projection shape): the one typed view of a profile target (gpuyantra/profiler/targets.py
    and the server's fallback gpuyantra/profile_targets.py write them). The profile carries more
    (`served_shapes`, `why`, ...): in `raw`."""

    op: str
    module_class: str
    qualified_class: str | None = None  # what the verifier's --module and the swap's module_class take
    modules: int = 0
    adapter: list[dict[str, str]] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)  # live activation shapes, most frequent first
    dtype: str | None = None
    param_shapes: dict[str, list[int] | None] | None = None  # linear: the live weight/bias shapes
    variant: str | None = None  # linear: names the projection shape; several targets share a class
    regime: str | None = None  # memory-bound, compute-bound or launch-bound
    share: float | None = None  # the measured fraction of the served step the target's modules take
    est_gain: float | None = None  # the fraction of the step a swap is estimated to save (the profiler's)
    swapped: list[str] = field(default_factory=list)  # the committed swaps serving it now (swap ids)

    @property
    def estimated_gain(self) -> float:
        """`est_gain`, else (the fallback profile, which estimates nothing) `share`, the most a swap
        could save; 0 when the profile says neither."""
        value = self.est_gain if self.est_gain is not None else self.share
        return float(value) if isinstance(value, (int, float)) else 0.0

    @property
    def key(self) -> str:
        """`op:Class[variant]`: names the target in the campaign's progress."""
        return f"{self.op}:{self.module_class}" + (f"[{self.variant}]" if self.variant else "")


@dataclass(frozen=True, kw_only=True)
class VerdictSummary:
    """A verifier verdict as the campaign carries it: what verify_candidate returns, the workflow
    decides on, learn_skill stores and the result reports (gpuyantra/verifier/verdict.py:
    Verdict.to_dict's figures, plus the activity's `device`, `candidate_path`, and the campaign's
    gates beside the signed reward: `rows_gate`, `judged_on`). The verdict's other fields (checks,
    timings, isolation) stay with the verifier's own output."""

    op: str | None = None
    accepted: bool = False
    reward: int = REWARD_MIN  # the signed reward; a verdict without one counts as a rejection
    failures: list[dict[str, Any]] = field(default_factory=list)  # layer, rule, message
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    device: str | None = None
    kernel_us: float | None = None
    eager_us: float | None = None
    compile_us: float | None = None
    compile_ro_us: float | None = None
    floor_us: float | None = None
    shapes: list[list[int]] | None = None
    dtypes: list[str] | None = None
    bench: list[dict[str, Any]] = field(default_factory=list)  # per timed shape: shape, kernel_us, eager_us, ...
    candidate_path: str | None = None
    attestation: dict[str, Any] | None = None  # the signed record the server checks before swapping
    rows_gate: dict[str, list[int]] | None = None  # row counts where the kernel lost: the original serves them
    # The campaign's judgement on the target's served decode shapes (gpuyantra/campaign/policy.py), beside
    # the signed reward: {"shapes", "why", "reward", "speedup_vs_eager", "speedup_vs_compile"}.
    judged_on: dict[str, Any] | None = None
    # Set when the worker reused the verdict of the same bytes asked the same question before
    # (gpuyantra/verifier/reuse.py): its key and when it was verified.
    reused: dict[str, Any] | None = None
    timed_on: dict[str, Any] | None = None  # the device it was timed on (gpuyantra/hardware.py: DeviceFacts)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VerdictSummary:
        """The fields above of a verdict object; the rest is left out."""
        kept = known_fields(cls, data)
        if kept.get("reward") is not None:  # a 3.0 is rung +3
            kept["reward"] = int(kept["reward"])
        else:
            kept.pop("reward", None)
        return cls(**kept)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def speed_judged(self) -> bool:
        """Speed means something only off the interpreter: a CPU verdict judges correctness only."""
        return self.device != "cpu"


@dataclass(frozen=True, kw_only=True)
class SkillSeed:
    """The stored skill UCB1 chose to seed a target's first attempt (RetrieveResult.seed)."""

    id: str
    op: str | None = None
    source: str | None = None
    strategy: Strategy | None = None


@dataclass(frozen=True, kw_only=True)
class SkillCandidate:
    """One stored skill retrieve_skills found for a target (RetrieveResult.candidates)."""

    id: str
    op: str
    hardware: str
    reward: float | None = None
    pulls: int = 0


# ====================================================================== activity inputs and results
@dataclass
class CampaignInput:
    """docs/CONTRACTS.md section 6. Every field but server_url is optional."""

    server_url: str
    ops: list[str] | None = None
    min_reward: int = REWARD_MAX
    max_iterations: int = 6
    require_approval: bool = False
    device: str | None = None  # where candidates are verified; None = the GPU worker's own device
    # When ops is not given: at most this many of the targets whose estimated gain is above the
    # measured noise (None: all of them; campaigns started before that took the top 3).
    max_targets: int | None = None
    # Deploy a kernel even if serving this model rolled it back for speed before (skill memory).
    redeploy_rolled_back: bool = False


@dataclass
class ServerCall:
    server_url: str


@dataclass
class BenchmarkInput:
    """benchmark_server's input. Campaigns recorded before `batches` sent `{"server_url"}` alone:
    batch 1 is measured for them, as it was then."""

    server_url: str
    batches: list[int] | None = None  # decode batches to measure (the profile's served_batches)


@dataclass
class CompareInput:
    """compare_swap's input: one active swap measured on and off in turns at each batch."""

    server_url: str
    swap_id: str
    batches: list[int] | None = None


@dataclass
class RetrieveInput:
    target: dict[str, Any]
    hardware: str


@dataclass
class RetrieveResult:
    candidates: list[SkillCandidate] = field(default_factory=list)
    seed: SkillSeed | None = None  # the skill UCB1 chose


@dataclass
class WriteInput:
    target: dict[str, Any]
    hardware: str
    iteration: int
    seed: SkillSeed | None = None
    history: list[AuthorAttempt] = field(default_factory=list)


@dataclass
class WriteResult:
    source: str
    strategy: Strategy
    author: str
    notes: str = ""


@dataclass
class VerifyInput:
    campaign_id: str
    target: dict[str, Any]
    iteration: int
    source: str
    device: str | None = None


@dataclass
class VerifyFileInput:
    """`gpuyantra verify FILE` run by this machine's GPU worker (the `VerifyKernel` workflow), whose
    sandbox children are started and warm. The fields are the command's options."""

    source: str
    file_name: str = "candidate.py"
    device: str | None = None
    module_class: str | None = None
    shapes: list[list[int]] | None = None
    dtypes: list[str] | None = None
    param_shapes: dict[str, list[int] | None] | None = None
    timeout: float | None = None
    # `--problem`: a KernelBench problem file's name and text (never a path the worker would read).
    problem_name: str | None = None
    problem_source: str | None = None


@dataclass
class OutcomeInput:
    skill_id: str
    reward: float


@dataclass
class ServedMemoryInput:
    """served_rollbacks' input: the kernel's skill and the served model's name."""

    skill_id: str
    model: str


@dataclass
class ServedRollbackInput:
    """record_served_rollback's input: a kernel rolled back for served speed, and why."""

    skill_id: str
    model: str
    campaign_id: str
    reason: str
    batches: list[int] = field(default_factory=list)  # the batches whose served speed dropped


@dataclass
class LearnInput:
    campaign_id: str
    target: dict[str, Any]
    hardware: str
    iteration: int
    source: str
    strategy: Strategy
    verdict: VerdictSummary
    author: str


@dataclass
class DeployInput:
    server_url: str
    target: dict[str, Any]
    source: str
    attestation: dict[str, Any] | None = None  # the verdict's signed record of exactly `source`
    rows_gate: dict[str, list[int]] | None = None  # row counts the kernel and the original serve (the verdict's)


@dataclass
class RollbackInput:
    server_url: str
    swap_id: str


# ====================================================================== activity answers
@dataclass(frozen=True, kw_only=True)
class ServerProfile:
    """profile_server's answer: what a campaign reads of the server's /admin/profile."""

    hardware: str = "unknown"
    model: str | None = None
    # The decode batches a kernel is judged at (the profile's `served_batches`); None: batch 1 alone.
    served_batches: list[int] | None = None
    # The profile's targets, best first, each its whole JSON object (`Target.from_dict` reads it; the
    # skill store's fingerprint and the selection read fields `Target` does not model).
    targets: list[dict[str, Any]] = field(default_factory=list)
    digest: dict[str, Any] | None = None  # what the campaign result reports (gpuyantra/profile_digest.py)
    hardware_kind: str | None = None  # the served GPU's kind, when the server names it
    device_key: str | None = None  # the served GPU itself: verifications go to another of its kind

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> ServerProfile:
        return cls(
            hardware=str(answer.get("hardware") or "unknown"),
            model=str(answer["model"]) if answer.get("model") else None,
            served_batches=benchmark_batches(answer),
            targets=[dict(t) for t in answer.get("targets") or [] if isinstance(t, Mapping)],
            digest=profile_digest(dict(answer)),
            hardware_kind=str(answer["hardware_kind"]) if answer.get("hardware_kind") else None,
            device_key=str(answer["device_key"]) if answer.get("device_key") else None,
        )


@dataclass(frozen=True, kw_only=True)
class SwapAnswer:
    """deploy_kernel's answer: what /admin/swap answered (serving/admin_schema.py: SwapAnswer)."""

    swap_id: str
    op: str | None = None
    module_class: str | None = None
    qualified_class: str | None = None
    modules: int = 0  # how many modules the kernel was bound into
    parity: dict[str, Any] | None = None  # the parity check on the live weights
    status: str = "committed"
    file: str | None = None
    digest: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SwapAnswer:
        return cls(**known_fields(cls, data))


@dataclass(frozen=True, kw_only=True)
class RollbackAnswer:
    """rollback_swap's answer: the swaps /admin/rollback rolled back and those still bound (swap records)."""

    rolled_back: list[dict[str, Any]] = field(default_factory=list)
    active: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class PreflightAnswer:
    """preflight_campaign's answer: which of gpuyantra's search attributes the namespace has registered."""

    search_attributes: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class ServedRollback:
    """One rollback for served speed kept with a kernel's skill (served_rollbacks' answer, oldest first)."""

    model: str = ""
    campaign: str | None = None
    reason: str | None = None
    batches: list[int] = field(default_factory=list)  # the batches whose served speed dropped
    at: str | None = None  # when it was kept (ISO 8601, UTC)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServedRollback:
        return cls(**known_fields(cls, data))


@dataclass(frozen=True, kw_only=True)
class CampaignResult:
    """OptimizeCampaign's result (docs/CONTRACTS.md section 6); `to_dict()` is the JSON it returns and
    `from_dict` reads it back (a client, the report)."""

    workflow_id: str
    server: str
    model: str | None = None
    hardware: str = "unknown"
    deployed: list[TargetEntry] = field(default_factory=list)  # one entry per kept deployment
    rejected: list[TargetEntry] = field(default_factory=list)  # one entry, with its reason, per op not deployed
    skipped: list[SkipEntry] = field(default_factory=list)  # targets not searched; absent from the JSON when none
    e2e: dict[str, float | None] = field(default_factory=dict)  # tokens_per_s_before, tokens_per_s_after
    served_speed: dict[str, Any] = field(default_factory=dict)  # before, after, after_source, batches
    profile: dict[str, Any] | None = None  # digests (gpuyantra/profile_digest.py)
    profile_after: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CampaignResult:
        return cls(**known_fields(cls, data))

    def to_dict(self) -> CampaignResultJson:
        skipped: Skipped = {"skipped": self.skipped} if self.skipped else {}
        return {
            "workflow_id": self.workflow_id,
            "server": self.server,
            "model": self.model,
            "hardware": self.hardware,
            "deployed": self.deployed,
            "rejected": self.rejected,
            **skipped,
            "e2e": self.e2e,
            "served_speed": self.served_speed,
            "profile": self.profile,
            "profile_after": self.profile_after,
            "warnings": self.warnings,
        }
