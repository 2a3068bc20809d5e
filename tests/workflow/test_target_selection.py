"""Which targets a campaign goes after: every estimated gain above the measured noise (no fixed
top 3), at most `max_targets` when given, never a target a committed swap already serves."""

from __future__ import annotations

from typing import Any

from gpuyantra.campaign.inputs import parse_campaign_input
from gpuyantra.campaign.records import CampaignInput, Target
from gpuyantra.served_speed import Measurement
from tests.workflow.test_campaign_logic import TARGET, Script, run
from workflows.targets import choose_targets, measured_noise


def target(op: str, gain: float | None, swapped: list[str] | None = None, **extra: Any) -> Target:
    """A profile target as the profile writes it, read as the campaign reads it."""
    entry: dict[str, Any] = {**TARGET, "op": op, "module_class": f"{op}_class", **extra}
    if gain is not None:
        entry["est_gain"] = gain
    if swapped is not None:
        entry["swapped"] = swapped
    return Target.from_dict(entry)


RANKED = [
    target("rope", 0.20, swapped=["swap-1"]),
    target("rms_norm", 0.08, swapped=[]),
    target("linear", 0.06, variant="1536x256"),
    target("silu_mul", 0.05),
    target("linear", 0.04, variant="1536x8960"),
    target("softmax", 0.01),
    target("add_rms_norm", -0.02),
]


def ops_of(targets: list[Target]) -> list[str]:
    return [f"{t.op}:{t.variant}" if t.variant else t.op for t in targets]


def test_every_gain_above_the_noise_is_chosen_not_a_fixed_three():
    choice = choose_targets(RANKED, None, None, noise=0.02)
    assert ops_of(choice.chosen) == ["rms_norm", "linear:1536x256", "silu_mul", "linear:1536x8960"]
    reasons = {entry["op"]: entry["reason"] for entry in choice.skipped}
    assert reasons["rope"].startswith("already swapped (swap swap-1")
    assert "not above the measured noise 2.00%" in reasons["softmax"]
    assert "-2.00%" in reasons["add_rms_norm"]


def test_max_targets_stays_an_explicit_cap_and_says_so():
    choice = choose_targets(RANKED, None, 2, noise=0.02)
    assert ops_of(choice.chosen) == ["rms_norm", "linear:1536x256"]
    capped = [entry for entry in choice.skipped if entry["reason"] == "beyond max_targets 2"]
    assert [entry.get("variant", entry["op"]) for entry in capped] == ["silu_mul", "1536x8960"]


def test_named_ops_ignore_the_noise_but_never_redeploy_a_swapped_target():
    choice = choose_targets(RANKED, ["rope", "softmax"], None, noise=0.5)
    assert ops_of(choice.chosen) == ["softmax"]
    assert [entry["op"] for entry in choice.skipped] == ["rope"]


def test_a_profile_without_gain_estimates_is_ranked_by_share():
    fallback = [
        Target.from_dict({**TARGET, "share": 0.3}),
        Target.from_dict({**TARGET, "op": "softmax", "share": 0.001}),
    ]
    assert fallback[0].estimated_gain == 0.3 and target("x", None).estimated_gain == 0.0
    assert ops_of(choose_targets(fallback, None, None, noise=0.02).chosen) == ["rms_norm"]


def test_the_noise_is_the_widest_spread_over_the_measured_batches():
    measured = {"relative_spread": 0.01, "batches": [{"relative_spread": 0.01}, {"relative_spread": 0.04}]}
    assert measured_noise(Measurement.from_dict(measured)) == 0.04
    assert measured_noise(None) == 0.0 and measured_noise(Measurement(tokens_per_s=5.0)) == 0.0


def test_max_targets_is_optional_in_the_input():
    assert parse_campaign_input(({"server_url": "http://x"},)).max_targets is None
    assert parse_campaign_input(({"server_url": "http://x", "max_targets": 10},)).max_targets == 10


async def test_a_campaign_without_flags_goes_after_every_target_above_the_noise(env):
    # Batch 8's spread (4 %) is the noise: rms_norm and silu_mul gain more, softmax less; rope is
    # already swapped. Two are deployed where the old default of three would have taken rope too.
    profile = [
        target("rope", 0.3, swapped=["s0"]),
        target("rms_norm", 0.1),
        target("silu_mul", 0.05),
        target("softmax", 0.01),
    ]
    script = Script(rewards=[3], targets=[t.to_dict() for t in profile], batch8_spread=0.04)
    result = await run(env.client, script, CampaignInput(server_url="http://x"))
    assert sorted(entry["op"] for entry in result["deployed"]) == ["rms_norm", "silu_mul"]
    skipped = {entry["op"]: entry["reason"] for entry in result["skipped"]}
    assert skipped["rope"].startswith("already swapped") and "noise 4.00%" in skipped["softmax"]
    assert result["rejected"] == []
    assert script.benchmarked[0] == [1, 8]  # the noise is measured before the targets are chosen


async def test_a_named_op_already_swapped_is_reported_not_redeployed(env):
    script = Script(rewards=[3], targets=[target("rms_norm", 0.1, swapped=["s1"]).to_dict()])
    result = await run(env.client, script, CampaignInput(server_url="http://x", ops=["rms_norm"]))
    assert result["deployed"] == [] and result["rejected"] == []
    assert result["skipped"][0]["reason"].startswith("already swapped (swap s1")
    assert "deploy" not in script.calls and not any(c.startswith("verify") for c in script.calls)


def test_the_summary_names_what_was_already_swapped_and_counts_the_rest():
    from gpuyantra.report.result import text_summary

    choice = choose_targets(RANKED, None, 1, noise=0.02)
    lines = text_summary({"workflow_id": "c", "deployed": [], "rejected": [], "skipped": choice.skipped})
    assert any(line.startswith("  skipped rope (rope_class): already swapped (swap swap-1") for line in lines)
    assert "  skipped 5 more target(s): estimated gain within the measured noise, or beyond max_targets" in lines
