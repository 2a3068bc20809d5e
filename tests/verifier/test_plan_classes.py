"""The plan's classes (docs/verifier.md, "Plan classes") and the error model the judge allows.

The plan draws what a served model runs and N(0, 1) on fresh contiguous tensors never shows: widths
between tile sizes in every dtype, prefill row counts, tensors past a persistent loop's reach,
rank-4 inputs, strided views, optional tensors in their other state, partial rotary, zero rows,
masked logits and late peaks. `plan_corpus.py` holds a wrong kernel per class, right on every case
of the plan before the classes, and honest kernels in several styles; each verdict is asserted.
"""

from __future__ import annotations

import re

import pytest
import torch

from gpuyantra.ops import get_op
from gpuyantra.ops._error_model import layer_norm_bound, softmax_bound
from gpuyantra.verifier import run_verification
from gpuyantra.verifier.cases import (
    VIEW_LAYOUT,
    Case,
    cap_rows,
    class_cases,
    correctness_shapes,
    make_case,
    plan,
    plan_classes,
)
from gpuyantra.verifier.judge import compare_values
from tests.verifier.conftest import rules_of
from tests.verifier.plan_corpus import HONEST, WRONG

BIAS_SPECS = [
    {"name": "weight", "kind": "tensor", "shape": [96, "H"]},
    {"name": "bias", "kind": "optional_tensor", "shape": [96]},
]


def test_every_class_runs_in_every_dtype_where_it_should():
    family = get_op("rms_norm")
    extras = class_cases("cuda", family, [[1, 4096]], ["float16", "bfloat16", "float32"])
    wide = {(c.dtype, c.shape[-1]) for c in extras if c.klass == "wide_rows"}
    for dtype in ("float16", "bfloat16"):  # a non-power-of-two width in each 16-bit dtype
        assert any(d == dtype and w & (w - 1) for d, w in wide)
    assert {c.dist for c in extras if c.klass == "wide_rows"} >= {"normal", "offset", "outliers", "zero_rows"}
    assert max(torch.Size(c.shape).numel() for c in extras if c.klass == "large_tensor") > 2**20
    assert any(len(c.shape) == 4 for c in extras if c.klass == "rank4")
    views = [c for c in extras if c.layout == VIEW_LAYOUT]
    assert views and all(torch.Size(c.shape[:-1]).numel() >= 2 for c in views)  # a row stride to get wrong
    assert not any(c.dist in ("masked_rows", "late_peak") for c in extras)  # logits only
    softmax = class_cases("cpu", get_op("softmax"), [[3, 64]], ["float32"])
    assert {"masked_rows", "late_peak"} <= {c.dist for c in softmax}


def test_cpu_classes_run_reduced_and_the_verdict_says_so():
    family = get_op("rms_norm")
    cases = plan("cpu", [[3, 64]], ["float32"], extras=class_cases("cpu", family, [[3, 64]], ["float32"]))
    classes = plan_classes("cpu", cases, family)
    assert classes["prefill_rows"] == "reduced" and classes["large_tensor"] == "reduced"
    assert classes["view"] == "full" and classes["rank4"] == "full"
    cuda = plan("cuda", [[3, 64]], ["float16"], extras=class_cases("cuda", family, [[3, 64]], ["float16"]))
    assert plan_classes("cuda", cuda, family)["large_tensor"] == "full"


def test_optional_tensors_take_their_other_state_unless_the_live_one_is_known():
    linear = get_op("linear")
    unknown = class_cases("cpu", linear, [[3, 64]], ["float32"], BIAS_SPECS)
    case = next(c for c in unknown if c.variant == "no_optional")
    _, params = make_case(linear, Case(0, "main", "float32", case.shape, 0, 1.0, variant="no_optional"), BIAS_SPECS)
    assert params["bias"] is None and params["weight"] is not None
    known = class_cases("cpu", linear, [[3, 64]], ["float32"], BIAS_SPECS, live_params={"bias": [96]})
    assert not any(c.variant == "no_optional" for c in known)


def test_rope_draws_partial_rotary():
    rope = get_op("rope")
    q, _, cos, sin = make_case(rope, Case(0, "main", "float32", (2, 4, 3, 64), 0, 1.0, variant="partial_rotary"), [])[0]
    assert cos.shape[-1] == sin.shape[-1] == 32 and q.shape[-1] == 64


def test_live_rank4_shapes_keep_their_rank_when_rows_are_capped():
    assert cap_rows([1, 7, 16, 128], 64) == [1, 4, 16, 128]
    assert correctness_shapes("cpu", [[1, 7, 16, 128]])[0] == [1, 4, 16, 128]
    assert correctness_shapes("cpu", [[4096, 128]])[0] == [64, 128]


def test_view_cases_are_strided_slices_with_the_same_values():
    family = get_op("silu_mul")
    plain = make_case(family, Case(0, "main", "float16", (2, 3, 40), 0, 1.0), [])[0]
    view = make_case(family, Case(0, "main", "float16", (2, 3, 40), 0, 1.0, layout=VIEW_LAYOUT), [])[0]
    for p, v in zip(plain, view):
        assert torch.equal(p, v) and not v.is_contiguous()
        assert v.stride(-2) == 80 and v.storage_offset() == 40
    q, _, cos, _ = make_case(get_op("rope"), Case(0, "main", "float32", (2, 4, 3, 16), 0, 1.0, layout=VIEW_LAYOUT), [])[
        0
    ]
    assert q.stride(-1) == 1 and q.stride(1) < q.stride(2)  # rope's transposed layout stays
    assert cos.is_contiguous()  # bounded inputs stay as made


def test_served_layouts_are_drawn_exactly_and_rows_capped():
    """The profile target's `layouts`: a case per served strided shape and dtype, input 0 at exactly
    the served strides and offset, NaN around it; rows capped on CPU (the verdict says reduced)."""
    family = get_op("rms_norm")
    last_token = {"input": 0, "shape": [3, 1, 64], "stride": [1024, 64, 1], "offset": 960}
    long_prompts = {"input": 0, "shape": [80, 1, 64], "stride": [2**20, 64, 1], "offset": 2**20 - 64}
    extras = class_cases("cpu", family, [[3, 64]], ["float32", "float16"], live_layouts=[last_token, long_prompts])
    served = [c for c in extras if c.klass == "live_layout"]
    assert [(c.dtype, c.shape) for c in served] == [
        ("float32", (3, 1, 64)),
        ("float16", (3, 1, 64)),
        ("float32", (64, 1, 64)),
        ("float16", (64, 1, 64)),
    ]
    cases = plan("cpu", [[3, 64]], ["float32"], extras=served[:1])
    case = Case.from_json(cases[-1].to_json())  # as the child reads it
    (x,), _ = make_case(family, case, [])
    assert x.stride() == (1024, 64, 1) and x.storage_offset() == 960
    base = x.as_strided((x.untyped_storage().nbytes() // x.element_size(),), (1,), 0)
    assert int(torch.isnan(base).sum()) == base.numel() - x.numel()  # a wrong read meets NaN
    assert plan_classes("cpu", cases, family)["live_layout"] == "full"
    capped = plan("cpu", [[3, 64]], ["float32"], extras=served[2:3])
    (y,), _ = make_case(family, capped[-1], [])
    assert y.shape == (64, 1, 64) and y.stride()[0] > 64 and y.storage_offset() % 64 == 0
    assert y.untyped_storage().nbytes() < 2**22  # gaps shrunk, still a gap between rows
    assert plan_classes("cpu", capped, family)["live_layout"] == "reduced"


@pytest.mark.parametrize(
    "layouts,field",
    [
        ({"input": 0}, "layouts must be a list"),
        ([{"input": 0, "shape": [2, 64], "stride": [64], "offset": 0}], "layouts[0].stride"),
        ([{"input": -1, "shape": [2, 64], "stride": [128, 1], "offset": 0}], "layouts[0].input"),
        ([{"input": 0, "shape": [0, 64], "stride": [128, 1], "offset": 0}], "layouts[0].shape"),
        ([{"shape": [2, 64]}], "layouts[0] must hold"),
    ],
)
def test_bad_served_layouts_name_the_field(layouts, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        run_verification(HONEST[0].path, device="cpu", layouts=layouts)


def test_value_classes_hold_zero_rows_masked_rows_and_late_peaks():
    family = get_op("softmax")
    (zero,), _ = make_case(family, Case(0, "main", "float32", (4, 100), 0, 1.0, "zero_rows"), [])
    assert bool((zero[0::2] == 0).all()) and bool((zero[1::2] != 0).any())
    (masked,), _ = make_case(family, Case(0, "main", "float32", (6, 300), 0, 1.0, "masked_rows"), [])
    assert bool(torch.isneginf(masked).any(dim=-1).all())
    whole = torch.isneginf(masked).all(dim=-1)
    assert whole.tolist() == [False, False, False, True, False, False]  # every fourth row masked whole
    assert bool(torch.isfinite(masked[~whole, -1]).all())
    (late,), _ = make_case(family, Case(0, "main", "float32", (3, 300), 0, 1.0, "late_peak"), [])
    assert bool((late[:, -1] - late[:, :-1].amax(-1) > 88.8).all())


def _layer_norm_float32(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, style: str) -> torch.Tensor:
    """A correct float32 LayerNorm in several summation orders, or the one-pass variance."""
    xf = x.float()
    n = x.shape[-1]
    if style == "sequential":  # a scalar loop: the worst order for a float32 sum
        total = torch.zeros(x.shape[0], dtype=torch.float32)
        for j in range(n):
            total = total + xf[:, j]
        mean = (total / n)[:, None]
    else:  # chunks of 128, summed in order
        mean = (xf.reshape(x.shape[0], -1, 128).sum(-1).sum(-1) / n)[:, None]
    if style == "one_pass":
        var = (xf * xf).mean(-1, keepdim=True) - mean * mean
    else:
        var = ((xf - mean) ** 2).mean(-1, keepdim=True)
    return ((xf - mean) * torch.rsqrt(var + eps) * w.float() + b.float()).to(x.dtype)


@pytest.mark.parametrize("style,honest", [("sequential", True), ("chunked", True), ("one_pass", False)])
def test_layer_norm_error_model_takes_every_correct_order_and_not_a_one_pass_variance(style, honest):
    """GPT-2's width, float32 rows at 2000 +- 1: the allowance comes from the error model of a correct
    float32 computation, not from torch's own float32 error on these inputs."""
    family = get_op("layer_norm")
    case = Case(0, "main", "float32", (64, 768), 0, 1.0, "offset")
    specs = [
        {"name": "weight", "kind": "tensor", "shape": ["H"]},
        {"name": "bias", "kind": "tensor", "shape": ["H"]},
        {"name": "eps", "kind": "float", "value": 1e-5},
    ]
    (x,), params = make_case(family, case, specs)
    want = family.reference(x.double(), weight=params["weight"].double(), bias=params["bias"].double(), eps=1e-5)
    got = _layer_norm_float32(x, params["weight"], params["bias"], 1e-5, style)
    bound = layer_norm_bound(x, params["weight"], params["bias"], 1e-5, torch.float32)
    finding = compare_values(got, want, family.tolerance(torch.float32), 0, "test", bound=bound)
    assert (finding is None) == honest, finding


def test_a_row_masked_whole_must_give_nan_as_the_module_does():
    """softmax of a row of -inf is NaN in float64 and in the module: a kernel must give NaN there (not
    zeros, not a uniform row); every other row is judged as before."""
    family = get_op("softmax")
    (x,), params = make_case(family, Case(0, "main", "float32", (8, 64), 0, 1.0, "masked_rows"), [])
    want = torch.softmax(x.double(), dim=-1)
    honest = torch.softmax(x, dim=-1)
    assert bool(torch.isnan(honest[3]).all())
    assert compare_values(honest, want, (1e-5, 1e-5), 0, "case") is None
    zeroed = honest.nan_to_num(0.0)
    finding = compare_values(zeroed, want, (1e-5, 1e-5), 0, "case")
    assert finding is not None and "want nan" in finding.message
    wrong_elsewhere = honest.clone()
    wrong_elsewhere[0, -1] += 0.5
    assert compare_values(wrong_elsewhere, want, (1e-5, 1e-5), 0, "case") is not None


def test_softmax_error_model_is_zero_where_masked():
    x = torch.tensor([[float("-inf"), 0.0, 1.0], [2.0, float("-inf"), 2.0]])
    bound = softmax_bound(x, torch.float32)
    assert bool(torch.isfinite(bound).all()) and float(bound[0, 0]) == 0.0 and float(bound[1, 0]) > 0


@pytest.mark.parametrize("entry", WRONG, ids=[e.name for e in WRONG])
def test_wrong_kernel_is_rejected_by_its_class(entry):
    verdict = run_verification(entry.path, device="cpu", seeds=(0,), **entry.knobs)
    assert not verdict.accepted, verdict.to_dict()
    assert rules_of(verdict) == {("correctness", entry.rule)}, verdict.failures


@pytest.mark.parametrize("entry", HONEST, ids=[e.name for e in HONEST])
def test_honest_kernel_passes_every_class(entry):
    verdict = run_verification(entry.path, device="cpu", seeds=(0,), **entry.knobs)
    assert verdict.failures == [] and verdict.accepted
    assert verdict.plan_classes.get("view") == "full"


def test_the_corpus_has_a_wrong_kernel_per_class_and_rule():
    classes = {"wide_rows", "prefill_rows", "large_tensor", "rank4", "view", "live_layout", "no_optional"}
    classes |= {"partial_rotary"}
    classes |= {"zero_rows", "masked_rows", "late_peak"}
    assert {e.plan_class for e in WRONG} == classes
    rules = {"unseen-shape", "input-layout", "optional-parameter", "unstable-numerics", "shape-cap"}
    assert {e.rule for e in WRONG} == rules
