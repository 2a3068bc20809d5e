"""The keep-or-roll-back rule for a swap and the spread figures it is judged by (plain Python)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuyantra.served_speed import (
    NOISE_FLOOR,
    PAIRED_FLOOR,
    Measurement,
    PairedAnswer,
    batch_figures,
    batch_warnings,
    benchmark_batches,
    figures,
    judge_batches,
    judge_paired,
    judge_pairs,
    judge_swap,
    judged_figures,
    lock_warning,
    measurement_of,
    paired_drops,
    per_batch,
    phase_order,
    repeat_spread,
    rollback_reason,
    slowdown_warning,
)


def answer(*samples: float, batch: int | None = None) -> dict:
    """An /admin/benchmark answer of these repeats."""
    return {
        **repeat_spread(list(samples)),
        "repeats": len(samples),
        "measured": "benchmark",
        **({"batch": batch} if batch is not None else {}),
    }


def measured(*samples: float, batch: int | None = None) -> Measurement:
    return Measurement.from_dict(answer(*samples, batch=batch))


def speed(**figures: object) -> Measurement:
    """A measurement of just these figures (tokens_per_s=..., relative_spread=..., measured=...)."""
    return Measurement.from_dict(figures)


def served(one_row: Measurement, batched: Measurement) -> Measurement:
    """A measurement at batch 1 and batch 8, as benchmark_server answers."""
    answers = [{**as_answer(batched), "batch": 8}, {**as_answer(one_row), "batch": 1}]
    return measurement_of(answers, {"held": True, "waited_s": 0.0})


def as_answer(measurement: Measurement) -> dict:
    return {key: value for key, value in dataclasses.asdict(measurement).items() if value is not None}


def test_repeat_spread_reports_median_min_max_and_relative_figures():
    out = repeat_spread([695.0, 742.0, 757.0, 696.0, 720.0])
    assert out["tokens_per_s"] == 720.0 and out["tokens_per_s_min"] == 695.0 and out["tokens_per_s_max"] == 757.0
    assert out["relative_spread"] == pytest.approx(62 / 720)
    assert out["relative_mad"] == pytest.approx(1.4826 * 24 / 720)
    assert repeat_spread([])["tokens_per_s"] == 0.0


def test_drop_within_the_measured_spread_is_kept():
    # The unchanged server of the bug report: 695..757 tokens/s. A 4 % lower median is noise.
    before = measured(695.0, 742.0, 757.0, 696.0, 720.0)
    after = measured(690.0, 700.0, 690.0, 740.0, 705.0)
    judgement = judge_swap(before, after)
    assert judgement["decision"] == "keep" and judgement["noise"] == pytest.approx(62 / 720)


def test_drop_beyond_both_spreads_is_rolled_back():
    judgement = judge_swap(measured(99.0, 100.0, 101.0), measured(75.0, 80.0, 85.0))
    assert judgement == {"decision": "rollback", "drop": pytest.approx(0.2), "noise": pytest.approx(10 / 80)}


def test_the_wider_spread_of_before_and_after_counts():
    quiet, noisy_after = measured(99.0, 100.0, 101.0), measured(70.0, 90.0, 100.0)  # after spreads 33 %
    assert judge_swap(quiet, noisy_after)["decision"] == "keep"  # 10 % drop, inside the after spread


def test_floor_applies_when_repeats_agree_and_without_spread():
    assert judge_swap(measured(100.0, 100.0), measured(98.0, 98.0))["decision"] == "keep"  # 2 % < floor
    assert judge_swap(speed(tokens_per_s=100.0), speed(tokens_per_s=96.0))["noise"] == NOISE_FLOOR
    assert judge_swap(speed(tokens_per_s=100.0), speed(tokens_per_s=96.0))["decision"] == "rollback"
    wide = speed(tokens_per_s=100.0, relative_spread=0.5)
    assert judge_swap(wide, speed(tokens_per_s=90.0), use_spread=False)["decision"] == "rollback"


def test_missing_measurement_keeps():
    assert judge_swap(None, measured(1.0))["decision"] == "keep"
    assert judge_swap(measured(1.0), Measurement())["decision"] == "keep"


def test_slowdown_warning_for_any_drop():
    hundred = speed(tokens_per_s=100.0)
    assert slowdown_warning("x", hundred, speed(tokens_per_s=100.0), "n") is None
    assert slowdown_warning("x", hundred, speed(tokens_per_s=110.0), "n") is None
    warning = slowdown_warning("rms_norm deployed", hundred, speed(tokens_per_s=99.5), "kept")
    assert warning == "rms_norm deployed: served speed went from 100.0 to 99.5 tokens/s (0.5% slower; kept)"


def test_figures_of_a_measurement_of_one_figure():
    assert figures(speed(tokens_per_s=5.0)) == {
        "tokens_per_s": 5.0,
        "min": 5.0,
        "max": 5.0,
        "relative_spread": 0.0,
        "repeats": 1,
        "measured": "benchmark",
    }
    assert figures(None) is None


def test_live_and_benchmark_figures_are_never_compared():
    before = speed(tokens_per_s=700.0, relative_spread=0.01, measured="live")
    after = speed(tokens_per_s=500.0, relative_spread=0.01, measured="benchmark")
    verdict = judge_swap(before, after)
    assert verdict["decision"] == "keep" and verdict["note"] == "measured differently"
    assert judge_swap(before, dataclasses.replace(after, measured="live"))["decision"] == "rollback"


# ---------------------------------------------------------------------- several batches
def test_a_measurement_keeps_batch_one_on_top_and_every_batch_below():
    measurement = served(measured(400.0, 410.0), measured(3800.0, 3900.0))
    assert measurement.batch == 1 and measurement.tokens_per_s == 405.0
    assert [one.batch for one in measurement.batches] == [1, 8]
    assert figures(measurement)["timing_lock"] == {"held": True, "waited_s": 0.0}
    assert set(per_batch(measurement)) == {1, 8}
    one_figure = speed(tokens_per_s=5.0)
    assert per_batch(one_figure) == {1: one_figure}  # one answer naming no batch: batch 1
    assert per_batch(None) == {}


def test_a_drop_at_batch_eight_beyond_its_spread_rolls_back_though_batch_one_improved():
    # The campaign of the bug report: one row faster, batch 8 far slower.
    before = served(measured(410.0, 413.0, 416.0), measured(3820.0, 3860.0, 3900.0))
    after = served(measured(425.0, 430.0, 435.0), measured(2300.0, 2336.0, 2370.0))
    judged = judge_batches(before, after)
    assert judged["decision"] == "rollback" and judged["dropped"] == [8]
    assert judged["batches"][1]["decision"] == "keep" and judged["batches"][1]["drop"] < 0
    assert judged["batches"][8]["drop"] == pytest.approx(1 - 2336 / 3860)
    reason = rollback_reason(before, after, judged, "memory-bound")
    assert reason.startswith("rolled back: served decode at batch 8 went from 3860.0 to 2336.0 tokens/s (39.5% slower")
    assert "batch 1: 413.0 -> 430.0 tokens/s" in reason and reason.endswith("; memory-bound regime")


def test_each_batch_is_judged_against_its_own_spread():
    # Batch 8 spreads 10 %; an 8 % lower median there is noise even though batch 1 is quiet.
    before = served(measured(99.0, 100.0, 101.0), measured(950.0, 1000.0, 1050.0))
    after = served(measured(99.0, 100.0, 101.0), measured(880.0, 920.0, 960.0))
    judged = judge_batches(before, after)
    assert judged["decision"] == "keep" and judged["dropped"] == []
    assert judged["batches"][8]["noise"] == pytest.approx(0.1) and judged["batches"][8]["drop"] == pytest.approx(0.08)
    # The same 8 % at batch 1, whose repeats agree to 2 %, is a real drop.
    slower_one_row = served(measured(91.0, 92.0, 93.0), measured(880.0, 920.0, 960.0))
    assert judge_batches(before, slower_one_row)["dropped"] == [1]


def test_old_measurements_are_judged_at_batch_one_as_before():
    before, after = measured(99.0, 100.0, 101.0), measured(75.0, 80.0, 85.0)
    judged = judge_batches(before, after)
    assert judged["decision"] == judge_swap(before, after)["decision"] == "rollback"
    assert judged["batches"] == {1: judge_swap(before, after)}
    # A batch measured on one side only is not judged.
    assert judge_batches(before, served(measured(100.0), measured(1.0)))["batches"].keys() == {1}


def test_per_batch_figures_and_warnings():
    before = served(measured(100.0, 101.0), measured(1000.0, 1010.0))
    after = served(measured(99.0, 100.0), measured(1010.0, 1020.0))
    figures_by_batch = batch_figures(before, after)
    assert set(figures_by_batch) == {"1", "8"} and figures_by_batch["8"]["after"]["tokens_per_s"] == 1015.0
    judged = judge_batches(before, after)
    assert judged_figures(before, after, judged)["1"]["decision"] == "keep"
    warnings = batch_warnings("rms_norm deployed", before, after, {1: "kept", 8: "kept"})
    assert warnings == ["rms_norm deployed, batch 1: served speed went from 100.5 to 99.5 tokens/s (1.0% slower; kept)"]


def test_the_profile_names_the_batches_to_measure():
    assert benchmark_batches({"served_batches": [8, 1, 8]}) == [1, 8]
    assert benchmark_batches({"served_batches": [0, True, "8"]}) is None
    assert benchmark_batches({}) is None and benchmark_batches(None) is None


def test_a_measurement_without_the_timing_lock_is_named():
    assert lock_warning("check", speed(timing_lock={"held": True, "waited_s": 3.0})) is None
    assert lock_warning("check", speed(tokens_per_s=1.0)) is None
    warning = lock_warning("check", speed(timing_lock={"held": False, "waited_s": 180.0}))
    assert warning is not None and "without the GPU timing lock" in warning and "180 s" in warning
    # Since the GPU has three locks, the measurement says which it missed.
    held = {"turn": True, "timing": True, "quiet": False}
    missed = speed(timing_lock={"held": False, "waited_s": 180.0, "locks": held})
    warning = lock_warning("check", missed)
    assert warning is not None and "(not held: quiet)" in warning


# ---------------------------------------------------------------------- paired measurement
def test_phase_order_alternates_pairs_so_a_steady_drift_weighs_on_both_sides():
    assert phase_order(3) == [True, False, False, True, True, False]
    on = [i for i, side in enumerate(phase_order(4)) if side]
    off = [i for i, side in enumerate(phase_order(4)) if not side]
    assert sum(on) == sum(off)  # a drift linear in time adds the same to both sides over even rounds


@pytest.mark.parametrize(
    "drops, decision",
    [
        ([0.05, 0.06, 0.055], "rollback"),  # every round agrees, beyond their range
        ([0.05, -0.02, 0.03], "keep"),  # the rounds disagree: their range is larger than the median
        ([0.008, 0.009, 0.0085], "keep"),  # agreeing but below the floor
        ([], "keep"),
    ],
)
def test_judge_pairs_rolls_back_only_a_drop_the_rounds_agree_on(drops, decision):
    judged = judge_pairs(drops)
    assert judged["decision"] == decision
    if drops:
        assert judged["noise"] >= PAIRED_FLOOR


def test_judge_paired_reads_each_batch_of_a_compare_answer():
    compared = {
        "batches": [
            {"batch": 1, "with": {"tokens_per_s_samples": [95, 96]}, "without": {"tokens_per_s_samples": [100, 100]}},
            {"batch": 8, "with": {"tokens_per_s_samples": [800, 790]}, "without": {"tokens_per_s_samples": [780, 800]}},
        ]
    }
    assert paired_drops([95, 96], [100, 100]) == pytest.approx([0.05, 0.04])
    judged = judge_paired(PairedAnswer.from_dict(compared))
    assert judged["decision"] == "rollback" and judged["dropped"] == [1]
    assert judged["batches"][8]["decision"] == "keep"
    assert judge_paired(None) == {"decision": "keep", "dropped": [], "batches": {}}
