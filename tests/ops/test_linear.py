"""The `linear` family (y = x Wᵀ + b) and its template kernel, in Triton's interpreter: the family's
table (reference, binding, bias None, live parameter shapes, cost, case fitting, tolerance and the
accumulation bound) and the GEMV / split-K / matmul paths on odd shapes, 3-D and row-strided x."""

from __future__ import annotations

import math

import pytest
import torch

from gpuyantra.authors.base import WriteRequest
from gpuyantra.authors.template import STRATEGY_SPACES, canonical, default_strategy, initial_strategy, linear_split
from gpuyantra.binding import computes_family, find_module_groups
from gpuyantra.ops import get_op
from gpuyantra.ops.base import import_class
from gpuyantra.ops.meta import meta_instance

FAMILY = get_op("linear")
DTYPES = [torch.float32, torch.float16]


def within_bound(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """`out` is the float64 reference within tolerance plus the float32-accumulation bound."""
    params = {"weight": weight, "bias": bias}
    want = FAMILY.reference(x.double(), weight=weight.double(), bias=None if bias is None else bias.double())
    assert out.dtype == x.dtype and out.shape == (*x.shape[:-1], weight.shape[0])
    atol, rtol = FAMILY.tolerance(out.dtype)
    allowed = atol + rtol * want.abs() + FAMILY.error_bound((x,), params, out.dtype)
    err = (out.double() - want).abs()
    assert bool((err <= allowed).all()), f"max err {float(err.max()):.3g}, allowed there {float(allowed.min()):.3g}"


def inputs(shape, n, dtype, bias=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to(dtype)
    weight = (torch.randn(n, shape[-1], generator=gen) * 0.5 + 0.3).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    return x, weight, b


# ------------------------------------------------------------------------------------- the family


def test_signature_default_module_and_adapter():
    assert FAMILY.activations == ("x",)
    assert [(p.name, p.kind) for p in FAMILY.params] == [("weight", "tensor"), ("bias", "optional_tensor")]
    cls = import_class(FAMILY.default_module)
    assert cls is torch.nn.Linear and meta_instance(cls) is not None
    assert FAMILY.default_adapter(cls) == [
        {"kernel_param": "weight", "module_attr": "weight"},
        {"kernel_param": "bias", "module_attr": "bias"},
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_reference_is_nn_linear_with_float32_accumulation(dtype, bias):
    module = torch.nn.Linear(96, 37, bias=bias).to(dtype)
    x = torch.randn(2, 3, 96).to(dtype)
    want = FAMILY.reference(x, weight=module.weight, bias=module.bias)
    assert want.dtype == dtype
    atol, rtol = FAMILY.tolerance(dtype)
    torch.testing.assert_close(module(x), want, atol=2 * atol, rtol=2 * rtol)


def test_binding_checks_the_math_and_takes_a_missing_bias_as_none():
    with_bias, without = torch.nn.Linear(64, 48), torch.nn.Linear(64, 48, bias=False)
    adapter = FAMILY.default_adapter(torch.nn.Linear)
    assert computes_family(with_bias, FAMILY) == adapter
    assert computes_family(without, FAMILY) == adapter  # bias is None there: the kernel gets None

    class Transposed(torch.nn.Linear):  # same attributes, other math (GPT-2 Conv1D-like)
        def forward(self, x):
            return x @ self.weight + self.bias

    assert computes_family(Transposed(32, 32), FAMILY) is None
    assert computes_family(torch.nn.LayerNorm(32), FAMILY) is None  # 1-D weight: no probe at all


def test_groups_split_by_live_weight_shape():
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 24), torch.nn.Linear(24, 24, bias=False), torch.nn.Linear(24, 24, bias=False)
    )
    groups = {g.variant: g for g in find_module_groups(model, ["linear"])}
    assert set(groups) == {"weight=24x16,bias=24", "weight=24x24,bias=none"}
    assert groups["weight=24x24,bias=none"].names == ["1", "2"]
    assert groups["weight=24x24,bias=none"].param_shapes == {"weight": [24, 24], "bias": None}
    assert groups["weight=24x16,bias=24"].key.endswith("Linear[weight=24x16,bias=24]")


def test_cost_counts_the_live_weight_once():
    live = {"weight": [2048, 1536], "bias": [2048]}
    nbytes, flops = FAMILY.cost([1, 1536], torch.bfloat16, live)
    assert nbytes == (1536 + 2048 * 1536 + 2048 + 2048) * 2
    assert flops == 2 * 1536 * 2048
    no_bias, _ = FAMILY.cost([1, 1536], torch.bfloat16, {"weight": [2048, 1536], "bias": None})
    assert no_bias == nbytes - 2048 * 2
    assert FAMILY.bytes_moved([4, 64], torch.float32) == (4 * 64 + 64 * 64 + 4 * 64 + 64) * 4  # default N = K


def test_fit_params_keeps_real_decode_shapes_on_cuda_and_shrinks_odd_on_cpu():
    lm_head = {"weight": [151936, 1536], "bias": None}
    assert FAMILY.fit_params([1, 1536], lm_head, "cuda") == lm_head
    fitted = FAMILY.fit_params([1, 1536], {"weight": [2048, 1536], "bias": [2048]}, "cpu")
    n = fitted["weight"][0]
    assert n < 2048 and n % 2 == 1 and fitted["weight"][1] == 1536 and fitted["bias"] == [n]
    wide = FAMILY.fit_params([70001, 96], {"weight": [151936, 96], "bias": None}, "cuda")
    assert 70001 * wide["weight"][0] <= 1 << 24


def test_tolerance_is_two_output_roundings_and_the_bound_grows_with_sqrt_k():
    for dtype, bits in ((torch.float16, 11), (torch.bfloat16, 8)):
        assert FAMILY.tolerance(dtype)[1] == pytest.approx(2 * 2.0**-bits, rel=0.03)
    bound = [
        float(FAMILY.error_bound((x,), {"weight": torch.ones(3, x.shape[1]), "bias": None}, torch.float16)[0, 0])
        for x in (torch.ones(1, 100), torch.ones(1, 400))
    ]
    # sum |x w| grows like K, the Azuma factor like sqrt(K): 4x K is 8x the bound.
    assert bound[1] / bound[0] == pytest.approx(8 * math.sqrt(402 / 400) / math.sqrt(102 / 100), rel=1e-6)
    assert bound[0] == pytest.approx(8 * math.sqrt(102) * 2.0**-24 * 100)


# --------------------------------------------------------------------------------- the template

SHAPES = [  # (x shape, N): one row, odd N and K, a few rows (GEMV tile masking), 3-D, many rows
    ((1, 1000), 1003),
    ((3, 65), 67),
    ((5, 129), 33),
    ((2, 3, 64), 40),
    ((33, 48), 51),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_template_gemv_and_matmul_paths(dtype, load_rendered):
    entry = load_rendered("linear").entry
    for i, (shape, n) in enumerate(SHAPES):
        for bias in (True, False):
            x, weight, b = inputs(shape, n, dtype, bias, seed=i)
            within_bound(entry(x, weight=weight, bias=b), x, weight, b)


@pytest.mark.parametrize(
    "strategy",
    [
        {"SPLIT_K": 3, "BLOCK_K": 32},  # split-K with a ragged last slice
        {"SPLIT_K": 0, "BLOCK_K": 32, "BLOCK_N": 16, "TARGET_PROGRAMS": 64},  # auto split
        {"DEFER_REDUCE": True, "BLOCK_N": 16, "BLOCK_K": 64},
        {"GEMV_ROWS": 2, "BLOCK_N": 32},  # several row tiles
        {"GEMV_MAX_ROWS": 1, "BLOCK_M": 16, "MM_BLOCK_N": 32, "MM_BLOCK_K": 32, "GROUP_M": 2},  # matmul from 2 rows
        {"GEMV_MAX_ROWS": 1, "BLOCK_M": 16, "MM_BLOCK_N": 16, "MM_BLOCK_K": 32, "MM_SPLIT_K": 3},
        {"GEMV_MAX_ROWS": 16, "DEFER_REDUCE": False, "BLOCK_K": 64},  # per-step reduction, 14 rows
    ],
    ids=["split3", "auto-split", "defer", "row-tiles", "matmul", "matmul-split3", "per-step-sum"],
)
def test_template_knobs(strategy, load_rendered):
    entry = load_rendered("linear", {**default_strategy("linear"), **strategy}).entry
    for dtype in DTYPES:
        for shape, n in (((5, 301), 37), ((1, 1), 7), ((2, 7, 130), 9)):
            for bias in (True, False):
                x, weight, b = inputs(shape, n, dtype, bias)
                within_bound(entry(x, weight=weight, bias=b), x, weight, b)


def test_template_takes_row_strided_and_non_contiguous_x(load_rendered):
    entry = load_rendered("linear").entry
    base = torch.randn(4, 6, 80, dtype=torch.float16)
    weight = (torch.randn(21, 72) * 0.5).to(torch.float16)
    bias = torch.randn(21, dtype=torch.float16)
    for x in (base[:, ::2, :72], base[:, :, 8:].transpose(0, 1), torch.randn(72, 5).t()):
        x = x.to(torch.float16)
        within_bound(entry(x, weight=weight, bias=bias), x, weight, bias)
        for rows in (x[:1], x.reshape(-1, 72)[:40]):  # one row and the matmul path
            within_bound(entry(rows, weight=weight, bias=bias), rows, weight, bias)


def test_template_matches_the_live_module_in_a_swap_like_call(load_rendered):
    entry = load_rendered("linear").entry
    module = torch.nn.Linear(130, 70, bias=False)
    x = torch.randn(3, 130)
    torch.testing.assert_close(entry(x, weight=module.weight, bias=module.bias), module(x), atol=1e-5, rtol=1e-5)


def test_every_strategy_space_point_renders_a_correct_kernel(load_rendered):
    for i, point in enumerate(STRATEGY_SPACES["linear"]):
        entry = load_rendered("linear", point).entry
        for shape, n in (((1, 300), 45), ((6, 96), 20)):
            x, weight, b = inputs(shape, n, torch.float16, bias=i % 2 == 0, seed=i)
            within_bound(entry(x, weight=weight, bias=b), x, weight, b)


# ----------------------------------------------------------------------------------- the author


def test_author_starts_from_the_decode_shape_and_knows_the_effective_split():
    def first(n, k, rows=1, hardware="NVIDIA H200"):
        request = WriteRequest(
            op="linear",
            module_class="Linear",
            adapter=[],
            shapes=[[rows, k]],
            dtype="bfloat16",
            hardware=hardware,
            param_shapes={"weight": [n, k], "bias": None},
        )
        return initial_strategy(request)

    lm_head, down, qkv = first(151936, 1536), first(1536, 8960), first(2048, 1536)
    assert linear_split(lm_head, 151936, 1536) == 1  # thousands of programs without a split
    assert linear_split(down, 1536, 8960) > 1  # 48 output tiles: K is split to fill the GPU
    assert qkv["BLOCK_N"] < lm_head["BLOCK_N"]
    assert first(2048, 1536, rows=512)["BLOCK_M"] == 128
    assert first(2048, 1536, hardware="cpu")["SPLIT_K"] == 1  # few wide programs in the interpreter
    # Matmul knobs do not matter at decode: two strategies that differ only there are one point.
    point = default_strategy("linear")
    assert canonical("linear", point, [[1, 1536]], 2048) == canonical(
        "linear", {**point, "BLOCK_M": 16}, [[1, 1536]], 2048
    )
    assert canonical("linear", point, [[64, 1536]], 2048) != canonical(
        "linear", {**point, "BLOCK_M": 16}, [[64, 1536]], 2048
    )
