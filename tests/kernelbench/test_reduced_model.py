"""`gpuyantra kernelbench` on CPU: a Model whose parameters exceed the size cap is built from reduced
init inputs (its dimension integers scaled down with its inputs), other integers and floats kept.
Problem files are our own small synthetic ones, written into tmp_path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuyantra import kernelbench as kb

# Linear then elementwise, in/out features from get_init_inputs: 16.8M parameters, over the CPU cap.
LINEAR_SCALE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features, multiplier):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier

    def forward(self, x):
        return torch.relu(self.gemm(x) * self.multiplier)


batch_size = 8
in_features = 4096
out_features = 4096
multiplier = 1.5


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, multiplier]
"""

# Integers that are not dimensions (a divisor, a clamp bound, both above the smallest reduced size)
# beside the features: only the features are reduced.
LINEAR_INT_ARGS = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features, divisor, limit):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.divisor = divisor
        self.limit = limit

    def forward(self, x):
        x = self.linear(x) / self.divisor
        return torch.clamp(x, -self.limit, self.limit)


def get_inputs():
    return [torch.randn(4, 4096)]


def get_init_inputs():
    return [4096, 4096, 32, 24]
"""

# The group count must divide the channels: the reduced size stops where it still does.
LINEAR_GROUP_NORM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features, num_groups, bias_shape):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return self.group_norm(self.gemm(x)) + self.bias


def get_inputs():
    return [torch.rand(1024, 4096)]


def get_init_inputs():
    return [4096, 4096, 128, (4096,)]
"""

# Its parameters' sizes are fixed in the file: no integer of get_init_inputs() sizes them.
FIXED_WEIGHT = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim, repeats):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2048, 4096))
        self.dim = dim
        self.repeats = repeats

    def forward(self, x):
        return torch.matmul(x, self.weight).sum(dim=self.dim) * self.repeats


def get_inputs():
    return [torch.rand(4, 2048)]


def get_init_inputs():
    return [1, 32]
"""

# Parameters within the cap, but the inputs' large dim is fixed by the Model's own size (its
# normalized shape): the inputs alone cannot be reduced, the Model with them can.
WIDE_LAYER_NORM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.randn(4, 2097152)]


def get_init_inputs():
    return [2097152]
"""


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source).lstrip())
    return path


def plan(tmp_path: Path, name: str, source: str) -> tuple[kb.ModelReduction | None, str]:
    module = kb.load_module(write(tmp_path, name, source))
    return kb.plan_reduced_model(module, kb.CPU_MAX_ELEMENTS)


def test_linear_features_and_their_input_dim_are_reduced_together(tmp_path):
    reduction, why = plan(tmp_path, "linear_scale.py", LINEAR_SCALE)
    assert reduction is not None, why
    assert reduction.init == [64, 64, 1.5]  # the float is untouched
    assert reduction.sizes == {(8, 4096): (8, 64)}  # in_features is the input's last dim
    assert reduction.how == "init [4096, 4096] -> [64, 64]; [8, 4096] -> [8, 64]"


def test_integers_that_are_not_dimensions_stay(tmp_path):
    module = kb.load_module(write(tmp_path, "linear_int_args.py", LINEAR_INT_ARGS))
    assert kb.dimension_values(module, module.get_init_inputs()) == [4096]
    reduction, why = kb.plan_reduced_model(module, kb.CPU_MAX_ELEMENTS)
    assert reduction is not None, why
    assert reduction.init == [64, 64, 32, 24]
    assert reduction.sizes == {(4, 4096): (4, 64)}


def test_a_constraint_of_the_model_keeps_a_margin_above_the_smallest_size_it_accepts(tmp_path):
    # GroupNorm(128, out): 64 channels do not build, 128 do (one channel per group); the reduction
    # stays CONSTRAINT_MARGIN above that, within the cap (over REDUCED_PARAMETERS).
    reduction, why = plan(tmp_path, "linear_group_norm.py", LINEAR_GROUP_NORM)
    assert reduction is not None, why
    assert kb.CONSTRAINT_MARGIN == 4
    assert reduction.init == [512, 512, 128, (512,)]  # num_groups stays, the tuple's dim follows
    assert reduction.how.startswith("init [4096, 4096, (4096,)] -> [512, 512, (512,)]; [1024, 4096] -> [")
    ((live, small),) = reduction.sizes.items()
    assert live == (1024, 4096) and small[1] == 512 and small[0] * small[1] <= kb.REDUCED_ELEMENTS


def test_parameters_no_init_integer_sizes_are_skipped_with_the_reason(tmp_path):
    reduction, why = plan(tmp_path, "fixed_weight.py", FIXED_WEIGHT)
    assert reduction is None and "no integer of get_init_inputs() sizes the Model's parameters" in why
    result = kb.run(tmp_path / "fixed_weight.py", device="cpu", out=tmp_path / "out")
    (problem,) = result.problems
    assert problem.status == "skipped" and problem.reduced is None
    assert "8,388,608 elements" in problem.reason and "cannot be reduced" in problem.reason


def test_the_model_is_never_reduced_on_cuda(tmp_path):
    write(tmp_path, "linear_scale.py", LINEAR_SCALE)
    # Over an explicit cap on CUDA the problem is skipped before anything is built on the GPU.
    problem = kb.run_problem(
        "linear_scale", tmp_path / "linear_scale.py", "cuda", tmp_path / "out", max_elements=kb.CPU_MAX_ELEMENTS
    )
    assert problem.status == "skipped" and problem.reduced is None
    assert "parameters hold 16,781,312 elements" in problem.reason and "cannot be reduced" not in problem.reason


def test_inputs_whose_fixed_dims_are_the_models_sizes_are_reduced_with_the_model(tmp_path):
    write(tmp_path, "wide_layer_norm.py", WIDE_LAYER_NORM)
    result = kb.run(tmp_path / "wide_layer_norm.py", device="cpu", out=tmp_path / "out", max_iterations=1)
    (problem,) = result.problems
    assert problem.reduced == "init [2097152] -> [4096]; [4, 2097152] -> [4, 4096]"
    assert problem.shapes == [[4, 4096]]
    assert problem.status == "optimized" and problem.correct, problem.reason


@pytest.mark.parametrize(
    ("name", "source", "reduced", "shape"),
    [
        ("linear_scale", LINEAR_SCALE, "init [4096, 4096] -> [64, 64]; [8, 4096] -> [8, 64]", [8, 64]),
        ("linear_int_args", LINEAR_INT_ARGS, "init [4096, 4096] -> [64, 64]; [4, 4096] -> [4, 64]", [4, 64]),
    ],
)
def test_a_reduced_model_is_optimized_and_correct_on_cpu(tmp_path, name, source, reduced, shape):
    write(tmp_path, f"{name}.py", source)
    result = kb.run(tmp_path / f"{name}.py", device="cpu", out=tmp_path / "out", max_iterations=2)
    (problem,) = result.problems
    assert problem.status == "optimized" and problem.correct, problem.reason
    assert problem.reduced == reduced
    assert f"verified on reduced sizes of the problem ({reduced})" in problem.reason
    assert problem.shapes == [shape]
    assert result.fast_0 == 1.0 and result.fast_1 is None
    # ModelNew.py keeps the problem's own sizes: the reduction is for the CPU run only.
    assert textwrap.dedent(source).lstrip() in (tmp_path / "out" / name / "ModelNew.py").read_text()
