"""The judge's one-kernel comparison counts what the tensor ops count, element for element.

On CPU tensors in Triton's interpreter; on a GPU (TRITON_INTERPRET=0) on CUDA tensors, the path
`judge.violation_counts` takes there."""

from __future__ import annotations

import os

import pytest
import torch

from gpuyantra.verifier import judge_kernel
from gpuyantra.verifier.judge import OutputAllowance, _counts, _violations, violation_counts
from gpuyantra.verifier.judge_kernel import extra_divisor, fused_applies, violation_counts_fused

TOL = (1e-3, 1e-3)
ON_GPU = os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"


def _torch_counts(got: torch.Tensor, allowance: OutputAllowance) -> list[int]:
    bad_nonfinite, wrong, _ = _violations(got, allowance, TOL)
    return _counts(bad_nonfinite, wrong).tolist()


def _case(dtype: torch.dtype, shape: tuple[int, ...], extra: str, seed: int) -> tuple[torch.Tensor, OutputAllowance]:
    g = torch.Generator().manual_seed(seed)
    want = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    flat = want.view(-1)
    flat[:: max(1, flat.numel() // 5)] = float("inf")  # not representable: not judged
    flat[1 :: max(2, flat.numel() // 3)] = 1e300 if dtype != torch.float64 else float("nan")
    if dtype.is_floating_point:
        got = want.clamp(-1e4, 1e4).to(dtype)
    else:
        got = want.clamp(-100, 100).round().to(dtype)
        want = got.to(torch.float64).clone()
        want.view(-1)[::7] += 0.5  # off by more than the tolerance
    noisy = got.view(-1)
    if dtype.is_floating_point:
        noisy[2::11] += 0.5  # out of tolerance
        noisy[3::13] = float("nan")
        noisy[4::17] = float("-inf")
    # Right at the edge of the allowance: the rounding of |want| * rtol + atol decides.
    edge = want.abs().mul(TOL[1]).add(TOL[0])
    slack = {
        "none": None,
        "full": torch.rand(shape, generator=g, dtype=torch.float64) * 1e-2,
        "row": torch.rand(shape[:-1] + (1,), generator=g, dtype=torch.float64) * 1e-2,
    }[extra]
    allowance = OutputAllowance.of(want, dtype, slack)
    if dtype == torch.float64:
        got = torch.where(torch.rand(shape, generator=g) < 0.3, want + edge, got)
    return got.to(DEVICE), _on(allowance, DEVICE)


def _on(allowance: OutputAllowance, device: str) -> OutputAllowance:
    extra = allowance.extra.to(device) if allowance.extra is not None else None
    return OutputAllowance(
        allowance.want.to(device), allowance.representable.to(device), extra, allowance.slack, allowance.bound
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int32, torch.bool])
@pytest.mark.parametrize("extra", ["none", "full", "row"])
@pytest.mark.parametrize("shape", [(1, 96), (3, 1000), (2, 5, 64), (4099,)])
def test_counts_equal_the_tensor_ops(dtype: torch.dtype, extra: str, shape: tuple[int, ...]) -> None:
    got, allowance = _case(dtype, shape, extra, seed=len(shape) * 1000 + shape[-1])
    fused = violation_counts_fused(got, allowance, TOL).tolist()
    assert fused == _torch_counts(got, allowance)
    if ON_GPU:  # the judge's own path there
        assert fused_applies(got, allowance) and violation_counts(got, allowance, TOL).tolist() == fused


def test_a_case_with_violations_of_both_kinds_is_counted() -> None:
    got, allowance = _case(torch.float32, (3, 1000), "row", seed=1)
    nonfinite, wrong = violation_counts_fused(got, allowance, TOL).tolist()
    assert nonfinite > 0 and wrong > nonfinite  # NaN and -inf outputs are out of tolerance too


def test_an_empty_output_has_no_violations() -> None:
    want = torch.empty(0, 8, dtype=torch.float64, device=DEVICE)
    allowance = OutputAllowance.of(want, torch.float32)
    assert violation_counts_fused(torch.empty(0, 8, device=DEVICE), allowance, TOL).tolist() == [0, 0]


@pytest.mark.parametrize(
    ("extra_shape", "shape", "divisor"),
    [
        ((3, 1000), (3, 1000), 1),
        ((3, 1), (3, 1000), 1000),
        ((2, 1, 1), (2, 5, 64), 320),
        ((), (2, 5, 64), 640),
        ((1000,), (3, 1000), None),  # broadcast over leading rows: not one value per run
        ((1, 1000), (3, 1000), None),
        ((3, 1000, 1), (3, 1000), None),
    ],
)
def test_extra_divisor(extra_shape: tuple[int, ...], shape: tuple[int, ...], divisor: int | None) -> None:
    assert extra_divisor(torch.zeros(extra_shape, dtype=torch.float64), torch.Size(shape)) == divisor


def test_host_outputs_keep_the_tensor_ops() -> None:
    got, allowance = _case(torch.float32, (3, 1000), "full", seed=2)
    got, allowance = got.cpu(), _on(allowance, "cpu")
    assert not fused_applies(got, allowance)  # CPU tensors: judged by the tensor ops
    assert violation_counts(got, allowance, TOL).tolist() == _torch_counts(got, allowance)


def test_warm_loads_each_variant_ahead_on_cuda_only() -> None:
    """A verification warms the kernel's variants while its child starts; under the interpreter there
    is nothing to load ahead."""
    device = torch.device("cuda", torch.cuda.current_device()) if ON_GPU else torch.device("cpu")
    before = set(judge_kernel._WARMED)
    judge_kernel.warm([torch.float16, torch.bfloat16], device)
    wanted = {(dtype, extra, device) for dtype in (torch.float16, torch.bfloat16) for extra in (False, True)}
    if ON_GPU:
        assert wanted <= judge_kernel._WARMED
    else:
        assert judge_kernel._WARMED == before
