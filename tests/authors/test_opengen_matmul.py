"""The open author's matmul kernels: KernelBench-like matrix products (square, rectangular, batched,
transposed operands, matrix-vector, 3-D and 4-D tensors times a matrix, diagonal and triangular
forms) and Linear/Gemm modules followed by elementwise epilogues and row reductions, each written,
checked statically and run in Triton's interpreter against the module's float64 forward at the
example shapes and at other sizes (size 1 and odd ones included); the tile, GEMV and split-K paths;
strategy knobs; grouped transposed convolutions still refused."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpuyantra.authors.opengen import Unsupported, strategy_space, write_open_source
from gpuyantra.verifier.static import check_source
from tests.authors.test_opengen import (
    Case,
    Model,
    _assert_close,
    _auto_spec,
    _draw,
    _kwargs,
    _load,
    _normal,
    _randomize,
)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SPLIT = {"MM_SPLIT_K": 2}  # two K slices: partial sums, then the epilogue launch
NO_GEMV = {"GEMV_MAX": 0}  # even one column takes the tl.dot path


# --------------------------------------------------------------------------------------------- modules


class GemmEpilogue(nn.Module):
    """Linear, then a float multiplier and LeakyReLU (a Gemm_Multiply_LeakyReLU)."""

    def __init__(self, features_in: int, features_out: int):
        super().__init__()
        self.gemm = nn.Linear(features_in, features_out)
        self.multiplier = 2.0
        self.leaky_relu = nn.LeakyReLU(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.leaky_relu(self.gemm(x) * self.multiplier)


class MatmulBiasSwish(nn.Module):
    """x @ W.T with a separate bias parameter of shape [N], swish, a residual of itself, a clamp."""

    def __init__(self, features_in: int, features_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features_out, features_in) / features_in**0.5)
        self.bias = nn.Parameter(torch.randn(features_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.weight.T) + self.bias
        y = y * torch.sigmoid(y)
        return torch.clamp(y + y.clone().detach() * 0.5, -1.0, 1.0)


class GemmScaleBatchNorm(nn.Module):
    def __init__(self, features_in: int, features_out: int):
        super().__init__()
        self.gemm = nn.Linear(features_in, features_out)
        self.scale = nn.Parameter(torch.randn(features_out))
        self.bn = nn.BatchNorm1d(features_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.gemm(x) * self.scale)


class GemmGroupNormHardtanh(nn.Module):
    def __init__(self, features_in: int, features_out: int, groups: int):
        super().__init__()
        self.gemm = nn.Linear(features_in, features_out)
        self.group_norm = nn.GroupNorm(groups, features_out)
        self.hardtanh = nn.Hardtanh(-2.0, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.hardtanh(self.group_norm(self.gemm(x)))


class TwoLinearsLogSumExp(nn.Module):
    """linear -> sigmoid -> linear -> logsumexp over features (the sigmoid is the second's prologue)."""

    def __init__(self, features_in: int, hidden: int, features_out: int):
        super().__init__()
        self.linear1 = nn.Linear(features_in, hidden)
        self.linear2 = nn.Linear(hidden, features_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(self.linear2(torch.sigmoid(self.linear1(x))), dim=1)


class LinearSumScale(nn.Module):
    """matmul, divide, sum over features with keepdim, scale (a Gemm_Divide_Sum_Scaling)."""

    def __init__(self, features_in: int, features_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features_out, features_in))
        self.scaling_factor = 1.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.matmul(x, self.weight.T) / 2
        return torch.sum(x, dim=1, keepdim=True) * self.scaling_factor


class AddmmScaled(nn.Module):
    def __init__(self, features_in: int, features_out: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features_out))
        self.weight = nn.Parameter(torch.randn(features_in, features_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight, beta=0.5, alpha=2.0)


class LinearThenConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 16)
        self.conv = nn.ConvTranspose2d(2, 2, 3, groups=2)  # the one convolution the author refuses

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.linear(x).view(-1, 2, 2, 4))


# --------------------------------------------------------------------------------------------- table


def _symmetric(*shape: int) -> torch.Tensor:
    a = torch.randn(*shape)
    return (a + a.transpose(-1, -2)) / 2


def _upper(*shape: int) -> torch.Tensor:
    return torch.triu(torch.randn(*shape))


def _lower(*shape: int) -> torch.Tensor:
    return torch.tril(torch.randn(*shape))


AB = (_normal, _normal)

CASES = [
    # KernelBench level 1, matrix products
    Case(
        "square",
        lambda: Model(torch.matmul),
        [[(33, 33), (33, 33)], [(1, 1), (1, 1)], [(17, 17), (17, 17)]],
        draw=AB,
        fp16=True,
    ),
    Case(
        "rectangular",
        lambda: Model(torch.matmul),
        [[(40, 72), (72, 24)], [(1, 9), (9, 19)], [(19, 1), (1, 3)], [(5, 70), (70, 18)]],
        draw=AB,
    ),
    Case(
        "batched_bmm",
        lambda: Model(torch.bmm),
        [[(3, 20, 36), (3, 36, 18)], [(1, 7, 5), (1, 5, 9)]],
        draw=AB,
        fp16=True,
    ),
    Case("matrix_vector", lambda: Model(torch.matmul), [[(40, 300), (300, 1)], [(3, 7), (7, 1)]], draw=AB, fp16=True),
    Case("matrix_vector_1d", lambda: Model(torch.mv), [[(40, 30), (30,)], [(1, 7), (7,)]], draw=AB),
    Case("vector_dot", lambda: Model(torch.dot), [[(30,), (30,)], [(1,), (1,)]], draw=AB),
    Case("matrix_vector_dot_path", lambda: Model(torch.matmul), [[(20, 40), (40, 1)]], draw=AB, strategy=NO_GEMV),
    Case("row_vector_times_matrix", lambda: Model(torch.matmul), [[(2, 50), (50, 40)], [(1, 9), (9, 3)]], draw=AB),
    Case("matrix_scalar", lambda: Model(lambda a: a * 3.14), [[(20, 30)], [(1, 7)]]),
    Case(
        "large_k_split",
        lambda: Model(torch.matmul),
        [[(20, 300), (300, 18)], [(3, 33), (33, 5)]],
        draw=AB,
        strategy=SPLIT,
    ),
    Case("small_k", lambda: Model(torch.matmul), [[(40, 4), (4, 36)], [(9, 1), (1, 7)]], draw=AB),
    Case("tall_skinny", lambda: Model(torch.matmul), [[(70, 8), (8, 70)], [(33, 5), (5, 17)]], draw=AB),
    Case("tensor3d_matrix", lambda: Model(torch.matmul), [[(2, 20, 24), (24, 18)], [(3, 5, 7), (7, 9)]], draw=AB),
    Case(
        "tensor4d_einsum",
        lambda: Model(lambda a, b: torch.einsum("bijl,lk->bijk", a, b)),
        [[(2, 3, 6, 20), (20, 18)], [(1, 2, 5, 7), (7, 3)]],
        draw=AB,
    ),
    Case("diag_matmul", lambda: Model(lambda a, b: torch.diag(a) @ b), [[(20,), (20, 30)], [(5,), (5, 1)]], draw=AB),
    Case("matmul_diag", lambda: Model(lambda a, b: a @ torch.diag(b)), [[(30, 20), (20,)], [(1, 5), (5,)]], draw=AB),
    Case("symmetric", lambda: Model(torch.matmul), [[(33, 33), (33, 33)]], draw=(_symmetric, _symmetric)),
    Case(
        "upper_triangular",
        lambda: Model(lambda a, b: torch.triu(torch.matmul(a, b))),
        [[(33, 33), (33, 33)], [(5, 5), (5, 5)]],
        draw=(_upper, _upper),
    ),
    Case(
        "lower_triangular",
        lambda: Model(lambda a, b: torch.tril(torch.matmul(a, b))),
        [[(33, 33), (33, 33)], [(5, 5), (5, 5)]],
        draw=(_lower, _lower),
    ),
    Case(
        "transposed_a",
        lambda: Model(lambda a, b: torch.matmul(a.T, b)),
        [[(36, 20), (36, 18)], [(7, 1), (7, 5)]],
        draw=AB,
    ),
    Case(
        "transposed_b",
        lambda: Model(lambda a, b: torch.matmul(a, b.T)),
        [[(20, 36), (18, 36)], [(1, 7), (5, 7)]],
        draw=AB,
    ),
    Case(
        "transposed_both",
        lambda: Model(lambda a, b: torch.matmul(a.T, b.T)),
        [[(36, 20), (18, 36)], [(7, 3), (5, 7)]],
        draw=AB,
    ),
    Case(
        "baddbmm_prologue",
        lambda: Model(lambda c, a, b: torch.baddbmm(c, torch.relu(a), b * 2, beta=0.5)),
        [[(2, 9, 11), (2, 9, 20), (2, 20, 11)]],
        draw=(_normal, _normal, _normal),
    ),
    Case(
        "chained_matmuls",
        lambda: Model(lambda a, b, c: (a @ b) @ c),
        [[(9, 20), (20, 17), (17, 6)], [(3, 5), (5, 2), (2, 7)]],
        draw=(_normal, _normal, _normal),
    ),
    # KernelBench level 2: a Linear / Gemm, then elementwise work and row reductions
    Case("gemm_multiply_leaky_relu", lambda: GemmEpilogue(24, 20), [[(18, 24)], [(1, 24)], [(7, 24)]], fp16=True),
    Case("matmul_bias_swish_residual_clamp", lambda: MatmulBiasSwish(24, 20), [[(18, 24)], [(5, 24)]]),
    Case("linear_3d_input", lambda: nn.Linear(24, 20), [[(2, 9, 24)], [(1, 3, 24)]]),
    Case("addmm_beta_alpha", lambda: AddmmScaled(24, 20), [[(18, 24)], [(3, 24)]]),
    Case("gemm_scale_batch_norm", lambda: _randomize(GemmScaleBatchNorm(24, 20)), [[(18, 24)], [(3, 24)]]),
    Case("gemm_group_norm_hardtanh", lambda: _randomize(GemmGroupNormHardtanh(24, 20, 4)), [[(18, 24)], [(3, 24)]]),
    Case("two_linears_logsumexp", lambda: TwoLinearsLogSumExp(24, 20, 12), [[(18, 24)], [(3, 24)]]),
    Case("linear_sum_scale", lambda: LinearSumScale(24, 20), [[(18, 24)], [(1, 24)]]),
    Case(
        "linear_softmax_gelu",
        lambda: Model(lambda x, w: F.gelu(torch.softmax(F.linear(x, w), dim=1))),
        [[(18, 24), (20, 24)], [(3, 24), (5, 24)]],
        draw=AB,
    ),
    Case("linear_gemv_rows", lambda: GemmEpilogue(40, 30), [[(2, 40)]], strategy={"GEMV_BLOCK_K": 16}),
]


# --------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_matmul_candidate_computes_the_module(case: Case, tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = case.module().eval()
    example = _draw(case, case.shapes[0], seed=0)
    spec = _auto_spec(module, example)
    source = write_open_source(spec, case.strategy or None)
    report = check_source(source, "candidate.py", None)
    assert not report.failures, [f.message for f in report.failures]
    candidate = _load(source, tmp_path)
    for dtype in [torch.float32] + ([torch.float16] if case.fp16 else []):  # the interpreter's bf16 is unreliable
        cast = copy.deepcopy(module).to(dtype)
        for seed, shapes in enumerate(case.shapes):
            inputs = [t.to(dtype) if t.is_floating_point() else t for t in _draw(case, shapes, seed)]
            got = candidate.entry(*inputs, **_kwargs(spec, cast))
            _assert_close(case, got, cast, inputs, dtype)


def _mm_source(module: nn.Module, inputs: list[torch.Tensor], strategy: dict[str, Any] | None = None) -> str:
    return write_open_source(_auto_spec(module.eval(), inputs), strategy)


def test_epilogue_is_fused_into_the_matmul_kernel() -> None:
    """Linear + multiplier + LeakyReLU is one kernel: bias, scale and activation at the store."""
    source = _mm_source(GemmEpilogue(24, 20), [torch.randn(18, 24)])
    assert source.count("@triton.jit") == 1
    assert 'input_precision="ieee"' in source and "tl.dot(" in source
    assert "GROUP_M" in source and "MM_BLOCK_M = 128" in source


def test_row_reduction_reads_the_product_from_a_scratch_buffer() -> None:
    source = _mm_source(LinearSumScale(24, 20), [torch.randn(18, 24)])
    assert "_tmp0 = torch.empty(" in source and "dtype=torch.float32" in source
    assert source.count("_mm_plan(") == 2  # the definition and one matmul launch


def test_transposed_operands_are_read_through_strides(tmp_path: Path) -> None:
    """A.T @ B.T loads both operands in place: no copy, the strides are kernel arguments."""
    module = Model(lambda a, b: torch.matmul(a.T, b.T))
    source = _mm_source(module, [torch.randn(36, 20), torch.randn(18, 36)])
    entry = source[source.index("def entry(") :]
    assert ".contiguous()" not in entry and "x0.stride(1)" in entry
    candidate = _load(source, tmp_path)
    a = torch.randn(20, 36).t()  # non-contiguous views of the inputs themselves
    b = torch.randn(40, 36)[::2]
    torch.testing.assert_close(candidate.entry(a, b), module(a, b), rtol=1e-5, atol=1e-5)


def test_launch_plan_follows_the_sizes_and_dtype(tmp_path: Path) -> None:
    """`_mm_plan` on a GPU: 128x128 / 8 warps for 16-bit operands and float32 on tensor cores, 64x64
    float32 IEEE tiles, the GEMV path for one column or a few rows, split-K for few tiles over a
    long K; on the interpreter, no auto split."""
    candidate = _load(_mm_source(Model(torch.matmul), [torch.randn(40, 72), torch.randn(72, 24)]), tmp_path)
    plan = candidate._mm_plan
    assert plan(1, 4096, 4096, 4096, torch.float32, False) == (False, 3, 128, 128, 32, 8, 3, 1, 4096)
    candidate.MM_F32_TC = 0
    assert plan(1, 4096, 4096, 4096, torch.float32, False) == (False, 0, 64, 64, 32, 4, 3, 1, 4096)
    candidate.MM_F32_TC = 1
    assert plan(1, 4096, 4096, 4096, torch.float16, False) == (False, 1, 128, 128, 32, 8, 3, 1, 4096)
    assert plan(1, 4096, 4096, 4096, torch.bfloat16, False)[:2] == (False, 2)
    gemv, _, bm, bn, *_, split, _ = plan(1, 2048, 1, 1 << 20, torch.float32, False)
    assert gemv and bn == 1 and bm * 128 <= 8192 and split > 1  # matrix-vector: K slices fill the GPU
    assert plan(1, 2, 8192, 8192, torch.float16, False)[0]  # two rows: GEMV
    *_, split, kps = plan(1, 256, 256, 1 << 19, torch.float32, False)
    assert split > 1 and split * kps >= 1 << 19 > (split - 1) * kps  # large K: slices cover K exactly once
    assert plan(1, 256, 256, 1 << 19, torch.float32, True)[-2] == 1  # the interpreter: one slice


def test_pipeline_stages_fit_shared_memory(tmp_path: Path) -> None:
    """Each extra pipeline stage keeps every load of the K loop in shared memory: the launch plan
    gives fewer stages to a K loop with many loads (a convolution's operand read once per window
    tap needed 442 KB at 3 stages on an H200, whose blocks have 227 KB); a convolution's window is
    now gathered in one load, so its product loads two tiles per step like a plain one."""
    plain = _mm_source(Model(torch.matmul), [torch.randn(40, 72), torch.randn(72, 24)])
    conv = write_open_source(_auto_spec(nn.ConvTranspose2d(4, 6, 5, stride=2, padding=1), [torch.randn(2, 4, 7, 7)]))
    for source in (plain, conv):
        assert int(re.search(r"_mm_plan\(.*, (\d+), (True|False)\)", source).group(1)) == 2
    candidate = _load(plain, tmp_path)
    plan = candidate._mm_plan
    assert plan(1, 4096, 4096, 4096, torch.float16, False, 2)[6] == 3  # 128x128x32 16-bit tiles
    assert plan(1, 4096, 4096, 4096, torch.float32, False, 2)[6] == 3  # float32 on tensor cores: 16 KB tiles
    assert plan(1, 4096, 4096, 4096, torch.float32, False, 4)[6] == 2  # 4 x 16 KB per stage, 180 KB in all
    candidate.MM_BLOCK_K = 64  # 128x64 float32 tiles: 256 KB at 3 stages did not fit an H200 block
    assert plan(1, 4096, 4096, 4096, torch.float32, False, 2)[6] == 2
    candidate.MM_BLOCK_K, candidate.MM_F32_TC = 32, 0  # IEEE products: half-size tiles, 8 KB
    assert plan(1, 4096, 4096, 4096, torch.float32, False, 8)[6] == 2  # 8 x 8 KB per stage
    assert plan(1, 4096, 4096, 4096, torch.float32, False, 27)[6] == 1


def test_diagonal_matrix_becomes_a_row_scaling() -> None:
    source = _mm_source(Model(lambda a, b: torch.diag(a) @ b), [torch.randn(20), torch.randn(20, 30)])
    assert "tl.dot(" not in source and "_mm_plan" not in source


def test_matmul_with_a_tensor_param_keeps_the_module_dtype(tmp_path: Path) -> None:
    module = GemmEpilogue(24, 20).eval()
    spec = _auto_spec(module, [torch.randn(6, 24)])
    candidate = _load(write_open_source(spec), tmp_path)
    x = torch.randn(5, 24, dtype=torch.float64)
    wide = copy.deepcopy(module).double()
    out = candidate.entry(x, **_kwargs(spec, wide))
    assert out.dtype == torch.float64 and out.shape == (5, 20)
    torch.testing.assert_close(out, wide(x), rtol=1e-5, atol=1e-5)


def test_strategy_space_moves_the_matmul_knobs() -> None:
    space = strategy_space(_auto_spec(GemmEpilogue(24, 20).eval(), [torch.randn(18, 24)]))
    assert 2 <= len(space) <= 8
    moved = {k for point in space[1:] for k, v in point.items() if v != space[0][k]}
    assert moved and all(k.startswith(("MM_", "GEMV_")) for k in moved)
    source = write_open_source(_auto_spec(GemmEpilogue(24, 20).eval(), [torch.randn(18, 24)]), space[1])
    assert not check_source(source, "c.py", None).failures


def test_files_without_a_matmul_keep_their_strategy_block() -> None:
    source = write_open_source(_auto_spec(Model(torch.relu), [torch.randn(3, 4)]))
    assert "MM_BLOCK_M" not in source and "_mm_plan" not in source


@pytest.mark.parametrize(
    ("module", "inputs", "reason"),
    [
        (nn.ConvTranspose2d(4, 4, 3, groups=2), [torch.randn(1, 4, 8, 8)], "convolution"),
        (LinearThenConv(), [torch.randn(2, 8)], "convolution"),
        (Model(lambda a, b: a.long() @ b.long()), [torch.randn(3, 4), torch.randn(4, 5)], "integer"),
    ],
    ids=["grouped_conv_transpose", "linear_then_conv", "integer_matmul"],
)
def test_what_stays_unsupported(module: nn.Module, inputs: list[torch.Tensor], reason: str) -> None:
    with pytest.raises(Unsupported, match=reason) as info:
        _mm_source(module, inputs)
    assert "\n" not in str(info.value)


def test_a_k_loop_gathering_its_operand_runs_unpipelined_on_the_gpu(tmp_path: Path) -> None:
    """A convolution's K index gives channel and tap by division and remainder: such K loops computed
    wrong values on an H200 whenever they were software-pipelined (70-99 % of elements), right with
    one stage. A plain product keeps its pipeline."""
    plain = _mm_source(Model(torch.matmul), [torch.randn(40, 72), torch.randn(72, 24)])
    conv = write_open_source(_auto_spec(nn.Conv2d(4, 6, 3, padding=1), [torch.randn(2, 4, 9, 9)]))
    assert re.search(r"_mm_plan\(.*, \d+, True\)", plain) and "ka //" not in plain
    assert re.search(r"_mm_plan\(.*, \d+, False\)", conv) and "ka //" in conv
    plan = _load(conv, tmp_path)._mm_plan
    assert plan(1, 4096, 4096, 4096, torch.float32, False, 2, True)[6] == 3
    assert plan(1, 4096, 4096, 4096, torch.float32, False, 2, False)[6] == 1


def test_float32_products_on_tensor_cores_are_a_knob_of_the_gpu_plan(tmp_path: Path) -> None:
    """MM_F32_TC=1: float32 operands as three TF32 tensor-core products (DOT 3), on a GPU only (the
    interpreter has no tensor cores), on by default; 0: IEEE products on the FMA units (DOT 0)."""
    source = _mm_source(Model(torch.matmul), [torch.randn(40, 72), torch.randn(72, 24)])
    assert "MM_F32_TC = 1" in source and 'input_precision="tf32x3"' in source
    candidate = _load(source, tmp_path)
    assert candidate._mm_plan(1, 4096, 4096, 4096, torch.float32, False)[1] == 3
    candidate.MM_F32_TC = 0
    assert candidate._mm_plan(1, 4096, 4096, 4096, torch.float32, False)[1] == 0
    candidate.MM_F32_TC = 1
    assert candidate._mm_plan(1, 4096, 4096, 4096, torch.float32, True)[1] == 0  # the interpreter
    assert candidate._mm_plan(1, 4096, 4096, 4096, torch.bfloat16, False)[1] == 2


@pytest.mark.parametrize(
    ("fn", "shapes", "copied"),
    [
        (torch.matmul, [(600, 72), (72, 24)], True),  # row-major B: N-major, copied K-major
        (torch.bmm, [(2, 520, 40), (2, 40, 24)], True),
        (lambda a, w: a @ w.t(), [(600, 72), (24, 72)], False),  # a Linear's weight is K-major already
    ],
)
def test_float32_tensor_core_products_read_operand_b_k_major(tmp_path: Path, fn, shapes, copied) -> None:
    """Float32 products on tensor cores (DOT 3) ran twice as fast on an H200 with operand b K-major:
    the launch passes a K-major copy of an input b reads along K where it is not (same values, its
    own strides), and the input itself where it is."""
    inputs = [torch.randn(*s) for s in shapes]
    source = _mm_source(Model(fn), [torch.randn(*s) for s in shapes])
    candidate = _load(source, tmp_path)
    planned, copies = candidate._mm_plan, []

    def on_tensor_cores(*args: Any) -> tuple:
        plan = planned(*args)
        return (plan[0], 3, *plan[2:])  # DOT 3, as on a GPU

    def k_major(t: torch.Tensor, d: int) -> torch.Tensor:
        out = real(t, d)
        copies.append(out is not t)
        assert out.stride(d) == 1 and torch.equal(out, t)
        return out

    real = candidate._k_major
    candidate._mm_plan, candidate._k_major = on_tensor_cores, k_major
    got = candidate.entry(*inputs)
    assert copies == [copied]
    torch.testing.assert_close(got, fn(*inputs), rtol=1e-4, atol=1e-4)
