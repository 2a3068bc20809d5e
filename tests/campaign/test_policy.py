"""The campaign's gates (gpuyantra/campaign/policy.py): a served target is judged on its decode shapes
(served tokens/s is decode steps, one call per shape per step, while the prefill shape runs once per
request), beside the signed reward, never over it; the rows gate."""

from __future__ import annotations

from gpuyantra.campaign.policy import campaign_reward, rows_gate, served_decode_judgement
from gpuyantra.campaign.records import VerdictSummary
from gpuyantra.verifier.verdict import reward_on_shapes

DECODE_1, DECODE_8, PREFILL = [1, 1, 1536], [8, 1, 1536], [1, 54, 1536]


def _row(shape: list[int], kernel: float, eager: float, compiled: float) -> dict:
    return {"shape": shape, "kernel_us": kernel, "eager_us": eager, "compile_us": compiled, "compile_ro_us": None}


def _verdict(*rows: dict, failures: list | None = None) -> dict:
    return {"device": "cuda", "reward": 1, "speedup_vs_eager": 1.0, "speedup_vs_compile": 1.0,
            "failures": failures or [], "bench": list(rows)}  # fmt: skip


# A GEMV 30% faster at both decode batches, 25% slower on the prefill shape: the measured pattern.
GEMV = _verdict(_row(DECODE_8, 4.5, 5.9, 9.0), _row(PREFILL, 7.1, 5.9, 9.0), _row(DECODE_1, 4.5, 5.8, 9.0))
TARGET = {"op": "linear", "served_shapes": {"decode@1": [DECODE_1], "decode@8": [DECODE_8]}}


def test_decode_gains_decide_for_a_served_target():
    judged = served_decode_judgement(GEMV, TARGET)
    assert judged is not None and judged["reward"] == 3
    assert judged["speedup_vs_eager"] == reward_on_shapes(GEMV, [DECODE_1, DECODE_8])["speedup_vs_eager"]
    assert 1.28 < judged["speedup_vs_eager"] < 1.32
    assert judged["shapes"] == [DECODE_8, DECODE_1]  # the judgement says which shapes decided
    # The signed verdict is the verdict: its reward stays, the campaign acts on the judgement beside it.
    verdict = VerdictSummary.from_dict({**GEMV, "judged_on": judged})
    assert verdict.reward == 1 and campaign_reward(verdict) == 3
    assert campaign_reward(VerdictSummary.from_dict(GEMV)) == 1


def test_a_verdict_recorded_with_its_reward_rewritten_is_decided_on_that_reward():
    # Histories of running campaigns hold verdicts whose `reward` the judgement had replaced.
    recorded = {**GEMV, "reward": 3, "judged_on": {"shapes": [DECODE_8, DECODE_1], "why": "served decode shapes"}}
    assert campaign_reward(VerdictSummary.from_dict(recorded)) == 3


def test_a_decode_loss_is_not_outvoted_by_prefill():
    verdict = _verdict(_row(DECODE_1, 7.0, 5.8, 9.0), _row(PREFILL, 2.0, 5.9, 9.0))
    judged = served_decode_judgement(verdict, TARGET)
    assert judged is not None and judged["reward"] == 1


def test_no_judgement_without_decode_shapes_or_with_failures():
    assert served_decode_judgement(GEMV, {"op": "linear"}) is None
    assert served_decode_judgement(GEMV, {"served_shapes": {"prefill": [PREFILL]}}) is None
    failed = _verdict(*GEMV["bench"], failures=[{"layer": "correctness", "rule": "wrong-values"}])
    assert served_decode_judgement(failed, TARGET) is None
    only_decode = _verdict(_row(DECODE_1, 4.5, 5.8, 9.0))
    assert served_decode_judgement(only_decode, TARGET) is None  # decided on the same shapes


def test_compile_speedup_needs_every_decode_shape_compiled():
    verdict = _verdict(_row(DECODE_1, 4.5, 5.8, 9.0), {**_row(DECODE_8, 4.5, 5.9, 9.0), "compile_us": None})
    judged = reward_on_shapes(verdict, [DECODE_1, DECODE_8])
    assert judged["speedup_vs_compile"] is None and judged["reward"] == 2


def test_the_rows_gate_gives_each_timed_row_count_to_whichever_was_faster_there():
    assert rows_gate(GEMV) == {"kernel": [1, 8], "original": [54]}  # the prefill shape lost
    two_dtypes = _verdict(
        _row(DECODE_8, 5.0, 4.0, 9.0), {**_row(DECODE_8, 5.0, 7.0, 9.0), "dtype": "float16"}, _row(DECODE_1, 3, 5, 9)
    )
    assert rows_gate(two_dtypes) is None  # 8 rows: 0.8 and 1.4 over two dtypes, geometric mean 1.06
    assert rows_gate(_verdict(_row(DECODE_1, 3.0, 5.0, 9.0), _row(DECODE_8, 6.0, 5.0, 9.0))) == {
        "kernel": [1],
        "original": [8],
    }
    assert rows_gate(_verdict(_row(DECODE_1, 3.0, 5.0, 9.0))) is None  # faster everywhere: no gate
    assert rows_gate({**GEMV, "device": "cpu"}) is None  # the interpreter's speed says nothing
    failed = _verdict(_row(PREFILL, 7.1, 5.9, 9.0), failures=[{"layer": "correctness"}])
    assert rows_gate(failed) is None
    nested = _verdict(_row(DECODE_1, 3.0, 5.0, 9.0), {**_row(DECODE_8, 6.0, 5.0, 9.0), "shape": [[8, 3], [3, 4]]})
    assert rows_gate(nested) is None  # a row without one activation's shape decides nothing
