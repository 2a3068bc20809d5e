"""The campaign's JSON-shaped records (gpuyantra/campaign/results.py) keep the JSON they replaced:
the keys, their order, and the keys that are absent rather than null (docs/CONTRACTS.md sections 4
and 6)."""

from __future__ import annotations

import dataclasses

from temporalio.converter import value_to_type

from gpuyantra.campaign.records import CampaignResult, Target, VerdictSummary
from gpuyantra.campaign.results import AuthorAttempt, CampaignResultJson, FileVerdict
from workflows.campaign import verdict_digest
from workflows.targets import skip_entry

RESULT_KEYS = ["workflow_id", "server", "model", "hardware", "deployed", "rejected"]
RESULT_TAIL = ["e2e", "served_speed", "profile", "profile_after", "warnings"]
DIGEST_KEYS = [
    "accepted",
    "reward",
    "device",
    "failures",
    "speedup_vs_eager",
    "speedup_vs_compile",
    "kernel_us",
    "eager_us",
    "compile_us",
    "compile_ro_us",
    "floor_us",
    "shapes",
    "dtypes",
    "candidate_path",
]


def test_skipped_is_absent_when_nothing_was_skipped_and_in_its_place_otherwise() -> None:
    nothing = CampaignResult(workflow_id="w", server="http://127.0.0.1:1").to_dict()
    assert list(nothing) == RESULT_KEYS + RESULT_TAIL
    skip = skip_entry(Target(op="softmax", module_class="S"), "beyond max_targets 1")
    some = CampaignResult(workflow_id="w", server="http://127.0.0.1:1", skipped=[skip]).to_dict()
    assert list(some) == [*RESULT_KEYS, "skipped", *RESULT_TAIL]
    assert CampaignResult.from_dict(some).to_dict() == some


def test_a_variant_is_named_only_for_a_linear_target() -> None:
    plain = skip_entry(Target(op="softmax", module_class="S"), "why")
    linear = skip_entry(Target(op="linear", module_class="Linear", variant="2048x1536"), "why")
    assert plain == {"op": "softmax", "module_class": "S", "reason": "why"}
    assert list(linear) == ["op", "module_class", "reason", "variant"] and linear["variant"] == "2048x1536"


def test_the_verdict_digest_keeps_its_keys_and_order() -> None:
    bench = [{"shape": [4, 64], "kernel_us": 2.5, "eager_us": 5.0, "checks": 9, "bytes": 1024}]
    verdict = VerdictSummary(accepted=True, reward=1, device="cpu", bench=bench, timed_on={"kind": "cpu"})
    digest = verdict_digest(verdict)
    assert list(digest) == [*DIGEST_KEYS, "timed_on", "bench"]  # no judgement: no judged_on key
    assert digest["bench"] == [{"shape": [4, 64], "kernel_us": 2.5, "eager_us": 5.0, "bytes": 1024}]
    judged = verdict_digest(VerdictSummary(accepted=True, reward=3, judged_on={"reward": 2, "shapes": [[1, 64]]}))
    assert list(judged) == [*DIGEST_KEYS, "judged_on", "timed_on", "bench"]
    assert judged["judged_on"] == {"reward": 2, "shapes": [[1, 64]]}


def test_a_workers_verdict_decodes_to_the_same_json() -> None:
    """VerifyKernel's result goes through Temporal's decoding with FileVerdict as its type: the
    `verify --json` object, extras and their order included, comes out as it went in."""
    verdict = {
        "op": "rms_norm",
        "accepted": True,
        "reward": 1,
        "failures": [],
        "speedup_vs_eager": None,
        "speedup_vs_compile": 1.25,
        "kernel_us": 3.5,
        "checks": 12,
        "bench": [{"shape": [4, 64], "bytes": 1024}],
        "device": "cpu",
        "timed_on": {"kind": "cpu", "memory_bytes": None},
        "candidate_path": "/state/candidates/verify/k_0123.py",
    }
    decoded = value_to_type(FileVerdict, verdict)
    assert decoded == verdict and list(decoded) == list(verdict)


def test_a_campaign_result_decodes_to_the_same_json() -> None:
    """A client typed by the workflow (`execute_workflow(OptimizeCampaign.run, ...)`) reads the JSON as it was."""
    entry = {"op": "silu_mul", "module_class": "M", "reward": 1, "reason": "below", "attempts": [], "verdict": {}}
    result = CampaignResult(workflow_id="w", server="s", rejected=[entry, {"op": "rope", "reason": "no module"}])
    out = result.to_dict()
    decoded = value_to_type(CampaignResultJson, out)
    assert decoded == out and "skipped" not in decoded


def test_the_authors_view_of_an_attempt_is_the_authors_record() -> None:
    """write_candidate rebuilds each AuthorAttempt as gpuyantra.authors.Attempt(**entry): one key list."""
    from gpuyantra.authors.base import Attempt

    assert set(AuthorAttempt.__annotations__) == {f.name for f in dataclasses.fields(Attempt)}
