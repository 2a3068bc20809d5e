"""The campaign's own gates on a verdict: which reward it acts on, which row counts a swap serves.

The verifier's verdict is signed as it is (its `reward` is the reward); a campaign serving a model
asks more of it, and writes its answers beside the verdict, never over it:
- `served_decode_judgement`: served tokens/s is decode steps (one call per shape per step) while the
  prefill shape runs once per request, so a served target is judged on its decode shapes alone
  (an equal-weight mean over both let a prefill loss outvote a decode gain, and the reverse);
- `rows_gate`: the row counts at which the kernel was faster, and those the original keeps serving.
Stdlib only: the GPU activity computes both, the workflow reads them back (`campaign_reward`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpuyantra.campaign.records import VerdictSummary
from gpuyantra.rewards import ceiling  # stdlib only
from gpuyantra.verifier.verdict import geomean, reward_on_shapes  # stdlib only (no torch)

SPEED_KEYS = ("reward", "speedup_vs_eager", "speedup_vs_compile")


def served_decode_judgement(verdict: Mapping[str, Any], target: Mapping[str, Any]) -> dict[str, Any] | None:
    """The reward and speedups of `verdict` on the target's served decode shapes (its `served_shapes`
    of the `decode@<batch>` workloads): `{"shapes", "why", "reward", "speedup_vs_eager",
    "speedup_vs_compile"}`, or None where the target names no decode shapes, the verdict failed, or
    it timed only those shapes (then the verdict's own figures are the served decode's)."""
    decode = [
        s for name, shapes in (target.get("served_shapes") or {}).items() if name.startswith("decode") for s in shapes
    ]
    judged = reward_on_shapes(dict(verdict), decode) if decode else None
    timed = [list(r.get("shape") or []) for r in verdict.get("bench") or []]
    if judged is None or sorted(judged["shapes"]) == sorted(timed):
        return None
    return {"shapes": judged["shapes"], "why": "served decode shapes", **{key: judged[key] for key in SPEED_KEYS}}


def campaign_reward(verdict: VerdictSummary) -> int:
    """The reward a campaign decides on: the served decode judgement's where there is one, else the
    verdict's. Verdicts recorded before the judgement moved beside the reward had it written over
    `reward` (their `judged_on` names shapes only): their `reward` is it."""
    judged = verdict.judged_on or {}
    return int(judged["reward"]) if isinstance(judged.get("reward"), (int, float)) else verdict.reward


def campaign_speedups(verdict: VerdictSummary) -> tuple[float | None, float | None]:
    """(vs eager, vs compile) the campaign reports for `verdict`: the served decode judgement's where
    there is one (they go with `campaign_reward`), else the verdict's."""
    judged = verdict.judged_on or {}
    if isinstance(judged.get("reward"), (int, float)):
        return judged.get("speedup_vs_eager"), judged.get("speedup_vs_compile")
    return verdict.speedup_vs_eager, verdict.speedup_vs_compile


def at_ceiling(verdict: VerdictSummary) -> bool:
    """No later candidate can beat it: the best reward its device can give (+1 on CPU, +3 on CUDA)."""
    return campaign_reward(verdict) >= ceiling(verdict.device)


def rows_gate(verdict: Mapping[str, Any]) -> dict[str, list[int]] | None:
    """Which row counts the kernel should serve: {"kernel": rows, "original": rows} from the timed rows
    (rows: the product of the activation shape's leading dims), or None where the kernel was faster at
    every timed row count, or speed was not judged (CPU, failures).

    Why: one verdict times a kernel at several row counts (decode at batch 1 and 8, a prefill), and a
    GEMV that halves the one-row projection can lose to cuBLAS at eight rows. The server then serves
    each call with the kernel or the original forward, whichever was faster at the nearest timed row
    count (`gpuyantra.swap.guards.serves_kernel`). Ratios of several dtypes at one row count are
    combined by their geometric mean."""
    if verdict.get("failures") or str(verdict.get("device") or "") != "cuda":
        return None
    ratios: dict[int, list[float]] = {}
    for row in verdict.get("bench") or []:
        shape, kernel, eager = row.get("shape"), row.get("kernel_us"), row.get("eager_us")
        if not shape or not kernel or not eager or not all(isinstance(d, int) and d > 0 for d in shape):
            continue  # untimed, or not one activation's shape (nothing to count rows by)
        rows = math.prod(shape[:-1])
        ratios.setdefault(rows, []).append(eager / kernel)
    faster = {rows: (geomean(values) or 0.0) > 1.0 for rows, values in ratios.items()}
    original = sorted(rows for rows, wins in faster.items() if not wins)
    if not original:
        return None
    return {"kernel": sorted(rows for rows, wins in faster.items() if wins), "original": original}
