"""The offline template author's feedback-driven search: the next strategy from the verifier's
feedback in the request's history (see template.py for the rules).

Failed attempts ban the knob values that set them apart (resource failures: that value and every
larger one of the size knobs); the fastest measured passing point is the incumbent and its untried
one-step neighbours come next, knobs ordered by the regime its measurement shows and by the move
that last helped; the stop rules (near the roofline floor, a plateau, an exhausted neighbourhood)
mark the plan converged. The first write, without feedback, comes from template_start.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuyantra.authors.base import Attempt, WriteRequest
from gpuyantra.authors.template_render import default_strategy, normalize
from gpuyantra.authors.template_space import (
    KNOBS,
    auto_warps,
    canonical,
    linear_out_features,
    request_shapes,
    strategy_space,
)
from gpuyantra.authors.template_start import initial_strategy, seed_point

# Knobs whose larger values need more registers / shared memory (banned upwards on resource errors).
SIZE_KNOBS = (
    "BLOCK_H_MAX",
    "CHUNK",
    "ROWS_PER_PROGRAM",
    "BLOCK_SIZE",
    "HEAD_BLOCK",
    "TOKENS_PER_PROGRAM",
    "NUM_STAGES",
    "GEMV_ROWS",
    "BLOCK_N",
    "BLOCK_K",
    "BLOCK_M",
    "MM_BLOCK_N",
    "MM_BLOCK_K",
)
# Knob order when the measurement is far from a floor that is large (bandwidth-bound) ...
BANDWIDTH_PRIORITY: tuple[str, ...] = (
    "SPLIT_K",
    "BLOCK_N",
    "BLOCK_K",
    "DEFER_REDUCE",
    "GEMV_UNROLL",
    "GEMV_UNROLL_ROWS",
    "GEMV_WARPS",
    "W_EVICTION",
    "ROWS_PER_PROGRAM",
    "TOKENS_PER_PROGRAM",
    "SHIFTED_STATS",
    "RELOAD_AFFINE",
    "FLAT_ROWS",
    "MAX_PROGRAMS",
    "NUM_WARPS",
    "BLOCK_SIZE",
    "X_EVICTION",
    "HEAD_BLOCK",
    "CHUNK",
    "BLOCK_H_MAX",
    "NUM_STAGES",
    "FLAT",
)
# ... and when the floor is tiny and the time is launch overhead (fewer, leaner programs first).
LAUNCH_PRIORITY: tuple[str, ...] = (
    "GEMV_WARPS",
    "BLOCK_N",
    "SPLIT_K",
    "BLOCK_K",
    "DEFER_REDUCE",
    "NUM_WARPS",
    "ROWS_PER_PROGRAM",
    "BLOCK_SIZE",
    "HEAD_BLOCK",
    "MAX_PROGRAMS",
    "FLAT",
    "FLAT_ROWS",
    "TOKENS_PER_PROGRAM",
    "X_EVICTION",
    "SHIFTED_STATS",
    "RELOAD_AFFINE",
    "BLOCK_H_MAX",
    "CHUNK",
    "NUM_STAGES",
)

CONVERGED_GAP = 1.05  # stop once kernel_us <= 1.05 * floor_us
PLATEAU_STEPS = 4  # stop after this many measured steps in a row without a 1% gain
PLATEAU_GAIN = 0.01
LAUNCH_BOUND_GAP = 10.0  # measured >= 10x the floor: the time is launch overhead, not bytes
LAUNCH_BOUND_US = 8.0  # without a floor: a time under this is launch overhead
HARD_FAILURE_LAYERS = ("static", "contract", "sandbox", "correctness")
_RESOURCE_WORDS = ("out of resource", "outofresources", "shared memory", "registers", "too many resources")


@dataclass
class Plan:
    strategy: dict[str, Any]
    reason: str
    converged: bool = False


def is_hard_failure(attempt: Attempt) -> bool:
    return attempt.reward < 0 or any(f.get("layer") in HARD_FAILURE_LAYERS for f in attempt.failures)


def is_resource_failure(attempt: Attempt) -> bool:
    text = " ".join(f"{f.get('rule', '')} {f.get('message', '')}" for f in attempt.failures).lower()
    return any(word in text for word in _RESOURCE_WORDS)


def _banned(op: str, failed: list[dict[str, Any]], resource: list[bool], base: dict[str, Any]) -> set[tuple[str, Any]]:
    knobs = KNOBS.get(op, {})
    banned: set[tuple[str, Any]] = set()
    defaults = default_strategy(op)
    for strategy, is_resource in zip(failed, resource):
        diff = {k: v for k, v in strategy.items() if base.get(k) != v}
        if not diff:  # the base itself failed: blame what it changed from the template defaults
            diff = {k: v for k, v in strategy.items() if defaults.get(k) != v}
        for key, value in diff.items():
            banned.add((key, value))
            if is_resource and key in SIZE_KNOBS and key in knobs and value in knobs[key]:
                for bigger in knobs[key][knobs[key].index(value) :]:
                    banned.add((key, bigger))
    return banned


def _allowed(strategy: dict[str, Any], banned: set[tuple[str, Any]]) -> bool:
    return not any((k, v) in banned for k, v in strategy.items())


def _neighbours(
    op: str, point: dict[str, Any], shapes: Sequence[Sequence[int]], order: Iterable[str], first: tuple[str, int] | None
) -> list[tuple[str, dict[str, Any]]]:
    """One-knob, one-step moves from `point`, in the given knob order (`first` = (knob, direction)
    that last improved goes first). NUM_WARPS = 0 (auto) moves to half / double the auto value."""
    knobs = KNOBS.get(op, {})
    moves: list[tuple[str, dict[str, Any]]] = []
    names = [k for k in order if k in knobs] + [k for k in knobs if k not in order]
    for name in names:
        values = knobs[name]
        current = point.get(name)
        steps: list[Any] = []
        if name == "NUM_WARPS" and current == 0:
            auto = max(auto_warps(op, point, s) for s in shapes)
            steps = [v for v in (auto // 2, auto * 2) if v in values and v != 0]
        elif current in values:
            i = values.index(current)
            steps = [values[j] for j in (i + 1, i - 1) if 0 <= j < len(values)]
        else:
            steps = list(values[:1])
        for value in steps:
            candidate = dict(point)
            candidate[name] = value
            moves.append((f"{name} {current!r} -> {value!r}", candidate))
    if first is not None:
        knob, direction = first
        moves.sort(
            key=lambda m: 0
            if m[1].get(knob) is not None and _direction(op, knob, point.get(knob), m[1][knob]) == direction
            else 1
        )
    return moves


def _direction(op: str, knob: str, old: Any, new: Any) -> int:
    values = KNOBS.get(op, {}).get(knob, [])
    if old in values and new in values:
        return 1 if values.index(new) > values.index(old) else -1
    return 0


def plan_strategy(request: WriteRequest) -> Plan:
    op = request.op
    shapes = request_shapes(request)
    out_features = linear_out_features(request)
    key = lambda s: canonical(op, s, shapes, out_features)  # noqa: E731
    history = list(request.history)
    attempts = [(normalize(op, a.strategy), a) for a in history]
    tried = {key(s) for s, _ in attempts}

    if not attempts:
        seed = seed_point(request)
        if seed is not None:
            return Plan(normalize(op, seed), "seed skill's strategy")
        return Plan(initial_strategy(request), "initial heuristic from the shapes")

    passed = [(s, a) for s, a in attempts if not is_hard_failure(a)]
    failed = [(s, a) for s, a in attempts if is_hard_failure(a)]
    measured = [
        (i, s, a)
        for i, (s, a) in enumerate(attempts)
        if not is_hard_failure(a) and a.kernel_us is not None and a.kernel_us > 0
    ]

    # The incumbent: fastest measured passing point; else the last passing one; else the start.
    if measured:
        best_i, best, best_attempt = min(measured, key=lambda m: (m[2].kernel_us, -m[2].reward, m[0]))
    elif passed:
        best_i, (best, best_attempt) = len(attempts) - 1, passed[-1]
    else:
        best_i, best, best_attempt = (
            -1,
            normalize(op, seed_point(request)) if seed_point(request) else initial_strategy(request),
            None,
        )
    banned = _banned(op, [s for s, _ in failed], [is_resource_failure(a) for _, a in failed], best)

    # Stop rules (measured feedback only).
    if best_attempt is not None and best_attempt.kernel_us:
        floor = best_attempt.floor_us
        if floor and best_attempt.kernel_us <= CONVERGED_GAP * floor:
            return Plan(
                best,
                f"converged: best {best_attempt.kernel_us:.2f} us is within 5% of the {floor:.2f} us floor",
                converged=True,
            )
        if _plateau(measured):
            return Plan(
                best,
                f"converged: no 1% gain in the last {PLATEAU_STEPS} measured steps "
                f"(best {best_attempt.kernel_us:.2f} us)",
                converged=True,
            )

    # Knob order from the regime the incumbent's measurement shows, and the direction that helped.
    order = BANDWIDTH_PRIORITY
    regime = "unmeasured"
    if best_attempt is not None and best_attempt.kernel_us:
        floor = best_attempt.floor_us or 0.0
        launch_bound = (
            (best_attempt.kernel_us >= LAUNCH_BOUND_GAP * floor)
            if floor
            else (best_attempt.kernel_us < LAUNCH_BOUND_US)
        )
        order = LAUNCH_PRIORITY if launch_bound else BANDWIDTH_PRIORITY
        gap = f", {best_attempt.kernel_us / floor:.2f}x the floor" if floor else ""
        regime = f"{'launch' if launch_bound else 'bandwidth'}-bound, best {best_attempt.kernel_us:.2f} us{gap}"
    first = _improving_move(op, measured, best_i)
    bad = _bad_moves(measured)
    moves = _neighbours(op, best, shapes, order, first)
    # Moves that already made some point >3% slower go last (e.g. more rows per program after the
    # persistent grid changed): the measurement says that knob, that way, hurts here.
    moves.sort(key=lambda m: _move_key(best, m[1]) in bad)

    for label, candidate in moves:
        if key(candidate) in tried or not _allowed(candidate, banned):
            continue
        return Plan(candidate, f"neighbour of the best ({regime}): {label}")
    # Neighbourhood exhausted: the next untried, allowed point of the family's curated list.
    for candidate in strategy_space(op, request):
        if key(candidate) not in tried and _allowed(candidate, banned):
            return Plan(candidate, f"next point of the strategy space ({regime})")
    if best_attempt is not None:
        return Plan(best, "converged: every point near the best was tried", converged=True)
    return Plan(default_strategy(op), "every point failed; back to the template defaults", converged=True)


def _measured_us(attempt: Attempt) -> float:
    """kernel_us of an attempt in `measured` (which holds only attempts with one)."""
    if attempt.kernel_us is None:
        raise ValueError("an attempt without kernel_us among the measured ones")
    return attempt.kernel_us


def _plateau(measured: list[tuple[int, dict[str, Any], Attempt]]) -> bool:
    if len(measured) <= PLATEAU_STEPS:
        return False
    times = [_measured_us(a) for _, _, a in measured]
    best_before = min(times[:-PLATEAU_STEPS])
    return min(times[-PLATEAU_STEPS:]) > best_before * (1.0 - PLATEAU_GAIN)


BAD_MOVE_SLOWDOWN = 1.03
MOMENTUM_GAIN = 0.02  # keep walking a knob's direction only after a gain of at least 2%


def _move_key(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, Any, Any] | None:
    diff = [k for k in after if after[k] != before.get(k)]
    return (diff[0], before.get(diff[0]), after[diff[0]]) if len(diff) == 1 else None


def _bad_moves(measured: list[tuple[int, dict[str, Any], Attempt]]) -> set[tuple[str, Any, Any]]:
    """(knob, from, to) single-knob moves seen to make a measured point >3% slower."""
    bad: set[tuple[str, Any, Any]] = set()
    for _, a, ta in measured:
        for _, b, tb in measured:
            key = _move_key(a, b)
            if key is not None and _measured_us(tb) > BAD_MOVE_SLOWDOWN * _measured_us(ta):
                bad.add(key)
    return bad


def _improving_move(
    op: str, measured: list[tuple[int, dict[str, Any], Attempt]], best_i: int
) -> tuple[str, int] | None:
    """(knob, direction) of the single-knob change that produced the incumbent, if it was one."""
    earlier = [(s, a) for i, s, a in measured if i < best_i]
    current = [s for i, s, _ in measured if i == best_i]
    if not earlier or not current:
        return None
    previous, prev_attempt = min(earlier, key=lambda m: _measured_us(m[1]))
    best_us = [_measured_us(a) for i, _, a in measured if i == best_i][0]
    if best_us > _measured_us(prev_attempt) * (1.0 - MOMENTUM_GAIN):
        return None  # a marginal gain: explore other knobs before walking further this way
    diff = [k for k in current[0] if current[0][k] != previous.get(k)]
    if len(diff) != 1:
        return None
    knob = diff[0]
    return knob, _direction(op, knob, previous[knob], current[0][knob])


def choose_strategy(request: WriteRequest) -> dict[str, Any]:
    return plan_strategy(request).strategy
