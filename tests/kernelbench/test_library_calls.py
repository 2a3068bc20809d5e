"""Library primitives around Triton: a KernelBench candidate keeps the convolution in torch's library
(`torch.nn.functional.conv2d`) and fuses what follows in Triton. Accepted, and named as library, only
where the target's own forward computes that kind; any other torch compute stays a cheat. On the CPU
under Triton's interpreter, at a few hundred elements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuyantra.cli import main
from gpuyantra.ops.open import open_family
from gpuyantra.verifier.static import check_source
from tests.verify_open.test_verify_command import state  # noqa: F401 - a state folder of the test's own

pytestmark = pytest.mark.usefixtures("state")

CONV_RELU_PROBLEM = """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, channels_in, channels_out):
        super().__init__()
        self.conv = nn.Conv2d(channels_in, channels_out, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x) + 0.5)


def get_inputs():
    return [torch.randn(2, 3, 6, 6)]


def get_init_inputs():
    return [3, 4]
"""

ROW_SUM_PROBLEM = """
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return x.sum(dim=-1)


def get_inputs():
    return [torch.randn(4, 32)]


def get_init_inputs():
    return []
"""

# The convolution from cuDNN (here: torch's CPU kernel), its bias, + 0.5 and the ReLU in one Triton pass.
CONV_EPILOGUE_CANDIDATE = """
import torch
import triton
import triton.language as tl

OP = "OPNAME"
ADAPTER = [
    {"kernel_param": "conv_weight", "module_attr": "conv.weight"},
    {"kernel_param": "conv_bias", "module_attr": "conv.bias"},
]


@triton.jit
def _bias_shift_relu(Y, B, OUT, n, plane, channels, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    y = tl.load(Y + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + (offsets // plane) % channels, mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + offsets, tl.maximum(y + b + 0.5, 0.0).to(OUT.dtype.element_ty), mask=mask)


def entry(x, *, conv_weight, conv_bias):
    y = torch.nn.functional.conv2d(x.contiguous(), conv_weight, None, 1, 1).contiguous()
    out = torch.empty_like(y)
    n = y.numel()
    _bias_shift_relu[(triton.cdiv(n, 256),)](y, conv_bias, out, n, y.shape[2] * y.shape[3], y.shape[1], BLOCK=256)
    return out
"""


def family_of(file_name: str, source: str):  # noqa: ANN201 - an OpFamily
    from gpuyantra.verify_target import problem_target

    return open_family(problem_target(file_name, source))


def test_the_target_permits_only_the_library_kinds_its_forward_computes() -> None:
    assert family_of("conv_relu.py", CONV_RELU_PROBLEM).open_target.library_kinds() == {"convolution"}
    assert family_of("row_sum.py", ROW_SUM_PROBLEM).open_target.library_kinds() == frozenset()


def test_a_library_convolution_with_a_triton_epilogue_passes_the_static_rules_named_as_library() -> None:
    family = family_of("conv_relu.py", CONV_RELU_PROBLEM)
    report = check_source(CONV_EPILOGUE_CANDIDATE.replace("OPNAME", family.name), family=family)
    assert report.ok, report.failures
    assert report.library_calls == ["torch.nn.functional.conv2d"]


def test_torch_compute_outside_the_allowlist_stays_a_cheat() -> None:
    family = family_of("conv_relu.py", CONV_RELU_PROBLEM)
    relu_in_torch = CONV_EPILOGUE_CANDIDATE.replace(
        "    return out\n", "    return torch.relu(out)\n"
    )  # the kernel still launches; torch.relu is not a library primitive
    report = check_source(relu_in_torch.replace("OPNAME", family.name), family=family)
    assert ("torch-compute", True) in {(f.rule, "torch.relu" in f.message) for f in report.failures}
    assert report.library_calls == ["torch.nn.functional.conv2d"]  # the convolution itself was fine


def test_a_library_kind_the_forward_does_not_compute_is_rejected_with_its_rule() -> None:
    # A GEMM against ones would hand a sum reduction to cuBLAS: not a library primitive of this target.
    family = family_of("row_sum.py", ROW_SUM_PROBLEM)
    gemm = CONV_EPILOGUE_CANDIDATE.replace(
        "torch.nn.functional.conv2d(x.contiguous(), conv_weight, None, 1, 1)", "torch.matmul(x, x)"
    )
    report = check_source(gemm.replace("OPNAME", family.name), family=family)
    assert any(f.rule == "torch-compute" and "torch.matmul: a gemm library call" in f.message for f in report.failures)
    assert report.library_calls == []


def test_a_registered_family_permits_no_library_call() -> None:
    from gpuyantra.ops import get_op

    report = check_source(CONV_EPILOGUE_CANDIDATE.replace("OPNAME", "rms_norm"), family=get_op("rms_norm"))
    assert any(f.rule == "torch-compute" and "conv2d: a convolution library call" in f.message for f in report.failures)


def test_the_open_author_keeps_a_leading_convolution_in_the_library_and_fuses_the_rest() -> None:
    from gpuyantra.authors.open_author import library_space, spec_from_target
    from gpuyantra.authors.opengen.library_conv import write_library_conv_source

    family = family_of("conv_relu.py", CONV_RELU_PROBLEM)
    spec = spec_from_target(family.open_target)
    space = library_space(spec)
    # Library convolution first, then the whole forward in Triton as the fallback strategies.
    assert space[0]["LIBRARY_CONV"] == 1 and {p["LIBRARY_CONV"] for p in space} == {0, 1}
    source = write_library_conv_source(spec, space[0])
    assert "torch.nn.functional.conv2d(x, conv_weight, conv_bias, (1, 1), (1, 1), (1, 1), 1)" in source
    report = check_source(source, family=family)
    assert report.ok, report.failures
    assert report.library_calls == ["torch.nn.functional.conv2d"]


def test_a_convolution_alone_is_not_split_into_library_and_copy() -> None:
    from gpuyantra.authors.open_author import library_space, spec_from_target

    alone = CONV_RELU_PROBLEM.replace("torch.relu(self.conv(x) + 0.5)", "self.conv(x)")
    spec = spec_from_target(family_of("conv_alone.py", alone).open_target)
    assert all("LIBRARY_CONV" not in p for p in library_space(spec))


def test_the_verifier_accepts_the_library_convolution_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problem = tmp_path / "conv_relu.py"
    problem.write_text(CONV_RELU_PROBLEM)
    from gpuyantra.authors.open_author import library_space, spec_from_target
    from gpuyantra.authors.opengen.library_conv import write_library_conv_source

    family = family_of(problem.name, CONV_RELU_PROBLEM)
    spec = spec_from_target(family.open_target)
    candidate = tmp_path / "conv_epilogue.py"  # as the open author writes it for the loop
    candidate.write_text(write_library_conv_source(spec, library_space(spec)[0]))
    code = main(
        ["verify", str(candidate), "--problem", str(problem), "--device", "cpu", "--dtypes", "float32"]
        + ["--where", "here", "--json"]
    )
    verdict = json.loads([line for line in capsys.readouterr().out.splitlines() if line.strip()][-1])
    assert code == 0 and verdict["accepted"] is True, verdict["failures"]
    assert verdict["library_calls"] == ["torch.nn.functional.conv2d"]


def test_an_llm_author_is_told_which_library_calls_this_target_permits() -> None:
    from gpuyantra.authors.llm import library_rule

    (rule,) = library_rule(family_of("conv_relu.py", CONV_RELU_PROBLEM))
    assert "`torch.nn.functional.conv2d`" in rule and "torch.matmul" not in rule
    assert library_rule(family_of("row_sum.py", ROW_SUM_PROBLEM)) == []
