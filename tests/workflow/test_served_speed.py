"""The keep-or-roll-back rule for a swap and the spread figures it is judged by (plain Python)."""

from __future__ import annotations

import pytest

from gpuyantra.served_speed import NOISE_FLOOR, figures, judge_swap, repeat_spread, slowdown_warning


def measured(*samples: float) -> dict:
    return {**repeat_spread(list(samples)), "repeats": len(samples), "measured": "benchmark"}


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
    assert judge_swap({"tokens_per_s": 100.0}, {"tokens_per_s": 96.0})["noise"] == NOISE_FLOOR
    assert judge_swap({"tokens_per_s": 100.0}, {"tokens_per_s": 96.0})["decision"] == "rollback"
    wide = {"tokens_per_s": 100.0, "relative_spread": 0.5}
    assert judge_swap(wide, {"tokens_per_s": 90.0}, use_spread=False)["decision"] == "rollback"


def test_missing_measurement_keeps():
    assert judge_swap(None, measured(1.0))["decision"] == "keep"
    assert judge_swap(measured(1.0), {})["decision"] == "keep"


def test_slowdown_warning_for_any_drop():
    assert slowdown_warning("x", {"tokens_per_s": 100.0}, {"tokens_per_s": 100.0}, "n") is None
    assert slowdown_warning("x", {"tokens_per_s": 100.0}, {"tokens_per_s": 110.0}, "n") is None
    warning = slowdown_warning("rms_norm deployed", {"tokens_per_s": 100.0}, {"tokens_per_s": 99.5}, "kept")
    assert warning == "rms_norm deployed: served speed went from 100.0 to 99.5 tokens/s (0.5% slower; kept)"


def test_figures_of_an_old_style_measurement():
    assert figures({"tokens_per_s": 5.0}) == {
        "tokens_per_s": 5.0,
        "min": 5.0,
        "max": 5.0,
        "relative_spread": 0.0,
        "repeats": 1,
        "measured": "benchmark",
    }
    assert figures(None) is None


def test_live_and_benchmark_figures_are_never_compared():
    before = {"tokens_per_s": 700.0, "relative_spread": 0.01, "measured": "live"}
    after = {"tokens_per_s": 500.0, "relative_spread": 0.01, "measured": "benchmark"}
    verdict = judge_swap(before, after)
    assert verdict["decision"] == "keep" and verdict["note"] == "measured differently"
    assert judge_swap(before, {**after, "measured": "live"})["decision"] == "rollback"
