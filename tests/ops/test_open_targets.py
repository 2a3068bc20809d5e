"""Open targets: a module's own forward as the op, judged and bound like a registered family.

What a target reads from the module (parameters by dotted path, float attributes that change the
output, which input dims may change size and which inputs share them), that the verifier judges a
kernel for it with every layer (a baked float attribute is a hard-coded constant), that the target
reloads by name in another process, and that a KernelBench problem too large for the interpreter
is reduced to the same problem at smaller sizes drawn by its own get_inputs().
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from gpuyantra.ops import get_op
from gpuyantra.ops.open import (
    OpenInput,
    ShrinkFactories,
    build_open_target,
    dim_links,
    load_open_target,
    reduced_shapes,
    register_open,
    targets_dir,
)
from gpuyantra.verifier import run_verification

CANDIDATES = Path(__file__).parent / "open_candidates"


class LnReluScale(nn.Module):
    def __init__(self, hidden: int = 24, scale: float = 0.5):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(0.1)  # eval mode: its p changes nothing and is not bound
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.relu(self.ln(x)) * self.scale)


class CrossEntropy(nn.Module):
    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(predictions, targets)


def _target(module: nn.Module, *inputs: torch.Tensor):
    return build_open_target(module.eval(), inputs, name_hint=type(module).__name__)


def test_target_reads_parameters_float_attributes_and_variable_dims():
    target = _target(LnReluScale(), torch.randn(16, 24))
    bound = {(p.kernel_param, p.module_attr, p.kind) for p in target.params}
    assert bound == {
        ("ln_weight", "ln.weight", "tensor"),
        ("ln_bias", "ln.bias", "tensor"),
        ("ln_eps", "ln.eps", "float"),
        ("scale", "scale", "float"),
    }
    # LayerNorm(24) ties the last dim; the rows may take any count.
    assert target.variable_dims == ((0,),)
    assert target.op.startswith("open.lnreluscale_")
    shapes, stress = target.case_shapes("cpu", None)
    assert shapes[0] == [16, 24] and [1, 24] in shapes and all(s[1] == 24 for s in shapes)
    assert stress == [[1031, 24]]


def test_reference_uses_the_parameters_it_is_given():
    target = _target(LnReluScale(), torch.randn(4, 24))
    x = torch.randn(4, 24, dtype=torch.float64)
    weight, bias = torch.randn(24, dtype=torch.float64), torch.randn(24, dtype=torch.float64)
    got = target.reference(x, ln_weight=weight, ln_bias=bias, scale=2.0, ln_eps=1e-3)
    want = torch.relu(nn.functional.layer_norm(x, (24,), weight, bias, 1e-3)) * 2.0
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want)


def test_index_inputs_follow_the_dims_they_share():
    predictions, targets = torch.randn(32, 10).softmax(-1), torch.randint(0, 10, (32,))
    target = _target(CrossEntropy(), predictions, targets)
    assert target.inputs[0].domain == "simplex"
    assert target.inputs[1].domain == "int" and target.inputs[1].high_dim == 1
    assert target.links[1] == ((0, 0),)  # the batch dim is shared (leading alignment)
    assert target.shapes_for([5, 3]) == [(5, 3), (5,)]
    drawn = target.example_inputs(target.shapes_for([7, 3]))
    assert drawn[1].shape == (7,) and int(drawn[1].max()) < 3


def test_reduced_sizes_keep_the_problem_and_its_distributions():
    live = [(4096, 1000), (4096,)]
    links = (((0, 0), (1, 1)), ((0, 0),))
    shapes = reduced_shapes(live, links, 1 << 12)
    assert shapes is not None and all(torch.Size(s).numel() <= 1 << 12 for s in shapes)
    assert shapes[1][0] == shapes[0][0]
    sizes = {tuple(a): tuple(b) for a, b in zip(live, shapes)}
    with ShrinkFactories(sizes):
        predictions = torch.randn(4096, 1000).softmax(dim=-1)
        labels = torch.randint(0, 1000, (4096,))
    assert tuple(predictions.shape) == shapes[0] and tuple(labels.shape) == shapes[1]
    assert int(labels.max()) < shapes[0][1]  # class ids follow the reduced class dim
    assert reduced_shapes([(8, 1 << 20)], (((0, 0),),), 1 << 12) is None  # a fixed dim too large


def _candidate(tmp_path: Path, op: str, scale_expr: str) -> Path:
    source = (CANDIDATES / "ln_relu_scale.py").read_text().replace("OPNAME", op)
    source = source.replace("* scale  # the bound float", f"* {scale_expr}  # the bound float")
    path = tmp_path / "candidate.py"
    path.write_text(source)
    return path


@pytest.fixture(scope="module")
def registered():
    target = _target(LnReluScale(), torch.randn(16, 24))
    register_open(target)
    return target


def test_verifier_accepts_an_honest_kernel_for_an_open_target(tmp_path, registered):
    verdict = run_verification(
        _candidate(tmp_path, registered.op, "scale"), device="cpu", seeds=(0, 1), dtypes=["float32", "float16"]
    )
    assert verdict.accepted, verdict.failures
    assert verdict.module_class == registered.module_class


def test_verifier_rejects_a_baked_float_attribute(tmp_path, registered):
    verdict = run_verification(
        _candidate(tmp_path, registered.op, "0.5"), device="cpu", seeds=(0, 1), dtypes=["float32"]
    )
    assert not verdict.accepted
    assert "hardcoded-constant" in {f.rule for f in verdict.failures}


def test_adapter_must_bind_the_attribute_its_parameter_was_read_from(tmp_path, registered):
    path = _candidate(tmp_path, registered.op, "scale")
    path.write_text(path.read_text().replace('"module_attr": "ln.bias"', '"module_attr": "ln.weight"'))
    verdict = run_verification(path, device="cpu", seeds=(0,), dtypes=["float32"])
    assert [f.rule for f in verdict.failures] == ["adapter-attr"]


def test_saved_target_loads_by_name_in_another_process(registered):
    folder = targets_dir() / registered.op
    assert load_open_target(folder).params == registered.params
    code = (
        f"from gpuyantra.ops import get_op; f = get_op({registered.op!r}); "
        "print(f.name, f.activations, [p.name for p in f.params], f.n_outputs)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split()[0] == registered.op
    assert get_op(registered.op).open_target is registered


class _SquareMatmul(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


class _BothTransposed(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a.T, b.T)


@pytest.mark.parametrize(
    ("module", "shapes"),
    [(_SquareMatmul(), [(1100, 1100), (1100, 1100)]), (_BothTransposed(), [(1100, 1040), (2048, 1100)])],
)
def test_large_inputs_are_probed_on_rows_the_forward_accepts(module, shapes):
    # Past 2^20 elements the probes use input 0's first rows; a square matmul's B shares A's dim-0
    # size by coincidence and must not be cut with it, and A.T @ B.T accepts no cut at all.
    inputs = [torch.rand(s) for s in shapes]
    target = build_open_target(module, inputs, name_hint="matmul")
    assert [tuple(i.shape) for i in target.inputs] == shapes


def test_case_shapes_bound_every_input_and_output_not_only_input_0():
    # A small-K matmul: A [32768, 64] is small, its [32768, 32768] output is 4 GB per case.
    from gpuyantra.ops.open.spec import CUDA_CASE_ELEMENTS

    target = build_open_target(_SquareMatmul(), [torch.rand(64, 64), torch.rand(64, 32768)], name_hint="small_k")
    shapes, stress = target.case_shapes("cuda", [[32768, 64]])
    assert shapes[0][1] == 64 and shapes[0][0] < 32768
    assert all(target.largest_tensor(s) <= CUDA_CASE_ELEMENTS for s in shapes)
    assert all(target.largest_tensor(s) <= 4 * CUDA_CASE_ELEMENTS for s in stress)


@pytest.mark.parametrize(
    "module", [nn.ConvTranspose2d(8, 4, 3), nn.Conv2d(8, 4, 3), nn.Conv1d(8, 4, 3, groups=2)], ids=type
)
def test_convolution_channels_stay_fixed_dims(module):
    """The meta kernel of a transposed convolution takes any channel count where the real one
    refuses: a channel dim read as variable made reduced sizes the module refuses."""
    shape = (2, 8, 16, 16) if isinstance(module, nn.Conv2d | nn.ConvTranspose2d) else (2, 8, 16)
    links = dim_links(module, [OpenInput("x0", shape, "float32")])
    variable = [own for own, _ in links[0]]
    assert 1 not in variable and 0 in variable and len(shape) - 1 in variable


class ScaleShift(nn.Module):
    def forward(self, x: torch.Tensor, scale: float, shift: int, relu: bool) -> torch.Tensor:
        y = x * scale + shift
        return torch.relu(y) if relu else y


def test_number_arguments_are_keywords_of_entry_that_the_caller_passes(tmp_path):
    from gpuyantra.authors.open_author import spec_from_target
    from gpuyantra.authors.opengen import write_open_source
    from gpuyantra.candidate import import_file
    from gpuyantra.ops.open import OpenTargetError

    x = torch.randn(6, 8)
    target = build_open_target(ScaleShift(), [x, 0.5, 2, True], name_hint="scale_shift")
    assert [(p.kernel_param, p.kind, p.value, p.argument) for p in target.params] == [
        ("scale", "float", 0.5, 1),
        ("shift", "int", 2, 2),
        ("relu", "bool", True, 3),
    ]
    assert target.input_names == ("x",) and target.forward_names == ("x", "scale", "shift", "relu")
    assert target.adapter == []  # passed by the caller, not read from the module
    x64 = x.double()
    torch.testing.assert_close(target.reference(x64), torch.relu(x64 * 0.5 + 2))  # live values
    torch.testing.assert_close(target.reference(x64, scale=-1.5, shift=2, relu=False), x64 * -1.5 + 2)
    with pytest.raises(OpenTargetError, match="forward argument 1 is a str"):
        build_open_target(ScaleShift(), [x, "0.5", 2, True])

    # The open author: the float is a run-time kernel argument, the int and the bool are written in
    # at their live values and entry refuses any other.
    source = write_open_source(spec_from_target(target))
    assert "def entry(x, *, scale, shift, relu):" in source and "float(scale)" in source
    path = tmp_path / "scale_shift.py"
    path.write_text(source)
    entry = import_file(path, "test_open_scale_shift_candidate").entry
    torch.testing.assert_close(entry(x, scale=-3.0, shift=2, relu=True), torch.relu(x * -3.0 + 2))
    with pytest.raises(ValueError, match="shift=3"):
        entry(x, scale=0.5, shift=3, relu=True)
    with pytest.raises(ValueError, match="relu=False"):
        entry(x, scale=0.5, shift=2, relu=False)
