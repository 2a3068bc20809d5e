"""The records that cross the workflow boundary (gpuyantra/campaign/records.py): a target gives back
the profile's JSON unchanged (the skill store reads fields the campaign does not model), a verdict
keeps what the campaign carries; and the reward ceiling they stop at (gpuyantra/rewards.py)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuyantra.campaign.policy import at_ceiling
from gpuyantra.campaign.records import (
    RetrieveResult,
    RollbackAnswer,
    SkillCandidate,
    SkillSeed,
    SwapAnswer,
    Target,
    VerdictSummary,
)
from gpuyantra.rewards import CEILING, REWARD_ACCEPTED, REWARD_MAX, ceiling

PROFILE_TARGET = {
    "op": "linear",
    "module_class": "Linear",
    "qualified_class": "torch.nn.modules.linear.Linear",
    "modules": 28,
    "adapter": [],
    "shapes": [[1, 1536]],
    "dtype": "bfloat16",
    "dtypes": ["bfloat16"],
    "regime": "memory-bound",
    "share": 0.31,
    "param_shapes": {"weight": [2048, 1536], "bias": None},
    "variant": "2048x1536",
    "why": "...",
}
CPU_VERDICT = {
    "op": "rms_norm",
    "accepted": True,
    "reward": 1,
    "failures": [],
    "speedup_vs_eager": None,  # present and null: the report shows it as such
    "speedup_vs_compile": None,
    "device": "cpu",
    "candidate_path": "/tmp/c.py",
}


def test_a_target_gives_back_the_json_it_read():
    out = Target.from_dict(PROFILE_TARGET).to_dict()
    assert out == PROFILE_TARGET and list(out) == list(PROFILE_TARGET)


def test_a_verdict_keeps_what_the_campaign_carries_and_leaves_the_rest_to_the_verifier():
    verdict = VerdictSummary.from_dict({**CPU_VERDICT, "checks": 40, "timings": {"static": 0.1}})
    out = verdict.to_dict()
    assert {key: out[key] for key in CPU_VERDICT} == CPU_VERDICT  # nulls stay present: the report shows them
    assert "checks" not in out and "timings" not in out
    assert VerdictSummary.from_dict(out) == verdict


def test_target_reads_the_fields_the_campaign_uses():
    target = Target.from_dict(PROFILE_TARGET)
    assert target.key == "linear:Linear[2048x1536]"
    assert target.param_shapes == {"weight": [2048, 1536], "bias": None} and target.dtype == "bfloat16"
    plain = Target.from_dict({"op": "rms_norm", "module_class": "Qwen2RMSNorm"})
    assert plain.key == "rms_norm:Qwen2RMSNorm" and plain.shapes == [] and plain.variant is None


def test_a_changed_field_is_what_goes_out():
    target = dataclasses.replace(Target.from_dict(PROFILE_TARGET), modules=3)
    assert target.to_dict()["modules"] == 3 and target.to_dict()["why"] == "..."


def test_a_record_built_in_code_writes_what_it_holds():
    built = Target(op="softmax", module_class="S", shapes=[[4, 64]])
    assert built.to_dict() == {"op": "softmax", "module_class": "S", "shapes": [[4, 64]]}  # defaults left out
    assert Target.from_dict(built.to_dict()) == built


def test_a_target_without_its_class_is_refused():
    with pytest.raises(TypeError):
        Target.from_dict({"op": "rms_norm"})


def test_verdict_stops_at_its_devices_ceiling():
    cpu = VerdictSummary.from_dict(CPU_VERDICT)
    assert at_ceiling(cpu) and not cpu.speed_judged
    cuda = VerdictSummary.from_dict({**CPU_VERDICT, "device": "cuda", "reward": 2.0})
    assert cuda.reward == 2 and isinstance(cuda.reward, int) and not at_ceiling(cuda) and cuda.speed_judged
    assert at_ceiling(VerdictSummary.from_dict({"device": "cuda", "reward": 3}))
    assert VerdictSummary.from_dict({}).reward == -1  # no reward: a rejection


def test_a_seed_and_its_candidates_travel_typed():
    seed = SkillSeed(id="s1", op="rms_norm", source="x", strategy={"BLOCK": 64})
    found = RetrieveResult(candidates=[SkillCandidate(id="s1", op="rms_norm", hardware="h", reward=3.0)], seed=seed)
    assert dataclasses.asdict(found)["seed"] == {"id": "s1", "op": "rms_norm", "source": "x", "strategy": {"BLOCK": 64}}


def test_ceiling_per_device() -> None:
    assert ceiling("cpu") == REWARD_ACCEPTED == 1 and ceiling("cuda") == REWARD_MAX == 3
    assert ceiling(None) == ceiling("rocm") == REWARD_MAX  # unknown devices are judged like CUDA
    with pytest.raises(TypeError):
        CEILING["cpu"] = 3  # type: ignore[index]  # one table, read-only


def test_the_swap_rollback_and_readiness_answers_are_the_servers_own():
    # The server declares its answers in serving/admin_schema.py (pydantic, in the OpenAPI schema); the
    # workflow side reads them as these records (no pydantic in the sandbox). One field list, checked.
    from serving import admin_schema

    assert {f.name for f in dataclasses.fields(SwapAnswer)} == set(admin_schema.SwapAnswer.model_fields)
    assert {f.name for f in dataclasses.fields(RollbackAnswer)} == set(admin_schema.RollbackAnswer.model_fields)
    # The clients' /readyz answer: the server's ready and not-ready bodies, one key list.
    from gpuyantra.server_client import Readiness
    from serving import routes_health

    probe = set(routes_health.Readiness.model_fields) | set(routes_health.ProbeFailure.model_fields)
    assert set(Readiness.__annotations__) == probe
    answer = {"swap_id": "s1", "op": "rms_norm", "modules": 3, "status": "committed", "new_key": 1}
    assert SwapAnswer.from_dict(answer) == SwapAnswer(swap_id="s1", op="rms_norm", modules=3)  # a new key: ignored
