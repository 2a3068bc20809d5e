"""Math that is ill-conditioned on the plain draws themselves: a GEMM whose outputs share a large
common component, then a normalization (KernelBench's Gemm_GroupNorm / Gemm_BatchNorm problems).

Inputs in [0, 1) (the module was seen with `torch.rand`) times weights drawn around 0.3 give GEMM
outputs near 0.15 K with a spread across channels of about 0.3 sqrt(K); the GroupNorm magnifies the
GEMM's rounding by their ratio. At K = 2^20 float32 itself, the parent's own BLAS included, errs
beyond the float32 tolerance (1e-4) there. An honest kernel is held to what float32 can do on each
case (the conditioning allowance, `CONDITIONING_SLACK`), on plain draws as on activation-like ones;
a well-conditioned module's plain draws keep an allowance of a few float32 roundings, and a kernel
that accumulates in 16 bits stays far outside.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from gpuyantra.ops import get_op
from gpuyantra.ops.open import build_open_target, open_family, register_open
from gpuyantra.verifier import run_verification
from gpuyantra.verifier.cases import Case, float64_reference, ieee_float32, make_case
from gpuyantra.verifier.judge import CONDITIONING_SLACK, References, _conditioning_slack
from tests.verifier.conftest import candidate_path

K = 2**20
HONEST = candidate_path("open_gemm_group_norm")
ACCUMULATE = "acc = acc + tl.sum(w.to(tl.float32) * x[None, :], axis=1)  # ACCUMULATE"
# The classic shortcut: the running sum kept in bfloat16 (8 bits) between tiles.
BF16_ACCUMULATE = "acc = (acc + tl.sum(w.to(tl.float32) * x[None, :], axis=1)).to(tl.bfloat16).to(tl.float32)"
F32 = {"seeds": (0,), "dtypes": ["float32"]}


class GemmGroupNorm(nn.Module):
    def __init__(self, in_features: int = K, out_features: int = 8, groups: int = 2):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(groups, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group_norm(self.gemm(x))


@pytest.fixture(scope="module")
def target():
    target = build_open_target(GemmGroupNorm().eval(), (torch.rand(2, K),), name_hint="GemmGroupNorm")
    register_open(target)
    return target


def _candidate(tmp_path: Path, op: str, accumulate: str = ACCUMULATE) -> Path:
    source = HONEST.read_text().replace("OPNAME", op)
    assert ACCUMULATE in source
    path = tmp_path / "candidate.py"
    path.write_text(source.replace(ACCUMULATE, accumulate))
    return path


def _specs(target) -> list[dict]:
    """The parameter specs the contract layer gives an open target's cases."""
    return [
        {"name": p.kernel_param, "kind": "tensor", "shape": list(p.shape), "positive": p.positive}
        if p.kind == "tensor"
        else {"name": p.kernel_param, "kind": p.kind, "value": float(p.value)}
        for p in target.params
    ]


def _plain_slack(family, specs, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """(the float32 computation's error, the allowance it gives) on a plain case of `shape`."""
    case = Case(0, "main", "float32", tuple(shape), 0, 1.0)
    references = References(family, specs)
    activations, params = make_case(family, case, specs)
    want = float64_reference(family, activations, params)[0]
    float32 = references.float32(activations, params)
    assert float32 is not None  # plain draws are given the allowance too
    slack = _conditioning_slack(float32[0], want)
    return (float32[0].double() - want).abs(), slack


def test_plain_draws_of_a_gemm_then_group_norm_are_beyond_float32s_tolerance(target):
    error, slack = _plain_slack(open_family(target), _specs(target), [1, K])
    assert float(error.max()) > 1e-4  # float32 itself fails the tolerance on this plain draw
    assert float(slack.max()) > 1e-4


def test_well_conditioned_plain_draws_stay_as_strict_as_the_tolerance():
    specs = [{"name": "weight", "kind": "tensor", "shape": ["H"]}, {"name": "eps", "kind": "float", "value": 1e-6}]
    error, slack = _plain_slack(get_op("rms_norm"), specs, [4, 1000])
    # A few float32 roundings of outputs of order 1: a hundredth of the 1e-4 tolerance at most.
    assert float(slack.max()) < 1e-6 and float(slack.max()) <= CONDITIONING_SLACK * float(error.max())


def test_honest_kernel_is_held_to_what_float32_can_do_on_plain_draws(tmp_path, target):
    # Before plain draws had the allowance, this kernel failed `wrong-values` on 2 of its 6 calls
    # though the parent's own float32 computation fails the tolerance there too.
    verdict = run_verification(_candidate(tmp_path, target.op), device="cpu", **F32)
    assert verdict.accepted, verdict.failures
    assert verdict.checks == 9  # the 6 plain calls, then the view, zero-row and prefill-row plan classes
    assert verdict.plan_classes["prefill_rows"] == "reduced" and verdict.plan_classes["zero_rows"] == "full"


def test_low_precision_accumulation_is_still_rejected_there(tmp_path, target):
    verdict = run_verification(_candidate(tmp_path, target.op, BF16_ACCUMULATE), device="cpu", **F32)
    assert not verdict.accepted and verdict.reward == -1
    # The plain calls fail first; the plan classes after them fail with their own rules too.
    assert verdict.failures[0].rule == "wrong-values", verdict.failures
    assert "plus 16x float32's own error" in verdict.failures[0].message


def test_the_float32_reference_is_ieee_whatever_the_process_set():
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        with ieee_float32():
            with ieee_float32():
                assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
            assert not torch.backends.cuda.matmul.allow_tf32  # the outer one is still open
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
