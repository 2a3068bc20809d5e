"""Served-speed figures and the keep-or-roll-back rule for a swap, in plain Python (no torch, no
Temporal): the server computes the spread of its benchmark repeats with `repeat_spread`, the
campaign workflow decides with `judge_swap` and words its warnings with `slowdown_warning`."""

from __future__ import annotations

import statistics
from typing import Any

# The smallest drop ever called a slowdown: two measurements minutes apart also differ by drift
# (clocks, temperature) that the spread inside one measurement does not show.
NOISE_FLOOR = 0.03
MAD_TO_SIGMA = 1.4826  # scales a median absolute deviation to a normal standard deviation


def repeat_spread(samples: list[float]) -> dict[str, Any]:
    """Median tokens/s of the repeats and how far they spread, absolute and relative to the median."""
    if not samples:
        return {
            "tokens_per_s": 0.0,
            "tokens_per_s_min": 0.0,
            "tokens_per_s_max": 0.0,
            "tokens_per_s_samples": [],
            "relative_spread": 0.0,
            "relative_mad": 0.0,
        }
    median = statistics.median(samples)
    mad = statistics.median(abs(x - median) for x in samples)
    return {
        "tokens_per_s": median,
        "tokens_per_s_min": min(samples),
        "tokens_per_s_max": max(samples),
        "tokens_per_s_samples": list(samples),
        "relative_spread": (max(samples) - min(samples)) / median if median > 0 else 0.0,
        "relative_mad": MAD_TO_SIGMA * mad / median if median > 0 else 0.0,
    }


def figures(measurement: dict[str, Any] | None) -> dict[str, Any] | None:
    """The figures of one /admin/benchmark answer that a campaign result reports."""
    if not measurement:
        return None
    tokens = measurement.get("tokens_per_s")
    return {
        "tokens_per_s": tokens,
        "min": measurement.get("tokens_per_s_min", tokens),
        "max": measurement.get("tokens_per_s_max", tokens),
        "relative_spread": measurement.get("relative_spread", 0.0),
        "repeats": measurement.get("repeats", 1),
        "measured": measurement.get("measured", "benchmark"),
    }


def judge_swap(
    before: dict[str, Any] | None, after: dict[str, Any] | None, floor: float = NOISE_FLOOR, use_spread: bool = True
) -> dict[str, Any]:
    """Keep or roll back a swap by served tokens/s: roll back only when the drop from `before` to
    `after` is larger than the spread measured in both (and than `floor`); anything smaller is noise.
    `use_spread=False` judges by `floor` alone (campaigns started before the spread was measured)."""
    before, after = before or {}, after or {}
    b, a = before.get("tokens_per_s"), after.get("tokens_per_s")
    if not b or a is None:
        return {"decision": "keep", "drop": None, "noise": None}
    if before.get("measured", "benchmark") != after.get("measured", "benchmark"):
        # Live traffic and a paused benchmark measure different things: never roll back on that.
        return {"decision": "keep", "drop": (b - a) / b, "noise": None, "note": "measured differently"}
    drop = (b - a) / b
    noise = floor
    if use_spread:
        noise = max(floor, before.get("relative_spread") or 0.0, after.get("relative_spread") or 0.0)
    return {"decision": "rollback" if drop > noise else "keep", "drop": drop, "noise": noise}


def slowdown_warning(what: str, before: dict[str, Any] | None, after: dict[str, Any] | None, note: str) -> str | None:
    """A warning when served tokens/s went down by any amount, even one too small to roll back."""
    b = (before or {}).get("tokens_per_s")
    a = (after or {}).get("tokens_per_s")
    if not b or a is None or a >= b:
        return None
    return f"{what}: served speed went from {b:.1f} to {a:.1f} tokens/s ({(b - a) / b:.1%} slower; {note})"
