"""A campaign's verify activity reuses an accepted verdict for the very same question, and only then."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.gpu import verify_candidate
from gpuyantra.campaign.records import VerifyInput
from gpuyantra.verifier import reuse

TEMPLATE = Path(__file__).resolve().parents[2] / "gpuyantra" / "kernels" / "rms_norm.py"
QUESTION = {
    "op": "rms_norm",
    "module_class": "tests.Norm",
    "shapes": [[4, 64]],
    "dtypes": ["float32"],
    "param_shapes": None,
    "device_name": "cpu",
    "versions": {"torch": "2.13.0", "triton": "3.9.0"},
}


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path))
    monkeypatch.delenv(reuse.FRESH_ENV, raising=False)
    return tmp_path


def test_the_key_changes_with_every_part_of_the_question():
    base = reuse.verdict_key("code", **QUESTION)
    assert reuse.verdict_key("code", **QUESTION) == base
    assert reuse.verdict_key("code ", **QUESTION) != base  # one byte of the candidate
    for field, other in (
        ("op", "layer_norm"),
        ("module_class", "tests.Other"),
        ("shapes", [[4, 65]]),
        ("dtypes", ["float16"]),
        ("param_shapes", {"weight": [64]}),
        ("device_name", "NVIDIA H200"),
        ("versions", {"torch": "2.11.0", "triton": "3.9.0"}),
    ):
        assert reuse.verdict_key("code", **{**QUESTION, field: other}) != base, field


def test_only_accepted_verdicts_are_kept(state):
    assert not reuse.store("k1", {"accepted": False, "reward": -1})
    assert reuse.load("k1") is None
    assert reuse.store("k2", {"accepted": True, "reward": 3})
    loaded = reuse.load("k2")
    assert loaded is not None and loaded["reward"] == 3 and loaded["reused"]["key"] == "k2"


def test_the_activity_verifies_once_then_reuses_and_fresh_verdicts_can_be_asked(state, monkeypatch):
    target = {"op": "rms_norm", "module_class": "Qwen2RMSNorm", "shapes": [[4, 64]], "dtype": "float32"}
    request = VerifyInput(campaign_id="c1", target=target, iteration=1, source=TEMPLATE.read_text(), device="cpu")
    env = ActivityEnvironment()
    first = env.run(verify_candidate, request)
    assert first.accepted and first.reused is None
    second = env.run(verify_candidate, VerifyInput(**{**request.__dict__, "iteration": 2}))
    assert second.reused is not None and second.reused["verified_at"] and second.reward == first.reward
    assert second.candidate_path is not None and second.candidate_path.endswith("_2.py")
    assert Path(second.candidate_path).exists() and second.attestation == first.attestation
    # Asked for fresh verdicts, the worker verifies again (and the new verdict is its own).
    monkeypatch.setenv(reuse.FRESH_ENV, "1")
    third = env.run(verify_candidate, VerifyInput(**{**request.__dict__, "iteration": 3}))
    assert third.accepted and third.reused is None


def test_the_activity_hands_the_served_layouts_to_the_verifier(state):
    # The profile target's strided layouts reach the plan (`live_layout`): a malformed one is refused
    # by the verifier's own check, naming the field, before any candidate runs.
    target = {"op": "rms_norm", "module_class": "Qwen2RMSNorm", "shapes": [[4, 64]], "dtype": "float32"}
    target["layouts"] = [{"input": 0, "shape": [4, 64], "stride": [-1, 1], "offset": 0}]
    request = VerifyInput(campaign_id="c1", target=target, iteration=1, source=TEMPLATE.read_text(), device="cpu")
    with pytest.raises(ValueError, match=r"layouts\[0\]"):
        ActivityEnvironment().run(verify_candidate, request)
