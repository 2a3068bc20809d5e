"""ModelNew is judged against Model computed in float64, as the verifier judges a kernel: within the
tolerance plus CONDITIONING_SLACK x Model's own float32 error per row. Two float32 computations of an
ill-conditioned problem (a GEMM whose outputs share a large common component, then GroupNorm) differ
by more than the tolerance whichever of them is right; a 16-bit accumulation is still caught. Where
Model cannot run in float64 the check falls back to Model in float32 and says so."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from gpuyantra import kernelbench as kb
from gpuyantra.kernelbench import model_new as model_new_module
from gpuyantra.ops import get_op
from gpuyantra.ops.open import build_open_target, open_family

HONEST = Path(__file__).parents[1] / "verifier" / "candidates" / "open_gemm_group_norm.py"
ACCUMULATE = "acc = acc + tl.sum(w.to(tl.float32) * x[None, :], axis=1)  # ACCUMULATE"
BF16_ACCUMULATE = "acc = (acc + tl.sum(w.to(tl.float32) * x[None, :], axis=1)).to(tl.bfloat16).to(tl.float32)"

GEMM_GROUP_NORM = '''
import torch
import torch.nn as nn

batch_size = 2
in_features = 1048576
out_features = 8
num_groups = 2


class Model(nn.Module):
    """A Gemm_GroupNorm whose GEMM outputs share a large common component (weights around 0.3,
    inputs in [0, 1)): float32 in any order errs beyond 1e-4 after the GroupNorm."""

    def __init__(self, in_features, out_features, num_groups):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        with torch.no_grad():
            self.gemm.weight.normal_(0.3, 0.5)

    def forward(self, x):
        return self.group_norm(self.gemm(x))


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, num_groups]
'''

# A Model with an op that has no float64 form here: it casts its weight to float32 itself.
FLOAT32_ONLY = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super(Model, self).__init__()
        self.weight = nn.Parameter(torch.randn(features, features))

    def forward(self, x):
        return torch.mm(x, self.weight.float())


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return [16]
"""

MM_ENTRY = """
OP = "mm"
ADAPTER = [{"kernel_param": "weight", "module_attr": "weight"}]


def entry(x, *, weight):
    return x @ weight
"""


def _model_new(tmp_path: Path, problem_source: str, candidate_source: str, adapter: list[dict[str, str]]):
    problem = tmp_path / "problem.py"
    problem.write_text(textwrap.dedent(problem_source).lstrip())
    candidate = tmp_path / "candidate_1.py"
    candidate.write_text(candidate_source)
    model_new = tmp_path / "ModelNew.py"
    model_new.write_text(kb.model_new_source(problem.read_text(), problem, candidate, "op", adapter, ["x"], 1))
    return kb.load_module(problem), model_new


@pytest.fixture(scope="module")
def gemm_group_norm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemm_group_norm")
    problem = folder / "problem.py"
    problem.write_text(textwrap.dedent(GEMM_GROUP_NORM).lstrip())
    module = kb.load_module(problem)
    model = kb.build_model(module, module.Model, "cpu")
    target = build_open_target(model, kb.make_inputs(module, "cpu", kb.SEED), name_hint="GemmGroupNorm")
    return open_family(target), target.adapter


@pytest.mark.parametrize(
    ("accumulate", "correct"),
    [pytest.param(ACCUMULATE, True, id="honest-float32"), pytest.param(BF16_ACCUMULATE, False, id="bf16-accumulate")],
)
def test_model_new_of_an_ill_conditioned_problem_is_judged_against_model_in_float64(
    tmp_path, gemm_group_norm, accumulate, correct
):
    family, adapter = gemm_group_norm
    source = HONEST.read_text()
    assert ACCUMULATE in source
    module, model_new = _model_new(tmp_path, GEMM_GROUP_NORM, source.replace(ACCUMULATE, accumulate), adapter)
    ok, why, worst, _ = kb.check_model_new(module, model_new, family, "cpu")
    # Before: the honest kernel differed from Model's float32 output beyond 1e-4 (both honest).
    assert ok is correct, why
    if correct:
        assert "against Model in float64" in why and worst is not None and worst > 1e-4
    else:
        assert "differs from Model" in why and "float64" in why and worst > 1e-2


def test_a_model_without_float64_falls_back_to_float32_and_says_so(tmp_path):
    module, model_new = _model_new(
        tmp_path, FLOAT32_ONLY, MM_ENTRY, [{"kernel_param": "weight", "module_attr": "weight"}]
    )
    ok, why, _, _ = kb.check_model_new(module, model_new, get_op("linear"), "cpu", draws=2)
    assert ok, why
    assert "against Model in float32: Model does not run in float64 (RuntimeError" in why


def test_a_float64_copy_too_large_for_memory_falls_back_to_float32(tmp_path, monkeypatch):
    module, model_new = _model_new(
        tmp_path, FLOAT32_ONLY, MM_ENTRY, [{"kernel_param": "weight", "module_attr": "weight"}]
    )
    monkeypatch.setattr(model_new_module, "_free_bytes", lambda device: 1024)
    ok, why, _, _ = kb.check_model_new(module, model_new, get_op("linear"), "cpu", draws=2)
    assert ok and "against Model in float32" in why and "does not fit in memory" in why, why


@pytest.mark.parametrize("chunk", [kb.COMPARE_CHUNK, 2], ids=["whole-rows", "rows-in-pieces"])
def test_compare_to_float64_allows_float32s_own_error_per_row_and_no_more(monkeypatch, chunk):
    monkeypatch.setattr(model_new_module, "COMPARE_CHUNK", chunk)
    want64 = torch.tensor([[1.0, -2.0, 3.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
    want32 = (want64 + torch.tensor([[1e-3, -1e-3, 1e-3], [0.0, 0.0, 0.0]], dtype=torch.float64)).float()
    # Row 0: float32 itself errs 1e-3 (allowance 16e-3); row 1: float32 is exact (the tolerance alone).
    got = (want64 + torch.tensor([[1e-2, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)).float()
    assert kb.compare_to_float64(got, want32, want64, 1e-4, 1e-4, 16.0)[1]
    got[1, 0] += 1e-3
    worst, close = kb.compare_to_float64(got, want32, want64, 1e-4, 1e-4, 16.0)
    assert not close and worst == pytest.approx(1e-2, rel=1e-3)
    # NaN where float64 is finite fails; a value float32 cannot hold is compared with Model's float32.
    nan = want32.clone()
    nan[0, 1] = float("nan")
    assert not kb.compare_to_float64(nan, want32, want64, 1e-4, 1e-4, 16.0)[1]
    huge64 = torch.tensor([1e39, 1.0], dtype=torch.float64)
    huge32 = huge64.float()  # inf
    assert kb.compare_to_float64(huge32.clone(), huge32, huge64, 1e-4, 1e-4, 16.0)[1]
