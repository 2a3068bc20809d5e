"""The `linear` family (y = x Wᵀ + b) and its template kernel, in Triton's interpreter: the family's
table (reference, binding, bias None, live parameter shapes, cost, case fitting, tolerance and the
accumulation bound), the GEMV / 16-row tile / big-tile regimes at their row boundaries with and
without split-K on odd shapes, 3-D and row-strided x, and the author's start and search per regime."""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from gpuyantra.authors import template_space
from gpuyantra.authors.base import Attempt, WriteRequest
from gpuyantra.authors.template import (
    KNOBS,
    STRATEGY_SPACES,
    canonical,
    default_strategy,
    initial_strategy,
    linear_split,
    plan_strategy,
)
from gpuyantra.authors.template_space import LINEAR_REGIME_KNOBS, linear_regime
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
        # big tiles from 2 rows (no small-row regime)
        {"GEMV_MAX_ROWS": 1, "SMALL_MAX_ROWS": 1, "BLOCK_M": 16, "MM_BLOCK_N": 32, "MM_BLOCK_K": 32, "GROUP_M": 2},
        {"GEMV_MAX_ROWS": 1, "SMALL_MAX_ROWS": 1, "BLOCK_M": 16, "MM_BLOCK_N": 16, "MM_BLOCK_K": 32, "MM_SPLIT_K": 3},
        {"GEMV_MAX_ROWS": 1, "SMALL_MAX_ROWS": 1, "BLOCK_M": 16, "MM_BLOCK_K": 32, "MM_SPLIT_K": 0},  # auto split
        {"GEMV_MAX_ROWS": 1, "SMALL_BLOCK_N": 16, "SMALL_BLOCK_K": 32, "SMALL_SPLIT_K": 3},  # 16-row tiles from 2 rows
        {"GEMV_MAX_ROWS": 1, "SMALL_MAX_ROWS": 8, "SMALL_BLOCK_N": 16, "SMALL_BLOCK_K": 32},  # 14 rows: big tiles
        {"GEMV_MAX_ROWS": 1, "SMALL_MAX_ROWS": 32, "SMALL_BLOCK_N": 32, "SMALL_BLOCK_K": 64},  # grouped row tiles
        {"GEMV_MAX_ROWS": 16, "DEFER_REDUCE": False, "BLOCK_K": 64},  # per-step reduction, 14 rows
        {"GEMV_MAX_ROWS": 1, "SMALL_SWAP_AB": True, "SMALL_BLOCK_N": 32, "SMALL_BLOCK_K": 32, "SMALL_SPLIT_K": 1},
        {"GEMV_MAX_ROWS": 1, "SMALL_SWAP_AB": True, "SMALL_BLOCK_N": 16, "SMALL_BLOCK_K": 32, "SMALL_SPLIT_K": 3},
        {"GEMV_MAX_ROWS": 1, "SMALL_MAX_ROWS": 32, "SMALL_SWAP_AB": True, "SMALL_BLOCK_N": 64, "SMALL_BLOCK_K": 64},
    ],
    ids=[
        "split3",
        "auto-split",
        "defer",
        "row-tiles",
        "matmul",
        "matmul-split3",
        "matmul-auto-split",
        "small-split3",
        "small-bound-8",
        "small-bound-32",
        "per-step-sum",
        "swapped",
        "swapped-split3",
        "swapped-row-tiles",
    ],
)
def test_template_knobs(strategy, load_rendered):
    entry = load_rendered("linear", {**default_strategy("linear"), **strategy}).entry
    for dtype in DTYPES:
        for shape, n in (((5, 301), 37), ((1, 1), 7), ((2, 7, 130), 9)):
            for bias in (True, False):
                x, weight, b = inputs(shape, n, dtype, bias)
                within_bound(entry(x, weight=weight, bias=b), x, weight, b)


@pytest.mark.parametrize(
    "strategy",
    [
        {"BLOCK_N": 4, "BLOCK_K": 32},  # ragged K: the last step masked
        {"BLOCK_N": 8, "BLOCK_K": 32, "SPLIT_K": 3},  # slices: the last one shorter
        {"BLOCK_N": 4, "BLOCK_K": 64, "GEMV_ROWS": 2},  # row tiles: the last one past M
        {"BLOCK_N": 16, "BLOCK_K": 32, "W_EVICTION": "evict_first", "SPLIT_K": 0, "TARGET_PROGRAMS": 32},
    ],
    ids=["ragged-k", "split3", "row-tiles", "auto-split"],
)
def test_the_unrolled_gemv_runs_where_it_applies_and_agrees_with_the_looped_one(strategy, load_rendered, monkeypatch):
    """1-4 rows, odd N and K, with and without bias: the unrolled kernel is the one launched, within
    the accumulation bound, and its sums equal the looped kernel's to float32 rounding."""
    point = {**default_strategy("linear"), **strategy, "GEMV_UNROLL": True, "GEMV_UNROLL_ROWS": 4}
    unrolled = load_rendered("linear", point).module
    looped = load_rendered("linear", {**default_strategy("linear"), **strategy, "GEMV_UNROLL": False}).module
    launched: list = []
    real = unrolled._gemv_unrolled
    monkeypatch.setattr(unrolled, "_gemv_unrolled", _Counting(real, launched))
    for rows in (1, 2, 3, 4):
        for bias in (True, False):
            x, weight, b = inputs((rows, 301), 37, torch.float16, bias, seed=rows)
            got = unrolled.entry(x, weight=weight, bias=b)
            within_bound(got, x, weight, b)
            want = looped.entry(x, weight=weight, bias=b)
            assert torch.allclose(got.float(), want.float(), rtol=2e-3, atol=2e-3)
    assert len(launched) == 8


def test_by_default_one_row_runs_unrolled_and_more_rows_looped(load_rendered, monkeypatch):
    """The unrolled GEMV's per-row sums cost registers: on an H200 it lost to cuBLAS at 4 rows on the
    large projections, so by default only a single row takes it (the decode step at batch 1)."""
    module = load_rendered("linear", start_point(17920, 1536, [[1, 1536]])).module
    calls: list = []
    for kernel in ("_gemv", "_gemv_unrolled"):
        monkeypatch.setattr(module, kernel, LaunchSpy(kernel, calls))
    weight = torch.empty((17920, 1536), dtype=torch.float16)
    for rows in (1, 2, 4):
        module.entry(torch.empty((rows, 1536), dtype=torch.float16), weight=weight, bias=None)
    assert [c[0] for c in calls] == ["_gemv_unrolled", "_gemv", "_gemv"]


class _Counting:
    """A Triton kernel that records each launch and runs it."""

    def __init__(self, kernel, launches: list) -> None:
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        self.launches.append(grid)
        return self.kernel[grid]


# The regime boundaries at the template's row bounds: GEMV up to 4 rows, 16-row tiles up to 16, big tiles after.
BOUNDARY_ROWS = (1, 4, 5, 8, 16, 17, 54)
# Small tiles and automatic splits everywhere: a long K is split in every regime, the last slice ragged.
SPLITTING = {
    "BLOCK_N": 16,
    "BLOCK_K": 32,
    "SPLIT_K": 0,
    "TARGET_PROGRAMS": 64,
    "SMALL_BLOCK_N": 16,
    "SMALL_BLOCK_K": 32,
    "SMALL_SPLIT_K": 0,
    "BLOCK_M": 32,
    "MM_BLOCK_N": 16,
    "MM_BLOCK_K": 32,
    "MM_SPLIT_K": 0,
}
# (K, N): a long K that splits (N 37 is no tile multiple), and a short one that does not.
BOUNDARY_SIZES = ((1100, 37), (96, 45))


def start_point(n: int, k: int, shapes: list[list[int]], hardware: str = "NVIDIA H200") -> dict:
    request = WriteRequest(
        op="linear",
        module_class="Linear",
        adapter=[],
        shapes=shapes,
        dtype="bfloat16",
        hardware=hardware,
        param_shapes={"weight": [n, k], "bias": None},
    )
    return initial_strategy(request)


def test_the_splitting_point_splits_a_long_k_in_every_regime():
    point = {**default_strategy("linear"), **SPLITTING}
    regimes = {linear_regime(point, rows) for rows in BOUNDARY_ROWS}
    assert regimes == {"gemv", "small", "big"}
    for rows in BOUNDARY_ROWS:
        assert linear_split(point, 37, 1100, rows) > 1, rows
        assert linear_split(point, 45, 96, rows) == 1, rows


@pytest.mark.parametrize("rows", BOUNDARY_ROWS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16"])
def test_every_regime_boundary_matches_float64(rows, dtype, load_rendered):
    """The splitting point and the GPU start point, at each boundary row count, against F.linear in
    float64 within the float32-accumulation bound."""
    gpu_start = start_point(37, 1100, [[8, 1, 1100], [1, 54, 1100]])
    for strategy in ({**default_strategy("linear"), **SPLITTING}, gpu_start):
        entry = load_rendered("linear", strategy).entry
        for k, n in BOUNDARY_SIZES:
            for bias in (True, False):
                x, weight, b = inputs((rows, k), n, dtype, bias, seed=rows)
                within_bound(entry(x, weight=weight, bias=b), x, weight, b)


def test_two_row_tiles_of_the_small_regime_cover_17_to_32_rows(load_rendered):
    point = {**default_strategy("linear"), **SPLITTING, "SMALL_MAX_ROWS": 32}
    entry = load_rendered("linear", point).entry
    for rows in (17, 32):
        assert linear_regime(point, rows) == "small"
        for dtype in DTYPES:
            x, weight, b = inputs((rows, 1100), 37, dtype, seed=rows)
            within_bound(entry(x, weight=weight, bias=b), x, weight, b)


class LaunchSpy:
    """Stands in for a Triton kernel: records `kernel[grid](..., **constexprs)` and runs nothing."""

    def __init__(self, name: str, calls: list) -> None:
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.name, tuple(grid), kwargs))


SHARED_LINEAR_KNOBS = {"GEMV_MAX_ROWS", "SMALL_MAX_ROWS", "TARGET_PROGRAMS"}
CAMPAIGN_SHAPES = {"qkv": (2048, 1536), "down": (1536, 8960), "gate_up": (17920, 1536)}


REGIME_KERNELS = {"gemv": ("_gemv", "_gemv_unrolled"), "small": ("_matmul", "_matmul_swapped"), "big": ("_matmul",)}


@pytest.mark.parametrize("strategy_name", ["default", "splitting", "gpu_start"])
def test_the_author_mirrors_the_regime_and_split_the_template_launches(strategy_name, load_rendered, monkeypatch):
    """What the author's canonical form and start assume (regime, tile rows, K slices) is what the
    template launches, for each campaign shape at each boundary row count."""
    for name, (n, k) in CAMPAIGN_SHAPES.items():
        strategy = {
            "default": default_strategy("linear"),
            "splitting": {**default_strategy("linear"), **SPLITTING},
            "gpu_start": start_point(n, k, [[8, 1, k], [1, 54, k]]),
        }[strategy_name]
        module = load_rendered("linear", strategy).module
        calls: list = []
        for kernel in ("_gemv", "_gemv_unrolled", "_matmul", "_matmul_swapped", "_splitk_reduce"):
            monkeypatch.setattr(module, kernel, LaunchSpy(kernel, calls))
        weight = torch.empty((n, k), dtype=torch.float16)
        for rows in BOUNDARY_ROWS:
            calls.clear()
            module.entry(torch.empty((rows, k), dtype=torch.float16), weight=weight, bias=None)
            kernel, grid, constexprs = calls[0]
            regime = linear_regime(strategy, rows)
            split = linear_split(strategy, n, k, rows)
            assert kernel in REGIME_KERNELS[regime], (name, rows)
            assert grid[1] == constexprs["SPLIT"] == split, (name, rows)
            assert [c[0] for c in calls[1:]] == (["_splitk_reduce"] if split > 1 else []), (name, rows)
            if regime != "gemv":
                assert constexprs["BLOCK_M"] == (16 if regime == "small" else strategy["BLOCK_M"]), (name, rows)


def test_every_knob_belongs_to_one_regime_and_the_mirrored_constants_agree(load_rendered):
    defaults = default_strategy("linear")
    per_regime = [knob for knobs in LINEAR_REGIME_KNOBS.values() for knob in knobs]
    assert len(per_regime) == len(set(per_regime))
    assert set(per_regime) | SHARED_LINEAR_KNOBS == set(defaults) == set(KNOBS["linear"])
    module = load_rendered("linear").module
    assert module.SMALL_BLOCK_M == template_space.LINEAR_SMALL_BLOCK_M
    assert module.GEMV_MIN_SLICE_STEPS == template_space.LINEAR_GEMV_MIN_SLICE_STEPS
    assert module.MATMUL_MIN_SLICE_STEPS == template_space.LINEAR_MATMUL_MIN_SLICE_STEPS
    assert module.MAX_SLICES == template_space.LINEAR_MAX_SLICES


def test_batch_8_decode_fills_the_gpu_from_a_start_that_also_saw_prefill(load_rendered, monkeypatch):
    """The verifier's [8, 1, K] and [1, 54, K] shapes: batch-8 decode gets 16-row tiles (q/k/v: 128
    programs, not the prefill tile's 16), down_proj's long K is split, prefill keeps 64-row tiles."""
    programs = {}
    for name, (n, k) in CAMPAIGN_SHAPES.items():
        module = load_rendered("linear", start_point(n, k, [[8, 1, k], [1, 54, k]])).module
        calls: list = []
        for kernel in ("_gemv", "_matmul", "_matmul_swapped", "_splitk_reduce"):
            monkeypatch.setattr(module, kernel, LaunchSpy(kernel, calls))
        module.entry(torch.empty((8, 1, k), dtype=torch.float16), weight=torch.empty((n, k)), bias=None)
        grid, constexprs = calls[0][1], calls[0][2]
        assert constexprs["BLOCK_M"] == 16, name
        programs[name] = (grid[0] * grid[1], grid[1])
    assert programs["qkv"] == (128, 1)  # N 2048 / 16 features, K 1536 unsplit (as measured on an H200)
    assert programs["down"] == (96, 4)  # 24 tiles, K split in 4 (slices of at least 8 steps): the best measured
    assert programs["gate_up"] == (280, 1)  # N 17920 / 64 features


def test_start_fills_every_regime_from_all_the_shapes():
    mixed = start_point(2048, 1536, [[8, 1, 1536], [1, 54, 1536]])
    assert [linear_regime(mixed, rows) for rows in (1, 8, 54)] == ["gemv", "small", "big"]
    assert (mixed["SMALL_BLOCK_N"], mixed["SMALL_BLOCK_K"], mixed["SMALL_SPLIT_K"]) == (16, 128, 0)
    assert (mixed["BLOCK_M"], mixed["MM_BLOCK_N"]) == (64, 64)  # the best 54-row point measured
    assert mixed["BLOCK_N"] == 4  # batch-1 decode keeps its GEMV start
    # Each regime's start is the same whichever other regimes' shapes came along.
    for regime in ("gemv", "small"):
        alone = start_point(2048, 1536, [[1, 1536]] if regime == "gemv" else [[8, 1, 1536]])
        assert {knob: mixed[knob] for knob in LINEAR_REGIME_KNOBS[regime]} == {
            knob: alone[knob] for knob in LINEAR_REGIME_KNOBS[regime]
        }
    long_prefill = start_point(2048, 1536, [[8, 1, 1536], [1, 600, 1536]])
    assert (long_prefill["BLOCK_M"], long_prefill["MM_BLOCK_N"]) == (128, 128)
    wide = start_point(17920, 1536, [[8, 1, 1536]])  # wide N: the transposed tile over 64 features
    assert (wide["SMALL_SWAP_AB"], wide["SMALL_BLOCK_N"], wide["SMALL_BLOCK_K"]) == (True, 64, 128)
    down = start_point(1536, 8960, [[8, 1, 8960]])  # a long K over few features: transposed, K 256
    assert (down["SMALL_SWAP_AB"], down["SMALL_BLOCK_N"], down["SMALL_BLOCK_K"], down["SMALL_STAGES"]) == (
        True,
        64,
        256,
        4,
    )
    assert not mixed["SMALL_SWAP_AB"]  # q/k/v: the untransposed 16-feature tile
    cpu = start_point(2048, 1536, [[8, 1, 1536]], hardware="cpu")
    assert cpu["SMALL_SPLIT_K"] == 1 and cpu["SMALL_BLOCK_N"] >= 64  # few wide programs in the interpreter


def test_canonical_keeps_only_the_knobs_of_the_regimes_the_shapes_run():
    point = {**default_strategy("linear"), "SMALL_SPLIT_K": 1}
    decode8 = [[8, 1, 1536]]
    same = [{"BLOCK_N": 64}, {"SPLIT_K": 4}, {"BLOCK_M": 16}, {"NUM_STAGES": 5}, {"TARGET_PROGRAMS": 528}]
    for change in same:  # GEMV, big-tile and (with an explicit split) auto-split knobs: twins at 8 rows
        assert canonical("linear", point, decode8, 2048) == canonical("linear", {**point, **change}, decode8, 2048)
    for change in ({"SMALL_BLOCK_N": 64}, {"SMALL_STAGES": 3}, {"SMALL_SPLIT_K": 2}, {"GEMV_MAX_ROWS": 8}):
        assert canonical("linear", point, decode8, 2048) != canonical("linear", {**point, **change}, decode8, 2048)
    mixed = [[8, 1, 1536], [1, 54, 1536]]
    assert canonical("linear", point, mixed, 2048) != canonical("linear", {**point, "BLOCK_M": 16}, mixed, 2048)
    assert canonical("linear", point, mixed, 2048) == canonical("linear", {**point, "BLOCK_N": 64}, mixed, 2048)


def made_up_us(strategy: dict) -> float:
    """A deterministic cost per knob value; batch-8 decode on the GEMV is slower (as measured on an H200)."""
    noise = sum(zlib.crc32(f"{knob}={value}".encode()) % 7 for knob, value in strategy.items())
    return 10.0 + 0.05 * noise + (3.0 if linear_regime(strategy, 8) == "gemv" else 0.0)


def test_the_search_moves_the_knobs_of_the_regimes_the_shapes_run():
    """Verified at batch-8 decode and prefill: every neighbour move changes a knob of a regime those
    shapes run (or a row bound, or the auto-split target), never one of a regime they do not run."""
    shapes = [[8, 1, 1536], [1, 54, 1536]]
    history: list[Attempt] = []
    moved = set()
    for i in range(16):
        request = WriteRequest(
            op="linear",
            module_class="Linear",
            adapter=[],
            shapes=shapes,
            dtype="bfloat16",
            hardware="NVIDIA H200",
            history=list(history),
            param_shapes={"weight": [2048, 1536], "bias": None},
        )
        plan = plan_strategy(request)
        if i == 0:
            assert plan.strategy == initial_strategy(request)
        if plan.converged:
            break
        if plan.reason.startswith("neighbour"):
            best = min(history, key=lambda a: a.kernel_us or 0).strategy
            changed = {knob for knob in plan.strategy if plan.strategy[knob] != best[knob]}
            run = {linear_regime(strategy, rows) for strategy in (best, plan.strategy) for rows in (8, 54)}
            allowed = {knob for regime in run for knob in LINEAR_REGIME_KNOBS[regime]} | SHARED_LINEAR_KNOBS
            assert len(changed) == 1 and changed <= allowed, plan.reason
            moved |= changed
        history.append(Attempt(plan.strategy, 3, kernel_us=made_up_us(plan.strategy), floor_us=1.6))
    assert moved & set(LINEAR_REGIME_KNOBS["small"]) and moved & set(LINEAR_REGIME_KNOBS["big"])


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
        return start_point(n, k, [[rows, k]], hardware)

    lm_head, down, qkv = first(151936, 1536), first(1536, 8960), first(2048, 1536)
    assert linear_split(lm_head, 151936, 1536) == 1  # thousands of programs without a split
    # down_proj: 2 features a program fill the GPU (768 programs) without splitting its long K
    assert linear_split(down, 1536, 8960) == 1 and -(-1536 // down["BLOCK_N"]) >= 264
    assert qkv["BLOCK_N"] > lm_head["BLOCK_N"] and all(s["GEMV_UNROLL"] for s in (lm_head, down, qkv))
    assert all(s["GEMV_WARPS"] == s["BLOCK_N"] for s in (lm_head, down, qkv))  # a warp per feature
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
