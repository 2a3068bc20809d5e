"""The offline author: a deterministic search over each family's strategy space that starts from
the seed skill or the shapes, and reads the verifier's feedback to choose the next variant."""

from __future__ import annotations

import zlib

import pytest

from gpuyantra.authors.base import Attempt, WriteRequest
from gpuyantra.authors.template import (
    KNOBS,
    STRATEGY_SPACES,
    TemplateAuthor,
    canonical,
    default_strategy,
    parse_strategy,
    plan_strategy,
    render,
)
from gpuyantra.candidate import load_candidate

NORM_ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]
FAMILIES = ["rms_norm", "gemma_rms_norm", "layer_norm", "add_rms_norm", "silu_mul", "gelu_tanh_mul", "rope", "softmax"]


def request(op="rms_norm", shapes=((32768, 4096),), history=(), hardware="cuda", **kw):
    return WriteRequest(
        op=op,
        module_class="m",
        adapter=NORM_ADAPTER if op == "rms_norm" else [],
        shapes=[list(s) for s in shapes],
        dtype="bfloat16",
        hardware=hardware,
        history=list(history),
        **kw,
    )


def ok(strategy, us, floor=125.0):
    return Attempt(strategy=dict(strategy), reward=3, kernel_us=us, floor_us=floor)


def failed(strategy, layer="correctness", message="max abs err 0.5"):
    return Attempt(strategy=dict(strategy), reward=-1, failures=[{"layer": layer, "rule": "r", "message": message}])


@pytest.mark.parametrize("op", FAMILIES)
def test_every_family_has_a_space_and_knobs_matching_its_template(op):
    defaults = default_strategy(op)
    assert set(KNOBS[op]) == set(defaults)
    for knob, values in KNOBS[op].items():
        assert defaults[knob] in values
    assert len(STRATEGY_SPACES[op]) >= 5
    for point in STRATEGY_SPACES[op]:
        assert set(point) <= set(defaults)


def test_render_writes_a_readable_candidate_with_the_strategy_and_adapter(tmp_path):
    strategy = {**default_strategy("rms_norm"), "ROWS_PER_PROGRAM": 4, "X_EVICTION": "evict_first"}
    adapter = [{"kernel_param": "weight", "module_attr": "weight"}, {"kernel_param": "eps", "module_attr": "eps"}]
    source = render("rms_norm", strategy, adapter)
    assert parse_strategy(source) == strategy
    assert "ROWS_PER_PROGRAM = 4  # rows per tile" in source  # the knob's comment stays
    path = tmp_path / "c.py"
    path.write_text(source)
    candidate = load_candidate(path)
    assert candidate.adapter == adapter and candidate.module.ROWS_PER_PROGRAM == 4
    empty = render("silu_mul", {}, [])
    assert "ADAPTER = [\n]\n" in empty and "def entry(gate, up)" in empty


def test_deterministic_for_the_same_request():
    history = [
        ok(default_strategy("rms_norm"), 137.0),
        ok({**default_strategy("rms_norm"), "ROWS_PER_PROGRAM": 2}, 140),
    ]
    first = TemplateAuthor().write(request(history=history))
    second = TemplateAuthor().write(request(history=history))
    assert first.source == second.source and first.strategy == second.strategy and first.notes == second.notes


def test_first_write_uses_the_seed_skill():
    seed = {**default_strategy("rms_norm"), "ROWS_PER_PROGRAM": 8, "NUM_WARPS": 8}
    assert plan_strategy(request(seed_strategy=seed)).strategy == seed
    # A seed given only as source: its strategy block is read back.
    source = render("rms_norm", seed, NORM_ADAPTER)
    plan = plan_strategy(request(seed_source=source))
    assert plan.strategy == seed and "seed" in plan.reason
    # A seed from another family contributes only the knobs this template has.
    other = plan_strategy(request(seed_strategy={"BLOCK_SIZE": 512, "ROWS_PER_PROGRAM": 2}))
    assert other.strategy == {**default_strategy("rms_norm"), "ROWS_PER_PROGRAM": 2}


def test_first_strategy_from_the_shapes():
    small_h = plan_strategy(request(shapes=[(4096, 128)])).strategy
    assert small_h["ROWS_PER_PROGRAM"] == 16  # head-dim norms: many rows per program
    assert plan_strategy(request(shapes=[(4096, 1024)])).strategy["ROWS_PER_PROGRAM"] == 2
    assert plan_strategy(request(shapes=[(4096, 4096)])).strategy["ROWS_PER_PROGRAM"] == 1
    wide = plan_strategy(request(shapes=[(8, 16384)])).strategy  # chunked loop over H
    assert wide["BLOCK_H_MAX"] < 16384 and wide["CHUNK"] <= wide["BLOCK_H_MAX"]
    cpu = plan_strategy(request(shapes=[(64, 64)], hardware="cpu")).strategy
    assert cpu["ROWS_PER_PROGRAM"] > 1  # the interpreter runs programs one by one
    assert plan_strategy(request("silu_mul", shapes=[(64, 64)], hardware="cpu")).strategy["BLOCK_SIZE"] == 16384


def test_after_a_success_it_tries_a_neighbour_of_the_fastest():
    base = default_strategy("rms_norm")
    slower = {**base, "ROWS_PER_PROGRAM": 2}
    plan = plan_strategy(request(history=[ok(base, 137.0), ok(slower, 150.0)]))
    changed = {k for k in base if plan.strategy[k] != base[k]}
    assert len(changed) == 1  # one knob, one step from the fastest point (not from the slower one)
    knob = changed.pop()
    values = KNOBS["rms_norm"][knob]
    assert abs(values.index(plan.strategy[knob]) - values.index(base[knob])) == 1 or knob == "NUM_WARPS"
    assert "neighbour of the best" in plan.reason


def test_it_continues_in_the_direction_that_helped():
    base = default_strategy("rms_norm")
    history = [ok(base, 140.0), ok({**base, "MAX_PROGRAMS": 8448}, 135.0)]
    plan = plan_strategy(request(history=history))
    assert plan.strategy["MAX_PROGRAMS"] == 4224  # one more step the same way


def test_after_a_failure_it_avoids_what_distinguished_the_failed_strategy():
    base = default_strategy("rms_norm")
    bad = {**base, "X_EVICTION": "evict_first"}
    history = [ok(base, 137.0), failed(bad)]
    for _ in range(12):
        plan = plan_strategy(request(history=history))
        if plan.converged:
            break
        assert plan.strategy["X_EVICTION"] != "evict_first"
        history.append(ok(plan.strategy, 138.0 + len(history)))


def test_resource_failures_ban_larger_sizes_too():
    base = {**default_strategy("rms_norm"), "ROWS_PER_PROGRAM": 2}
    history = [ok(base, 137.0), failed({**base, "ROWS_PER_PROGRAM": 4}, "sandbox", "OutOfResources: shared memory")]
    for _ in range(10):
        plan = plan_strategy(request(shapes=[(32768, 1024)], history=history))
        if plan.converged:
            break
        assert plan.strategy["ROWS_PER_PROGRAM"] <= 2
        history.append(ok(plan.strategy, 140.0 + len(history)))


def test_stops_within_5_percent_of_the_floor():
    base = default_strategy("rms_norm")
    plan = plan_strategy(request(history=[ok(base, 130.0, floor=125.0)]))
    assert plan.converged and plan.strategy == base and "within 5%" in plan.reason
    assert TemplateAuthor().converged(request(history=[ok(base, 130.0, floor=125.0)]))
    assert not plan_strategy(request(history=[ok(base, 140.0, floor=125.0)])).converged


def test_stops_on_a_plateau_and_reports_launch_bound_regime():
    base = default_strategy("rms_norm")
    history = [ok(base, 30.0, floor=0.01)]
    plan = plan_strategy(request(shapes=[(1, 4096)], history=history))
    assert "launch-bound" in plan.reason
    for us in (30.5, 31.0, 30.2, 30.9):
        history.append(ok(plan.strategy, us, floor=0.01))
        plan = plan_strategy(request(shapes=[(1, 4096)], history=history))
    assert plan.converged and "no 1% gain" in plan.reason and plan.strategy == base


def test_no_attempt_is_wasted_on_an_equivalent_strategy():
    base = default_strategy("rms_norm")
    shapes = [(1, 4096)]  # one row: rows per program and persistent grids change nothing
    assert canonical("rms_norm", base, shapes) == canonical("rms_norm", {**base, "ROWS_PER_PROGRAM": 8}, shapes)
    assert canonical("rms_norm", base, shapes) == canonical("rms_norm", {**base, "MAX_PROGRAMS": 132}, shapes)
    assert canonical("rms_norm", base, shapes) == canonical("rms_norm", {**base, "CHUNK": 1024}, shapes)
    history = [ok(base, 30.0, floor=0.01)]
    seen = {canonical("rms_norm", base, shapes)}
    for _ in range(6):
        plan = plan_strategy(request(shapes=shapes, history=history))
        if plan.converged:
            break
        key = canonical("rms_norm", plan.strategy, shapes)
        assert key not in seen
        seen.add(key)
        history.append(ok(plan.strategy, 29.0 - len(history), floor=0.01))


@pytest.mark.parametrize("op", FAMILIES)
def test_a_whole_search_renders_loadable_candidates(op, tmp_path):
    """Simulated feedback (a made-up cost per knob); every written file loads; the search ends."""
    shapes = [(1, 32, 4096, 128)] if op == "rope" else [(32768, 4096)]
    author = TemplateAuthor()
    history: list[Attempt] = []
    for i in range(30):
        req = WriteRequest(
            op=op,
            module_class="m",
            adapter=NORM_ADAPTER if op == "rms_norm" else [],
            shapes=[list(s) for s in shapes],
            dtype="bfloat16",
            hardware="cuda",
            history=list(history),
            iteration=i,
        )
        written = author.write(req)
        path = tmp_path / f"{op}_{i}.py"
        path.write_text(written.source)
        assert load_candidate(path).op == op
        if written.notes.startswith("converged"):
            break
        cost = 200.0 + sum(zlib.crc32(f"{k}={v}".encode()) % 7 for k, v in written.strategy.items())
        history.append(Attempt(written.strategy, 3, kernel_us=cost, floor_us=150.0))
    else:
        pytest.fail("the search never converged")
