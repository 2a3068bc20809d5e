"""Trust against the three classes of subtly wrong kernels N(0, 1) inputs never expose.

1. `unstable-numerics`: math that overflows or cancels on values real activations hold (rows far
   from zero mean, outliers of hundreds to thousands, gates past exp's overflow point).
2. `hardcoded-constant`: a constant baked in where the module's bound scalar belongs.
3. `shape-cap`: work skipped past a grid or tile cap.

Each cheat here is correct on the plain N(0, 1) cases with the live scalars, so the verdict must
name exactly the class that exposes it.
"""

from __future__ import annotations

import pytest
import torch

from gpuyantra.ops import get_op
from gpuyantra.verifier import run_verification
from gpuyantra.verifier.cases import (
    GATE_PEAK,
    OFFSET,
    OUTLIER_PEAK,
    STRESS_SHAPES,
    Case,
    make_case,
    plan,
    stress_shapes,
)
from tests.verifier.conftest import candidate_path, rules_of

F32 = {"seeds": (0,), "dtypes": ["float32"]}

CLASS_CHEATS = [
    ("cheat_fp16_sum_of_squares", {"seeds": (0,), "dtypes": ["float16"]}, "unstable-numerics"),
    ("cheat_one_pass_variance", F32, "unstable-numerics"),
    ("cheat_exp_sigmoid", F32, "unstable-numerics"),
    ("cheat_softmax_no_max", F32, "unstable-numerics"),
    ("cheat_baked_eps", {"seeds": (0, 1), "dtypes": ["float32"]}, "hardcoded-constant"),
    ("cheat_grid_cap", F32, "shape-cap"),
    ("cheat_tile_cap", F32, "shape-cap"),
]


# Classes of the plan's own (docs/verifier.md, "plan classes") that expose a cheat here too: the
# 5120-wide rows of the wide-row class pass a 4096-column tile cap.
ALSO_EXPOSED = {"cheat_tile_cap": {"unseen-shape"}}


@pytest.mark.parametrize("name,knobs,rule", CLASS_CHEATS, ids=[c[0] for c in CLASS_CHEATS])
def test_subtly_wrong_kernel_is_rejected_with_the_rule_naming_its_class(name, knobs, rule):
    verdict = run_verification(candidate_path(name), device="cpu", **knobs)
    assert not verdict.accepted and verdict.reward == -1
    # Only the class rule: the kernel is right on plain inputs at the live scalars.
    expected = {("correctness", r) for r in {rule, *ALSO_EXPOSED.get(name, ())}}
    assert rules_of(verdict) == expected, verdict.failures


def test_baked_eps_names_the_drawn_value_and_the_live_one():
    verdict = run_verification(candidate_path("cheat_baked_eps"), device="cpu", seeds=(0, 1), dtypes=["float32"])
    message = verdict.failures[0].message
    assert "eps=" in message and "(live 1e-06)" in message


def test_plan_has_activation_like_inputs_drawn_scalars_and_stress_shapes():
    family = get_op("rms_norm")
    cases = plan("cpu", [[3, 64]], ["float32", "float16"], stress=stress_shapes("cpu", family))
    dists = {c.dist for c in cases}
    assert dists == {"normal", "offset", "outliers"}
    assert any(c.draw_scalars for c in cases) and any(not c.draw_scalars and c.dist == "normal" for c in cases)
    assert not any(c.draw_scalars for c in cases if c.dist != "normal")  # those judge the inputs alone
    stress = [c for c in cases if c.stress]
    assert sorted(list(c.shape) for c in stress) == sorted(STRESS_SHAPES["cpu"])
    assert {c.dtype for c in stress} == {"float32"}
    rows = max(c.shape[0] for c in stress)
    cols = max(c.shape[-1] for c in stress)
    assert rows > 1024 and cols > 16384 and cols % 2 == 1


def test_cuda_stress_shapes_pass_a_cuda_grid_cap_and_rope_keeps_an_even_head_dim():
    shapes = STRESS_SHAPES["cuda"]
    assert max(s[0] for s in shapes) > 65536 and max(s[-1] for s in shapes) > 16384
    assert all(s[-1] % 2 == 0 for s in stress_shapes("cuda", get_op("rope")))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_offset_rows_sit_far_from_zero_relative_to_their_spread(dtype):
    family = get_op("layer_norm")
    (x,), _ = make_case(family, Case(0, "main", dtype, (8, 4096), 0, 1.0, "offset"), [])
    x = x.double()
    ratio = x.mean(-1).abs() / x.std(-1)
    offset, spread = OFFSET[dtype]
    assert bool((x.mean(-1).abs() >= 0.45 * offset).all()) and float(ratio.min()) > 50
    assert bool(torch.isfinite(x).all())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_outliers_reach_the_dtypes_safe_range_in_every_row(dtype):
    family = get_op("rms_norm")
    (x,), _ = make_case(family, Case(0, "main", dtype, (16, 4096), 0, 1.0, "outliers"), [])
    peak = x.double().abs().amax(-1)
    assert bool((peak >= 0.25 * OUTLIER_PEAK[dtype] * 0.99).all()) and float(peak.max()) <= OUTLIER_PEAK[dtype]
    # Squares overflow float16 (65504) in every row: the class of kernel this distribution exists for.
    if dtype == "float16":
        assert bool((peak * peak > 65504).all())


def test_gates_pass_exps_overflow_point_and_other_roles_stay_as_made():
    silu = get_op("silu_mul")
    gate, up = make_case(silu, Case(0, "main", "float32", (4, 1000), 0, 1.0, "outliers"), [])[0]
    assert float(gate.abs().max()) > 88.8 and float(gate.abs().max()) <= GATE_PEAK
    plain_up = make_case(silu, Case(0, "main", "float32", (4, 1000), 0, 1.0), [])[0][1]
    assert float(up.abs().max()) < 10 and float(plain_up.abs().max()) < 10  # up stays N(0, 1)-like
    rope = get_op("rope")
    plain = make_case(rope, Case(0, "main", "float32", (2, 8, 64), 0, 1.0, "normal"), [])[0]
    shifted = make_case(rope, Case(0, "main", "float32", (2, 8, 64), 0, 1.0, "offset"), [])[0]
    assert torch.equal(plain[2], shifted[2]) and torch.equal(plain[3], shifted[3])  # cos/sin untouched
    assert shifted[0].stride() == plain[0].stride()  # the layout attention modules give is kept
    assert float(shifted[0].double().mean(-1).abs().min()) > 100


def test_drawn_scalars_move_around_the_live_value_and_live_cases_keep_it():
    family = get_op("rms_norm")
    specs = [{"name": "weight", "kind": "tensor", "shape": ["H"]}, {"name": "eps", "kind": "float", "value": 1e-6}]
    drawn = [
        make_case(family, Case(0, "main", "float32", (2, 64), seed, 1.0, draw_scalars=True), specs)[1]["eps"]
        for seed in range(1, 40)
    ]
    assert all(1e-7 <= e <= 1e-4 for e in drawn) and len(set(drawn)) == len(drawn)
    assert max(drawn) / min(drawn) > 100
    live = make_case(family, Case(0, "main", "float32", (2, 64), 0, 1.0), specs)[1]["eps"]
    assert live == 1e-6
    # One value per seed across shapes, dtypes and scales: a constexpr eps compiles a few times only.
    same_seed = {
        make_case(family, Case(0, "main", dtype, shape, 3, scale, draw_scalars=True), specs)[1]["eps"]
        for dtype in ("float32", "float16")
        for shape in ((2, 64), (3, 96))
        for scale in (1.0, 0.01)
    }
    assert len(same_seed) == 1


def test_case_round_trips_through_json_with_its_new_fields():
    case = Case(3, "main", "float16", (2, 64), 1, 1.0, "outliers", True, True)
    assert Case.from_json(case.to_json()) == case
