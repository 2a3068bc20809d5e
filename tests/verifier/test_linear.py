"""The verifier on `linear` candidates: cases at the live module's weight shape (out-features from
`param_shapes`, bias None honoured), the float32-accumulation bound, and the two matmul cheats it
must stop on the CPU: 16-bit accumulation and skipped K tiles."""

from __future__ import annotations

import torch

from gpuyantra.authors.base import WriteRequest
from gpuyantra.authors.template import initial_strategy, render
from gpuyantra.ops import get_op
from gpuyantra.verifier import run_verification
from gpuyantra.verifier.cases import (
    Case,
    live_param_specs,
    make_case,
    param_case_shapes,
    parse_param_shapes,
    stress_shapes,
)
from gpuyantra.verifier.judge import _value_rules
from tests.verifier.conftest import candidate_path, rules_of

FAMILY = get_op("linear")
DEFAULT_SPECS = [  # what the contract reads from a meta nn.Linear(64, 64)
    {"name": "weight", "kind": "tensor", "shape": ["H", "H"]},
    {"name": "bias", "kind": "optional_tensor", "shape": ["H"]},
]
QKV = {"weight": [2048, 1536], "bias": None}  # a decode projection without bias
FP16_ONE_SEED = {"seeds": (0,), "dtypes": ["float16"], "benchmark": False}


def test_param_shapes_parse_and_place_the_hidden_size():
    assert parse_param_shapes(["weight=2048x1536", "bias=none"]) == QKV
    specs = live_param_specs(DEFAULT_SPECS, QKV, [[1, 1536]])
    assert specs == [
        {"name": "weight", "kind": "tensor", "shape": [2048, "H"]},  # N stays live, K follows each case
        {"name": "bias", "kind": "optional_tensor", "shape": None},
    ]
    square = live_param_specs(DEFAULT_SPECS, {"weight": [1536, 1536]})
    assert square[0]["shape"] == ["H", "H"] and square[1]["shape"] == ["H"]
    for bad in ({"eps": [3]}, {"weight": None}):
        try:
            live_param_specs(DEFAULT_SPECS, bad)
        except ValueError as exc:
            assert "--param-shape" in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")


def test_cases_use_the_live_out_features_fitted_and_no_bias():
    specs = live_param_specs(DEFAULT_SPECS, QKV, [[1, 1536]])
    shapes = param_case_shapes(FAMILY, [1, 1536], specs, "cuda")
    assert shapes == {"weight": [2048, 1536], "bias": None}  # the real weight on a GPU
    acts, params = make_case(FAMILY, Case(0, "main", "float16", (1, 1536), 0, 1.0), specs, "cpu")
    n = params["weight"].shape[0]
    assert params["bias"] is None and params["weight"].shape[1] == 1536 and n % 2 == 1 and n < 2048
    # The long-K stress shape keeps K and shrinks N on the CPU interpreter.
    (k_stress,) = [s for s in stress_shapes("cpu", FAMILY) if s[-1] > 16384]
    stress = param_case_shapes(FAMILY, k_stress, specs, "cpu")
    assert stress["weight"][1] == k_stress[-1] and stress["weight"][0] * k_stress[-1] <= 1 << 19


def test_drawn_scalar_seeds_are_plain_seeds_for_a_family_without_scalars():
    case = Case(0, "main", "float16", (1, 64), 1, 1.0, draw_scalars=True)
    assert _value_rules(case, scalars=False) == ("nan-output", "wrong-values")
    assert _value_rules(case, scalars=True) == ("hardcoded-constant", "hardcoded-constant")


def test_template_is_accepted_at_the_live_weight_shape(tmp_path):
    request = WriteRequest(
        op="linear", module_class="Linear", adapter=[], shapes=[[1, 1536]], hardware="cpu", param_shapes=QKV
    )
    adapter = FAMILY.default_adapter(torch.nn.Linear)
    path = tmp_path / "linear.py"
    path.write_text(render("linear", initial_strategy(request), adapter))
    # Two seeds (no scalar to draw: the other three add only more random inputs), both CPU dtypes.
    verdict = run_verification(path, device="cpu", shapes=[[1, 1536]], param_shapes=QKV, seeds=(0, 1), benchmark=False)
    assert verdict.accepted, [f"{f.layer}/{f.rule}: {f.message}" for f in verdict.failures]
    assert verdict.shapes[0] == [1, 1536] and [2, 4099] in verdict.shapes  # live first, then a long K
    assert set(verdict.dtypes) == {"float32", "float16"}


def test_fp16_accumulation_is_rejected():
    verdict = run_verification(candidate_path("cheat_linear_fp16_accumulate"), device="cpu", **FP16_ONE_SEED)
    assert not verdict.accepted and verdict.reward == -1
    rules = rules_of(verdict)
    assert ("correctness", "wrong-values") in rules, verdict.failures
    message = next(f.message for f in verdict.failures if f.rule == "wrong-values")
    assert "float32-accumulation bound" in message and "float16" in message


def test_skipped_k_tiles_are_rejected_by_the_long_k_stress_shape():
    verdict = run_verification(candidate_path("cheat_linear_k_cap"), device="cpu", **FP16_ONE_SEED)
    assert not verdict.accepted and verdict.reward == -1
    # Right on every shape with K <= 8192: only the long-K stress shape exposes it.
    assert rules_of(verdict) == {("correctness", "shape-cap")}, verdict.failures
    assert "16411" in verdict.failures[0].message
