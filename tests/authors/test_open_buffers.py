"""Forwards that write new values into their own buffers (a training-mode BatchNorm's running
statistics): the open target returns each updated buffer as an extra output, the open author
stores it, and the wrappers (the family's replacement forward, KernelBench's ModelNew) write the
values back, so the module's state follows the original's. Writes into inputs and trainable
parameters stay refused with the reason."""

from __future__ import annotations

import copy
import itertools
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from gpuyantra.authors.open_author import spec_from_target
from gpuyantra.authors.opengen import Unsupported, write_open_source
from gpuyantra.candidate import import_file
from gpuyantra.kernelbench.model_new import check_model_new, load_model_new, model_new_source
from gpuyantra.kernelbench.problems import load_module
from gpuyantra.ops.base import adapter_kwargs
from gpuyantra.ops.open import build_open_target, open_family
from gpuyantra.ops.open.target import OpenTarget
from gpuyantra.verifier.static import check_source

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
_names = itertools.count()


class LinearBatchNorm(nn.Module):
    def __init__(self, features: int = 12, out: int = 6):
        super().__init__()
        self.lin = nn.Linear(features, out)
        self.bn = nn.BatchNorm1d(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.lin(x)))


class BatchNorm2dAlone(nn.Module):
    def __init__(self, channels: int = 3):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels, momentum=0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


class WritesItsWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.weight.mul_(0.5)
        return x * self.weight


class WritesItsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return x + 1.0


def _randomized(module: nn.Module) -> nn.Module:
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, t in module.named_parameters():
            t.copy_(torch.randn(t.shape, generator=generator) * 0.5 + (1.0 if "bn.weight" in name else 0.0))
        for name, t in module.named_buffers():
            if "running_var" in name:
                t.copy_(torch.rand(t.shape, generator=generator) + 0.5)
            elif "running_mean" in name:
                t.copy_(torch.randn(t.shape, generator=generator))
    return module.train()


def _load(source: str, folder: Path) -> ModuleType:
    name = f"open_buffers_candidate_{next(_names)}"
    path = folder / f"{name}.py"
    path.write_text(source)
    return import_file(path, name)


def _candidate(target: OpenTarget, folder: Path) -> ModuleType:
    source = write_open_source(spec_from_target(target), None)
    report = check_source(source, "candidate.py", None)
    assert not report.failures, [f.message for f in report.failures]
    return _load(source, folder)


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def _assert_state_close(got: nn.Module, want: nn.Module) -> None:
    have, expect = got.state_dict(), want.state_dict()
    assert list(have) == list(expect)
    for key, value in expect.items():
        if value.is_floating_point():
            torch.testing.assert_close(have[key], value, atol=1e-5, rtol=1e-4, msg=key)
        else:
            assert torch.equal(have[key], value), key


CASES = [
    pytest.param(LinearBatchNorm, [(16, 12), (7, 12)], "bn.", id="linear_batchnorm1d"),
    pytest.param(BatchNorm2dAlone, [(4, 3, 5, 6), (2, 3, 3, 7)], "bn.", id="batchnorm2d"),
]


@pytest.mark.parametrize(("make", "shapes", "prefix"), CASES)
def test_target_returns_the_updated_buffers_after_the_outputs(make: Any, shapes: list, prefix: str) -> None:
    torch.manual_seed(0)
    module = _randomized(make())
    x = torch.randn(shapes[0])
    target = build_open_target(module, (x,), name_hint=make.__name__)
    assert target.updated_attrs == (f"{prefix}running_mean", f"{prefix}running_var")
    assert target.buffer_steps == ((f"{prefix}num_batches_tracked", 1),)
    # momentum moves the running statistics in training mode: bound, read at run time.
    assert f"{prefix}momentum" in {attr for _, attr in target.float_params}
    before = _state(target.module)
    params = adapter_kwargs(target.module, target.adapter)
    given = {k: v.clone() for k, v in params.items() if isinstance(v, torch.Tensor)}
    out = target.reference(x, **params)
    want = copy.deepcopy(module)
    with torch.no_grad():
        forward = want(x)
    assert len(out) == 3 and target.split_outputs(out)[0].shape == forward.shape
    torch.testing.assert_close(out[0], forward)
    torch.testing.assert_close(out[1], want.bn.running_mean)
    torch.testing.assert_close(out[2], want.bn.running_var)
    # The reference changes neither the module it holds nor the tensors it is given.
    assert all(torch.equal(v, before[k]) for k, v in target.module.state_dict().items())
    assert all(torch.equal(params[k], v) for k, v in given.items())
    assert open_family(target).n_outputs == 3


@pytest.mark.parametrize(("make", "shapes", "prefix"), CASES)
def test_candidate_stores_the_updated_buffers(make: Any, shapes: list, prefix: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = _randomized(make())
    target = build_open_target(module, (torch.randn(shapes[0]),), name_hint=make.__name__)
    candidate = _candidate(target, tmp_path)
    for seed, shape in enumerate(shapes):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        params = adapter_kwargs(target.module, target.adapter)
        got = candidate.entry(x, **params)
        want = target.reference(x.double(), **{k: _double(v) for k, v in params.items()})
        assert len(got) == len(want) == 3
        for g, w in zip(got, want):
            assert g.dtype == x.dtype
            torch.testing.assert_close(g.double(), w, atol=1e-5, rtol=1e-4)

    # The family's replacement forward writes the new values into the module it serves.
    original, swapped = copy.deepcopy(module), copy.deepcopy(module)
    family = open_family(target)
    forward = family.replacement_forward(swapped, candidate.entry, target.adapter)
    for seed, shape in enumerate(shapes):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(10 + seed))
        with torch.no_grad():
            want_out = original(x)
            got_out = forward(swapped, x)
        assert isinstance(got_out, torch.Tensor)
        torch.testing.assert_close(got_out, want_out, atol=1e-5, rtol=1e-4)
        _assert_state_close(swapped, original)
    assert int(swapped.bn.num_batches_tracked) == len(shapes)


def _double(value: Any) -> Any:
    return value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bn = nn.BatchNorm1d(out_features)

    def forward(self, x):
        return self.bn(self.gemm(x)) * 0.5


def get_inputs():
    return [torch.randn(16, 12)]


def get_init_inputs():
    return [12, 6]
"""


def test_model_new_keeps_the_models_buffers(tmp_path: Path) -> None:
    problem = tmp_path / "gemm_bn.py"
    problem.write_text(textwrap.dedent(PROBLEM).lstrip())
    module = load_module(problem)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    target = build_open_target(model, module.get_inputs(), name_hint="gemm_bn")
    assert target.updated_attrs == ("bn.running_mean", "bn.running_var")
    candidate_path = tmp_path / "candidate_1.py"
    candidate_path.write_text(write_open_source(spec_from_target(target), None))
    model_new_path = tmp_path / "ModelNew.py"
    model_new_path.write_text(
        model_new_source(
            problem.read_text(),
            problem,
            candidate_path,
            target.op,
            target.adapter,
            ["x"],
            1,
            updated_buffers=target.updated_attrs,
            buffer_steps=target.buffer_steps,
            forward_returns_tuple=target.forward_returns_tuple,
        )
    )
    family = open_family(target)
    correct, why, _, (reference, _) = check_model_new(module, model_new_path, family, "cpu", draws=2)
    assert correct, why
    assert int(reference.bn.num_batches_tracked) == 2  # Model did update its state: ModelNew matched it

    # Directly: one call leaves ModelNew's buffers where Model's are.
    torch.manual_seed(1)
    want = module.Model(*module.get_init_inputs())
    got = load_model_new(model_new_path).ModelNew(*module.get_init_inputs())
    got.load_state_dict(want.state_dict())
    x = torch.randn(9, 12)
    with torch.no_grad():
        torch.testing.assert_close(got(x), want(x), atol=1e-5, rtol=1e-4)
    assert not torch.equal(want.bn.running_mean, torch.zeros(6))
    _assert_state_close(got, want)


@pytest.mark.parametrize(
    ("make", "shape"),
    [pytest.param(WritesItsWeight, (3, 5), id="parameter"), pytest.param(WritesItsInput, (3, 5), id="input")],
)
def test_writes_into_parameters_or_inputs_stay_refused(make: Any, shape: tuple[int, ...]) -> None:
    module = make()
    target = build_open_target(module, (torch.randn(shape),), name_hint=make.__name__)
    assert target.updated_buffers == ()
    with pytest.raises(Unsupported, match="writes into its input or a parameter"):
        write_open_source(spec_from_target(target), None)
