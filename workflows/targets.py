"""Which of the profile's targets a campaign goes after (plain Python: it runs in the workflow sandbox).

The profile ranks its targets by estimated gain on the step as the server runs it (under CUDA
graphs: device time). A campaign without `ops` takes every target whose estimated gain is above the
served speed's measured noise (a smaller gain could not be told from noise by the served-speed check
anyway), at most `max_targets` when given. A target a committed swap already serves is skipped and
reported `already swapped`, so a second campaign continues where the first stopped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuyantra.campaign.records import Target  # stdlib only
from gpuyantra.campaign.results import SkipEntry, variant_of  # stdlib only
from gpuyantra.served_speed import Measurement  # stdlib only


@dataclass(frozen=True)
class TargetChoice:
    """The targets to optimize, in the profile's order, and those left out with the reason."""

    chosen: list[Target] = field(default_factory=list)
    skipped: list[SkipEntry] = field(default_factory=list)


def measured_noise(benchmark: Measurement | None) -> float:
    """The largest relative spread of served tokens/s over the measured batches (0 when unmeasured)."""
    if benchmark is None:
        return 0.0
    spreads = [benchmark.relative_spread, *(batch.relative_spread for batch in benchmark.batches)]
    return max((float(s) for s in spreads if s is not None), default=0.0)


def skip_entry(target: Target, reason: str) -> SkipEntry:
    """The result's entry of a target the campaign did not go after."""
    return {"op": target.op, "module_class": target.module_class, "reason": reason, **variant_of(target.variant)}


def already_swapped_reason(swaps: Sequence[str]) -> str:
    return f"already swapped (swap {', '.join(swaps)} serves it): not deployed again"


def below_noise_reason(gain: float, noise: float) -> str:
    return (
        f"estimated gain {gain:.2%} of the served step is not above the measured noise {noise:.2%} "
        "of served tokens/s: a swap could not be told from noise"
    )


def choose_targets(
    targets: Sequence[Target],
    ops: Sequence[str] | None,
    max_targets: int | None,
    noise: float,
) -> TargetChoice:
    """The profile's `targets` (best first) a campaign goes after.

    With `ops`: every target of those ops. Without: every target whose estimated gain is above
    `noise`, the first `max_targets` of them when given. Either way a target already served by a
    committed swap is skipped."""
    chosen: list[Target] = []
    skipped: list[SkipEntry] = []
    for target in targets:
        if ops and target.op not in ops:
            continue
        gain = target.estimated_gain
        if target.swapped:
            skipped.append(skip_entry(target, already_swapped_reason(target.swapped)))
        elif not ops and gain <= noise:
            skipped.append(skip_entry(target, below_noise_reason(gain, noise)))
        elif not ops and max_targets is not None and len(chosen) >= max_targets:
            skipped.append(skip_entry(target, f"beyond max_targets {max_targets}"))
        else:
            chosen.append(target)
    return TargetChoice(chosen, skipped)
