"""Every family's template kernel is a valid candidate file and computes its family, in Triton's
interpreter: against the float64 reference directly, through the verifier, and for every point of
the offline author's strategy space."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch

from gpuyantra.authors.template import STRATEGY_SPACES, default_strategy, template_source
from gpuyantra.ops import get_op
from gpuyantra.ops.base import import_class

from .helpers import assert_matches_reference

FAMILIES = ["rms_norm", "gemma_rms_norm", "layer_norm", "add_rms_norm", "silu_mul", "gelu_tanh_mul", "rope", "softmax"]
# Padding rows of a softmax tile are all -inf (never stored): numpy warns about -inf - -inf.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
ALLOWED_IMPORTS = {"torch", "triton", "triton.language", "math", "typing"}
# (rows, hidden) per family: rope's hidden is the head dim and rows (B, Hq, S).
SHAPES = {
    "default": [((1,), 96), ((3,), 64), ((2, 5), 200), ((33,), 48)],
    "rope": [((1, 4, 1), 16), ((2, 8, 3), 32), ((1, 2, 5), 24), ((2, 3), 64)],
}
DTYPES = [torch.float32, torch.float16]


def shapes_for(op):
    return SHAPES.get(op, SHAPES["default"])


def case(op, rows, hidden, dtype, seed=0):
    family = get_op(op)
    gen = torch.Generator().manual_seed(seed)
    acts = family.make_activations(rows, hidden, dtype, "cpu", gen)
    return family, acts, family.make_params(hidden, dtype, "cpu", gen)


@pytest.mark.parametrize("op", FAMILIES)
def test_template_is_a_valid_candidate_file(op, load_rendered):
    source = template_source(op)
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {a.name for a in node.names} <= ALLOWED_IMPORTS
        elif isinstance(node, ast.ImportFrom):
            assert node.module in ALLOWED_IMPORTS
        assert not isinstance(node, (ast.Try, ast.Global, ast.Nonlocal)), f"{op}: {type(node).__name__}"
    # Module level: imports, docstring, OP, ADAPTER, strategy constants, kernels, entry.
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            assert isinstance(stmt.value, (ast.Constant, ast.List)), ast.unparse(stmt)
    candidate = load_rendered(op)
    family = get_op(op)
    assert candidate.op == op
    if family.params:
        assert candidate.adapter == family.default_adapter(import_class(family.default_module))
    else:
        assert candidate.adapter == []
    sig = inspect.signature(candidate.entry)
    positional = [p.name for p in sig.parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
    keyword = [p.name for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY]
    assert tuple(positional) == family.activations
    assert tuple(keyword) == tuple(p.name for p in family.params)
    assert "# strategy:begin" in source and default_strategy(op)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
@pytest.mark.parametrize("op", FAMILIES)
def test_template_matches_float64_reference(op, dtype, load_rendered):
    candidate = load_rendered(op)
    for i, (rows, hidden) in enumerate(shapes_for(op)):
        family, acts, params = case(op, rows, hidden, dtype, seed=i)
        assert_matches_reference(family, candidate.entry(*acts, **params), acts, params)


WIDE = {"BLOCK_H_MAX": 64, "CHUNK": 32}  # forces the chunked kernel on rows wider than 64


@pytest.mark.parametrize("op", ["rms_norm", "gemma_rms_norm", "layer_norm", "add_rms_norm", "softmax"])
@pytest.mark.parametrize(
    "strategy",
    [WIDE, {**WIDE, "MAX_PROGRAMS": 2}, {"ROWS_PER_PROGRAM": 4, "MAX_PROGRAMS": 3}],
    ids=["chunked", "chunked-persistent", "tiles-persistent"],
)
def test_row_templates_chunked_and_persistent_paths(op, strategy, load_rendered):
    candidate = load_rendered(op, {**default_strategy(op), **strategy})
    for dtype in DTYPES:
        family, acts, params = case(op, (9,), 200, dtype)
        assert_matches_reference(family, candidate.entry(*acts, **params), acts, params)


def test_rms_norm_mixed_dtypes_and_strided_input(load_rendered):
    family = get_op("rms_norm")
    candidate = load_rendered("rms_norm")
    x = torch.randn(4, 6, 80, dtype=torch.float16)[:, ::2, :]  # rows with a stride gap
    weight = torch.randn(80) * 0.5 + 1  # float32 weight, float16 x: output is float32 (Llama)
    out = candidate.entry(x, weight=weight, eps=1e-6)
    assert out.dtype == torch.float32
    assert_matches_reference(family, out, (x,), {"weight": weight, "eps": 1e-6}, dtype=torch.float16)
    xt = torch.randn(80, 5, dtype=torch.float32).t()  # last dim not contiguous
    assert_matches_reference(
        family, candidate.entry(xt, weight=weight, eps=1e-6), (xt,), {"weight": weight, "eps": 1e-6}
    )


def test_layer_norm_without_affine_and_with_shifted_stats(load_rendered):
    family = get_op("layer_norm")
    x = torch.randn(6, 120) * 3 + 40  # large mean: the shifted moments must not cancel
    lean = {"SHIFTED_STATS": True, "RELOAD_AFFINE": True}
    for strategy in (
        {},
        {"SHIFTED_STATS": True},
        {"SHIFTED_STATS": True, "ROWS_PER_PROGRAM": 4},
        {**WIDE, "SHIFTED_STATS": True},
        {**WIDE, "SHIFTED_STATS": True, "MAX_PROGRAMS": 2},
        {"RELOAD_AFFINE": True},
        lean,
        {**lean, "ROWS_PER_PROGRAM": 4, "NUM_WARPS": 2},
        {**lean, "ROWS_PER_PROGRAM": 2, "MAX_PROGRAMS": 2},
        {**WIDE, **lean},
    ):
        candidate = load_rendered("layer_norm", {**default_strategy("layer_norm"), **strategy})
        for weight, bias in ((torch.randn(120), torch.randn(120)), (None, None), (torch.randn(120), None)):
            params = {"weight": weight, "bias": bias, "eps": 1e-5}
            assert_matches_reference(family, candidate.entry(x, **params), (x,), params)


def test_softmax_handles_masked_scores(load_rendered):
    family = get_op("softmax")
    x = torch.randn(2, 3, 5, 70, dtype=torch.float16)
    x[..., 40:] = float("-inf")  # causal-style mask
    for strategy in ({}, WIDE):
        candidate = load_rendered("softmax", {**default_strategy("softmax"), **strategy})
        assert_matches_reference(family, candidate.entry(x), (x,), {})
        allmasked = torch.full((2, 70), float("-inf"))
        assert torch.isnan(candidate.entry(allmasked)).all()  # as torch.softmax


@pytest.mark.parametrize("op", ["silu_mul", "gelu_tanh_mul"])
def test_gated_templates_take_row_strided_views(op, load_rendered):
    family = get_op(op)
    fused = torch.randn(2, 5, 2 * 72, dtype=torch.float16)
    gate, up = fused.chunk(2, dim=-1)  # Phi-3's gate_up_proj output split in two
    for strategy in ({}, {"FLAT": False}, {"BLOCK_SIZE": 32}):
        candidate = load_rendered(op, {**default_strategy(op), **strategy})
        assert_matches_reference(family, candidate.entry(gate, up), (gate, up), {})


def test_rope_layouts_broadcast_cos_partial_rotary_and_float32_cos(load_rendered):
    family = get_op("rope")
    candidate = load_rendered("rope")
    gen = torch.Generator().manual_seed(0)
    b, s, hq, hk, d = 2, 5, 8, 2, 32
    # [B, S, H, D] memory viewed as [B, H, S, D], as attention modules do.
    q = torch.randn(b, s, hq, d, generator=gen, dtype=torch.float16).transpose(1, 2)
    k = torch.randn(b, s, hk, d, generator=gen, dtype=torch.float16).transpose(1, 2)
    cos = torch.randn(1, s, d, generator=gen).to(torch.float16)  # random, halves not duplicated
    sin = torch.randn(1, s, d, generator=gen).to(torch.float16)
    out = candidate.entry(q, k, cos, sin)
    assert out[0].stride() == q.stride()
    assert_matches_reference(family, out, (q, k, cos, sin), {})
    # OLMo2 passes float32 cos/sin with 16-bit q/k; Phi-3 may rotate only part of the head.
    assert_matches_reference(
        family,
        candidate.entry(q, k, cos.float(), sin.float()),
        (q, k, cos.float(), sin.float()),
        {},
        dtype=torch.float16,
    )
    part = (q, k, cos[..., :16].contiguous(), sin[..., :16].contiguous())
    assert_matches_reference(family, candidate.entry(*part), part, {})
    for strategy in (
        {"HEAD_BLOCK": 2},
        {"MAX_PROGRAMS": 3, "NUM_WARPS": 2},
        {"FLAT_ROWS": 16},
        {"FLAT_ROWS": 32, "NUM_WARPS": 2},
        {"TOKENS_PER_PROGRAM": 2},
        {"TOKENS_PER_PROGRAM": 4},
        {"TOKENS_PER_PROGRAM": 4, "HEAD_BLOCK": 2},
        {"TOKENS_PER_PROGRAM": 8, "NUM_WARPS": 1},
        {"TOKENS_PER_PROGRAM": 2, "MAX_PROGRAMS": 2},
    ):
        other = load_rendered("rope", {**default_strategy("rope"), **strategy})
        assert_matches_reference(family, other.entry(q, k, cos, sin), (q, k, cos, sin), {})
        assert_matches_reference(family, other.entry(*part), part, {})
        qc, kc = q.contiguous(), k.contiguous()  # head-major memory works too
        assert_matches_reference(family, other.entry(qc, kc, cos, sin), (qc, kc, cos, sin), {})


def test_rope_keeps_the_gapped_layout_of_fused_projection_slices(load_rendered):
    """q and k sliced from a fused q/k/v output at batch > 1 are not dense: the outputs keep their
    strides (no copy to a dense layout before the kernel) and the values are the reference's."""
    family = get_op("rope")
    gen = torch.Generator().manual_seed(1)
    b, s, hq, hk, d = 3, 1, 4, 2, 16
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, generator=gen, dtype=torch.float16)
    q = qkv[..., : hq * d].view(b, s, hq, d).transpose(1, 2)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d).transpose(1, 2)
    cos = torch.randn(1, s, d, generator=gen).to(torch.float16)
    sin = torch.randn(1, s, d, generator=gen).to(torch.float16)
    for strategy in ({}, {"FLAT_ROWS": 16}, {"TOKENS_PER_PROGRAM": 4, "HEAD_BLOCK": 2}):
        candidate = load_rendered("rope", {**default_strategy("rope"), **strategy})
        q_out, k_out = candidate.entry(q, k, cos, sin)
        assert (q_out.stride(), k_out.stride()) == (q.stride(), k.stride())
        assert_matches_reference(family, (q_out, k_out), (q, k, cos, sin), {})
    # An overlapping view (a head broadcast by expand) is read, never mirrored as an output layout.
    k_wide = k[:, :1].expand(b, hk, s, d)
    q_out, k_out = load_rendered("rope").entry(q, k_wide, cos, sin)
    assert k_out.stride() == k_wide.contiguous().stride()
    assert_matches_reference(family, (q_out, k_out), (q, k_wide, cos, sin), {})


def test_add_rms_norm_returns_normed_and_new_residual(load_rendered):
    family, (x, residual), params = case("add_rms_norm", (4, 3), 64, torch.float16)
    normed, new_residual = load_rendered("add_rms_norm").entry(x, residual, **params)
    torch.testing.assert_close(new_residual, x + residual, atol=0, rtol=0)  # the decoder's rounding
    assert_matches_reference(family, (normed, new_residual), (x, residual), params)


@pytest.mark.parametrize("op", FAMILIES)
def test_every_strategy_space_point_renders_a_correct_kernel(op, load_rendered):
    rows, hidden = ((1, 4, 3), 32) if op == "rope" else ((5,), 160)
    for i, point in enumerate(STRATEGY_SPACES[op]):
        candidate = load_rendered(op, point)
        family, acts, params = case(op, rows, hidden, torch.float16, seed=i)
        assert_matches_reference(family, candidate.entry(*acts, **params), acts, params)


@pytest.mark.parametrize("op", FAMILIES)
def test_template_passes_the_verifier(op, tmp_path):
    """The trust anchor's own shapes (hidden from the author: non-power-of-2 H, one row, many rows,
    3-D), float32 and float16, five seeds and four input scales each."""
    from gpuyantra import verifier

    path = tmp_path / f"{op}.py"
    path.write_text(template_source(op))
    verdict = verifier.verify(path, device="cpu")
    assert verdict.accepted, [f"{f.layer}/{f.rule}: {f.message}" for f in verdict.failures]
    assert verdict.reward >= 1
    assert len(verdict.shapes) >= 3 and set(verdict.dtypes) >= {"float32", "float16"}


# One point per knob added for the large-shape bandwidth work (issue 4), each through the whole
# verifier (its hidden shapes, float32 and float16, seeds, input scales).
NEW_KNOB_POINTS = [
    ("layer_norm", {"SHIFTED_STATS": True, "RELOAD_AFFINE": True, "ROWS_PER_PROGRAM": 2}),
    ("layer_norm", {"RELOAD_AFFINE": True, "MAX_PROGRAMS": 3}),
    ("rope", {"TOKENS_PER_PROGRAM": 4}),
    ("rope", {"TOKENS_PER_PROGRAM": 2, "HEAD_BLOCK": 2, "MAX_PROGRAMS": 3}),
    ("rms_norm", {"ROWS_PER_PROGRAM": 2, "NUM_WARPS": 8, "MAX_PROGRAMS": 3}),
    ("softmax", {"ROWS_PER_PROGRAM": 4, "NUM_WARPS": 8, "MAX_PROGRAMS": 3}),
]


@pytest.mark.parametrize("op,point", NEW_KNOB_POINTS, ids=[f"{op}-{i}" for i, (op, _) in enumerate(NEW_KNOB_POINTS)])
def test_new_strategy_points_pass_the_verifier(op, point, tmp_path):
    from gpuyantra import verifier
    from gpuyantra.authors.template import render

    family = get_op(op)
    adapter = family.default_adapter(import_class(family.default_module)) if family.params else []
    path = tmp_path / f"{op}.py"
    path.write_text(render(op, {**default_strategy(op), **point}, adapter))
    verdict = verifier.verify(path, device="cpu")
    assert verdict.accepted, [f"{f.layer}/{f.rule}: {f.message}" for f in verdict.failures]
    assert set(verdict.dtypes) >= {"float32", "float16"}


@pytest.mark.parametrize("cos_dtype", [None, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_rounds_as_eager_bit_for_bit(dtype, cos_dtype, load_rendered):
    """A served model's greedy output must not change: the template's outputs equal eager's
    `q * cos + rotate_half(q) * sin` bit for bit (each product and sum rounded in the 16-bit dtype,
    or in float32 when cos/sin come in float32), in both of its modes."""
    family = get_op("rope")
    gen = torch.Generator().manual_seed(3)
    b, s, hq, hk, d = 2, 7, 4, 2, 64
    q = torch.randn(b, s, hq, d, generator=gen).to(dtype).transpose(1, 2)
    k = torch.randn(b, s, hk, d, generator=gen).to(dtype).transpose(1, 2)
    cos = torch.randn(1, s, d, generator=gen).to(cos_dtype or dtype)
    sin = torch.randn(1, s, d, generator=gen).to(cos_dtype or dtype)
    want = family.reference(q, k, cos, sin)
    for strategy in ({}, {"FLAT_ROWS": 16}, {"HEAD_BLOCK": 2}):
        candidate = load_rendered("rope", {**default_strategy("rope"), **strategy})
        got = candidate.entry(q, k, cos, sin)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            assert torch.equal(g, w), f"{strategy}: {(g.float() - w.float()).abs().max()} off eager"
