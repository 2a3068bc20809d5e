"""Served-speed figures and the keep-or-roll-back rule for a swap, in plain Python (no torch, no
Temporal): the server computes the spread of its benchmark repeats with `repeat_spread`, the
campaign workflow decides with `judge_swap` and words its warnings with `slowdown_warning`.

A campaign measures served speed at every decode batch that matters (one row and the server's
batched decode, `benchmark_batches`): one measurement holds each batch's answer (`measurement_of`),
and a swap is judged batch by batch against that batch's own spread (`judge_batches`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
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
        **{key: measurement[key] for key in ("batch", "timing_lock") if key in measurement},
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


# ---------------------------------------------------------------------- one measurement, several batches
def benchmark_batches(profile: Mapping[str, Any] | None) -> list[int] | None:
    """The decode batches the server says a kernel must be judged at (its profile's
    `served_batches`), smallest first; None when it does not say (batch 1 alone is measured)."""
    batches = (profile or {}).get("served_batches")
    if not isinstance(batches, list):
        return None
    kept = sorted({b for b in batches if isinstance(b, int) and not isinstance(b, bool) and b >= 1})
    return kept or None


def measurement_of(answers: list[dict[str, Any]], timing_lock: dict[str, Any] | None = None) -> dict[str, Any]:
    """One served-speed measurement from the /admin/benchmark answers at each batch: the smallest
    batch's answer at the top (the figures results held before batches were measured apart), every
    answer under `batches`, and how the GPU's locks were held while they were measured (`gpu_locks.hold_lock`)."""
    ordered = sorted(answers, key=lambda answer: int(answer.get("batch") or 1))
    return {**ordered[0], "batches": ordered, **({"timing_lock": timing_lock} if timing_lock else {})}


def per_batch(measurement: Mapping[str, Any] | None) -> dict[int, dict[str, Any]]:
    """Each batch's answer in one measurement. A measurement from before batches were measured
    apart is the answer of its own batch (1)."""
    if not measurement:
        return {}
    answers = measurement.get("batches") or [measurement]
    return {int(answer.get("batch") or 1): dict(answer) for answer in answers if isinstance(answer, Mapping)}


def paired(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None
) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
    """(before, after) answers of each batch measured in both, smallest batch first."""
    befores, afters = per_batch(before), per_batch(after)
    return {batch: (befores[batch], afters[batch]) for batch in sorted(befores) if batch in afters}


def judge_batches(
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
    floor: float = NOISE_FLOOR,
    use_spread: bool = True,
) -> dict[str, Any]:
    """`judge_swap` at each batch measured before and after: roll back when any batch dropped by more
    than its own measured noise (a gain at one batch does not pay for a loss at another).
    `dropped` lists the batches that did, `batches` holds each batch's judgement."""
    judged = {batch: judge_swap(b, a, floor, use_spread) for batch, (b, a) in paired(before, after).items()}
    dropped = [batch for batch, judgement in judged.items() if judgement["decision"] == "rollback"]
    return {"decision": "rollback" if dropped else "keep", "dropped": dropped, "batches": judged}


def batch_figures(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict[str, Any]:
    """The result's per-batch figures, keyed by batch ("1", "8": JSON keys are text)."""
    befores, afters = per_batch(before), per_batch(after)
    return {
        str(batch): {"before": figures(befores.get(batch)), "after": figures(afters.get(batch))}
        for batch in sorted(set(befores) | set(afters))
    }


def judged_figures(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, judged: Mapping[str, Any]
) -> dict[str, Any]:
    """`batch_figures` with each batch's drop, noise and decision (a swap's entry in the result)."""
    out = batch_figures(before, after)
    for batch, judgement in judged["batches"].items():
        out[str(batch)].update(drop=judgement["drop"], noise=judgement["noise"], decision=judgement["decision"])
    return out


def rollback_reason(
    before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, judged: Mapping[str, Any], regime: str
) -> str:
    """Why a swap was rolled back, naming each batch that dropped beyond its noise, then how the
    other batches fared."""
    pairs = paired(before, after)
    parts = []
    for batch in judged["dropped"]:
        (b, a), judgement = pairs[batch], judged["batches"][batch]
        parts.append(
            f"served decode at batch {batch} went from {b['tokens_per_s']:.1f} to {a['tokens_per_s']:.1f} tokens/s "
            f"({judgement['drop']:.1%} slower, beyond that batch's measured noise of {judgement['noise']:.1%})"
        )
    others = [
        f"batch {batch}: {b.get('tokens_per_s') or 0.0:.1f} -> {a.get('tokens_per_s') or 0.0:.1f} tokens/s"
        for batch, (b, a) in pairs.items()
        if batch not in judged["dropped"]
    ]
    return "rolled back: " + "; ".join(parts + others) + f"; {regime} regime"


def batch_warnings(
    what: str, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, note: str | Mapping[int, str]
) -> list[str]:
    """`slowdown_warning` for each batch that went down by any amount; `note` may differ per batch."""
    warnings = []
    for batch, (b, a) in paired(before, after).items():
        batch_note = note if isinstance(note, str) else note.get(batch, "")
        warning = slowdown_warning(f"{what}, batch {batch}", b, a, batch_note)
        if warning:
            warnings.append(warning)
    return warnings


def lock_warning(what: str, measurement: Mapping[str, Any] | None) -> str | None:
    """A warning when a measurement could not hold the GPU's locks: a verification may have been
    timing or checking correctness on the same GPU meanwhile, so its spread may hold that load.
    `locks` (measurements since the GPU has three) names the ones missed."""
    lock = (measurement or {}).get("timing_lock")
    if not isinstance(lock, Mapping) or lock.get("held", True):
        return None
    held = lock.get("locks")
    missed = [str(name) for name, got in held.items() if not got] if isinstance(held, Mapping) else []
    which = f" (not held: {', '.join(missed)})" if missed else ""
    return (
        f"{what}: measured without the GPU timing lock{which} (a verification held it for more than "
        f"{float(lock.get('waited_s') or 0.0):.0f} s), so the figures may include that verification's load"
    )


# ---------------------------------------------------------------------- paired measurement around one swap
# Two measurements minutes apart differ by drift (clocks, other work on the host) that neither's own
# spread shows: an unchanged server read 270.8 and then 295.8 tokens/s. A paired measurement turns
# one swap off and on again inside one short window, so each round's with/without pair shares its
# drift, and the spread of the pairs' differences is the noise a drop must exceed.
PAIRED_FLOOR = 0.01  # the smallest paired drop ever called a slowdown
PAIRED_ROUNDS = 3


def phase_order(rounds: int) -> list[bool]:
    """Which side each phase measures (True: with the swap), in pairs A B, B A, A B, ...: a drift
    that grows steadily through the measurement weighs on both sides alike."""
    order: list[bool] = []
    for r in range(rounds):
        order += [True, False] if r % 2 == 0 else [False, True]
    return order


def paired_drops(with_swap: list[float], without: list[float]) -> list[float]:
    """Each round's relative drop from the model without the swap to the model with it."""
    return [(off - on) / off for on, off in zip(with_swap, without) if off > 0]


def judge_pairs(drops: list[float], floor: float = PAIRED_FLOOR) -> dict[str, Any]:
    """Roll back when the median paired drop is larger than the range of the drops (and `floor`):
    the swap must be slower in a way the rounds agree on, not in one unlucky round."""
    if not drops:
        return {"decision": "keep", "drop": None, "noise": None}
    drop = statistics.median(drops)
    noise = max(floor, max(drops) - min(drops))
    return {"decision": "rollback" if drop > noise else "keep", "drop": drop, "noise": noise}


def judge_paired(answer: Mapping[str, Any] | None, floor: float = PAIRED_FLOOR) -> dict[str, Any]:
    """`judge_batches` for a paired measurement (/admin/compare): each batch by its own pairs; roll
    back when any batch dropped beyond its noise."""
    judged: dict[int, dict[str, Any]] = {}
    for entry in (answer or {}).get("batches") or []:
        with_swap = list((entry.get("with") or {}).get("tokens_per_s_samples") or [])
        without = list((entry.get("without") or {}).get("tokens_per_s_samples") or [])
        judged[int(entry.get("batch") or 1)] = judge_pairs(paired_drops(with_swap, without), floor)
    dropped = [batch for batch, judgement in sorted(judged.items()) if judgement["decision"] == "rollback"]
    return {"decision": "rollback" if dropped else "keep", "dropped": dropped, "batches": judged}


def paired_reason(judged: Mapping[str, Any]) -> str:
    """Why a paired measurement rolled a swap back (or why it kept one the first check doubted)."""
    parts = [
        f"batch {batch}: {abs(one['drop']):.1%} {'slower' if one['drop'] > 0 else 'faster'} with the swap "
        f"(noise {one['noise']:.1%})"
        for batch, one in sorted(judged["batches"].items())
        if one.get("drop") is not None
    ]
    return "paired measurement, the swap turned off and on in the same window: " + "; ".join(parts)
