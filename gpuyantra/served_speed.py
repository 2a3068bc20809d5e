"""Served-speed figures and the keep-or-roll-back rule for a swap, in plain Python (no torch, no
Temporal): the server computes the spread of its benchmark repeats with `repeat_spread`, the
campaign workflow decides with `judge_swap` and words its warnings with `slowdown_warning`.

A campaign measures served speed at every decode batch that matters (one row and the server's
batched decode, `benchmark_batches`): one `Measurement` holds each batch's answer (`measurement_of`),
and a swap is judged batch by batch against that batch's own spread (`judge_batches`). The records
that cross the workflow boundary (`Measurement`, `PairedAnswer`) live here with the rules that read
them; the judgements are the JSON objects the campaign result reports."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """Served decode speed: one /admin/benchmark answer at one batch, or benchmark_server's measurement
    at several (the smallest batch's figures on top, as results held before batches were measured
    apart; every batch's answer under `batches`; how the GPU's locks were held under `timing_lock`).
    The one record of it the server's answer, the GPU activity, the workflow and the result share."""

    tokens_per_s: float | None = None  # the median repeat
    tokens_per_s_min: float | None = None
    tokens_per_s_max: float | None = None
    tokens_per_s_samples: list[float] = field(default_factory=list)
    relative_spread: float | None = None  # (max - min) / median
    relative_mad: float | None = None
    repeats: int | None = None
    measured: str = "benchmark"  # or "live": observed from served traffic, never compared with a benchmark
    batch: int | None = None
    timing_lock: dict[str, Any] | None = None  # gpu_locks.hold_lock: held, waited_s, locks
    batches: list[Measurement] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """An answer's figures; keys the campaign does not read are left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        kept = {key: value for key, value in data.items() if key in names and value is not None}
        kept["batches"] = [cls.from_dict(answer) for answer in data.get("batches") or [] if isinstance(answer, Mapping)]
        return cls(**kept)


def figures(measurement: Measurement | None) -> dict[str, Any] | None:
    """The figures of one measurement that a campaign result reports."""
    if measurement is None:
        return None
    tokens = measurement.tokens_per_s
    return {
        "tokens_per_s": tokens,
        "min": tokens if measurement.tokens_per_s_min is None else measurement.tokens_per_s_min,
        "max": tokens if measurement.tokens_per_s_max is None else measurement.tokens_per_s_max,
        "relative_spread": measurement.relative_spread or 0.0,
        "repeats": 1 if measurement.repeats is None else measurement.repeats,
        "measured": measurement.measured,
        **({"batch": measurement.batch} if measurement.batch is not None else {}),
        **({"timing_lock": measurement.timing_lock} if measurement.timing_lock is not None else {}),
    }


def judge_swap(
    before: Measurement | None, after: Measurement | None, floor: float = NOISE_FLOOR, use_spread: bool = True
) -> dict[str, Any]:
    """Keep or roll back a swap by served tokens/s: roll back only when the drop from `before` to
    `after` is larger than the spread measured in both (and than `floor`); anything smaller is noise.
    `use_spread=False` judges by `floor` alone."""
    before, after = before or Measurement(), after or Measurement()
    b, a = before.tokens_per_s, after.tokens_per_s
    if not b or a is None:
        return {"decision": "keep", "drop": None, "noise": None}
    if before.measured != after.measured:
        # Live traffic and a paused benchmark measure different things: never roll back on that.
        return {"decision": "keep", "drop": (b - a) / b, "noise": None, "note": "measured differently"}
    drop = (b - a) / b
    noise = floor
    if use_spread:
        noise = max(floor, before.relative_spread or 0.0, after.relative_spread or 0.0)
    return {"decision": "rollback" if drop > noise else "keep", "drop": drop, "noise": noise}


def slowdown_warning(what: str, before: Measurement | None, after: Measurement | None, note: str) -> str | None:
    """A warning when served tokens/s went down by any amount, even one too small to roll back."""
    b = before.tokens_per_s if before is not None else None
    a = after.tokens_per_s if after is not None else None
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


def measurement_of(answers: Sequence[Mapping[str, Any]], timing_lock: dict[str, Any] | None = None) -> Measurement:
    """One served-speed measurement from the /admin/benchmark answers at each batch: the smallest
    batch's answer at the top (the figures results held before batches were measured apart), every
    answer under `batches`, and how the GPU's locks were held while they were measured (`gpu_locks.hold_lock`)."""
    ordered = sorted((Measurement.from_dict(answer) for answer in answers), key=lambda answer: answer.batch or 1)
    return dataclasses.replace(ordered[0], batches=ordered, timing_lock=timing_lock or None)


def per_batch(measurement: Measurement | None) -> dict[int, Measurement]:
    """Each batch's answer in one measurement. A measurement of one answer is that of its own batch (1
    when it names none)."""
    if measurement is None:
        return {}
    return {answer.batch or 1: answer for answer in measurement.batches or [measurement]}


def paired(before: Measurement | None, after: Measurement | None) -> dict[int, tuple[Measurement, Measurement]]:
    """(before, after) answers of each batch measured in both, smallest batch first."""
    befores, afters = per_batch(before), per_batch(after)
    return {batch: (befores[batch], afters[batch]) for batch in sorted(befores) if batch in afters}


def judge_batches(
    before: Measurement | None,
    after: Measurement | None,
    floor: float = NOISE_FLOOR,
    use_spread: bool = True,
) -> dict[str, Any]:
    """`judge_swap` at each batch measured before and after: roll back when any batch dropped by more
    than its own measured noise (a gain at one batch does not pay for a loss at another).
    `dropped` lists the batches that did, `batches` holds each batch's judgement."""
    judged = {batch: judge_swap(b, a, floor, use_spread) for batch, (b, a) in paired(before, after).items()}
    dropped = [batch for batch, judgement in judged.items() if judgement["decision"] == "rollback"]
    return {"decision": "rollback" if dropped else "keep", "dropped": dropped, "batches": judged}


def batch_figures(before: Measurement | None, after: Measurement | None) -> dict[str, Any]:
    """The result's per-batch figures, keyed by batch ("1", "8": JSON keys are text)."""
    befores, afters = per_batch(before), per_batch(after)
    return {
        str(batch): {"before": figures(befores.get(batch)), "after": figures(afters.get(batch))}
        for batch in sorted(set(befores) | set(afters))
    }


def judged_figures(before: Measurement | None, after: Measurement | None, judged: Mapping[str, Any]) -> dict[str, Any]:
    """`batch_figures` with each batch's drop, noise and decision (a swap's entry in the result)."""
    out = batch_figures(before, after)
    for batch, judgement in judged["batches"].items():
        out[str(batch)].update(drop=judgement["drop"], noise=judgement["noise"], decision=judgement["decision"])
    return out


def rollback_reason(
    before: Measurement | None, after: Measurement | None, judged: Mapping[str, Any], regime: str
) -> str:
    """Why a swap was rolled back, naming each batch that dropped beyond its noise, then how the
    other batches fared."""
    pairs = paired(before, after)
    parts = []
    for batch in judged["dropped"]:
        (b, a), judgement = pairs[batch], judged["batches"][batch]
        parts.append(
            f"served decode at batch {batch} went from {b.tokens_per_s or 0.0:.1f} to "
            f"{a.tokens_per_s or 0.0:.1f} tokens/s "
            f"({judgement['drop']:.1%} slower, beyond that batch's measured noise of {judgement['noise']:.1%})"
        )
    others = [
        f"batch {batch}: {b.tokens_per_s or 0.0:.1f} -> {a.tokens_per_s or 0.0:.1f} tokens/s"
        for batch, (b, a) in pairs.items()
        if batch not in judged["dropped"]
    ]
    return "rolled back: " + "; ".join(parts + others) + f"; {regime} regime"


def batch_warnings(
    what: str, before: Measurement | None, after: Measurement | None, note: str | Mapping[int, str]
) -> list[str]:
    """`slowdown_warning` for each batch that went down by any amount; `note` may differ per batch."""
    warnings = []
    for batch, (b, a) in paired(before, after).items():
        batch_note = note if isinstance(note, str) else note.get(batch, "")
        warning = slowdown_warning(f"{what}, batch {batch}", b, a, batch_note)
        if warning:
            warnings.append(warning)
    return warnings


def lock_warning(what: str, measurement: Measurement | PairedAnswer | None) -> str | None:
    """A warning when a measurement could not hold the GPU's locks: a verification may have been
    timing or checking correctness on the same GPU meanwhile, so its spread may hold that load.
    `locks` (measurements since the GPU has three) names the ones missed."""
    lock = measurement.timing_lock if measurement is not None else None
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


@dataclass(frozen=True, kw_only=True)
class PairedBatch:
    """One batch of a paired measurement: the swap on (`with` in the server's answer) and off."""

    batch: int = 1
    with_swap: Measurement | None = None
    without: Measurement | None = None
    drops: list[float] | None = None  # each round's relative drop with the swap (None: the answer gave none)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PairedBatch:
        with_swap, without = data.get("with"), data.get("without")
        return cls(
            batch=int(data.get("batch") or 1),
            with_swap=Measurement.from_dict(with_swap) if isinstance(with_swap, Mapping) else None,
            without=Measurement.from_dict(without) if isinstance(without, Mapping) else None,
            drops=[float(d) for d in data["drops"]] if isinstance(data.get("drops"), list) else None,
        )


@dataclass(frozen=True, kw_only=True)
class PairedAnswer:
    """compare_swap's answer: /admin/compare's paired measurement (`measured` "paired"), or
    `measured` "none" with the `reason` when the server cannot measure one."""

    measured: str = "none"
    reason: str | None = None
    seconds: float | None = None
    batches: list[PairedBatch] = field(default_factory=list)
    timing_lock: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PairedAnswer:
        return cls(
            measured=str(data.get("measured") or "none"),
            reason=data.get("reason"),
            seconds=data.get("seconds"),
            batches=[PairedBatch.from_dict(entry) for entry in data.get("batches") or [] if isinstance(entry, Mapping)],
            timing_lock=data.get("timing_lock"),
        )


def judge_paired(answer: PairedAnswer | None, floor: float = PAIRED_FLOOR) -> dict[str, Any]:
    """`judge_batches` for a paired measurement (/admin/compare): each batch by its own pairs; roll
    back when any batch dropped beyond its noise."""
    judged: dict[int, dict[str, Any]] = {}
    for entry in answer.batches if answer is not None else []:
        with_swap = entry.with_swap.tokens_per_s_samples if entry.with_swap else []
        without = entry.without.tokens_per_s_samples if entry.without else []
        judged[entry.batch] = judge_pairs(paired_drops(with_swap, without), floor)
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
