# Over 600 lines: the open author's tests share one set of traced example modules.
"""The open author: traced modules -> candidate files that pass the static checker and compute the
module's forward in Triton's interpreter, at the example shapes and at other sizes of the dims that
vary, in float32 and float16; refusals with reasons; float params read at run time; the author's
small strategy search."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpuyantra.authors.base import Attempt, WriteRequest
from gpuyantra.authors.open_author import OpenAuthor, next_strategy
from gpuyantra.authors.opengen import OpenSpec, Unsupported, strategy_space, write_open_source
from gpuyantra.candidate import import_file
from gpuyantra.verifier.static import check_source

# Padding lanes of a tile may hold -inf - -inf or 0/0 (never stored): numpy warns about them.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# rows wider than 8 take the chunked kernels
CHUNKED = {"BLOCK_R_MAX": 8, "CHUNK": 8, "TILE": 64, "SCAN_CHUNK": 8, "SCAN_TILE": 64}
_names = itertools.count()


# --------------------------------------------------------------------------------------------- modules


class Model(nn.Module):
    """A KernelBench-style module around a function of the inputs."""

    def __init__(self, fn: Callable[..., Any]):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.fn(*inputs)


class RMSNorm(nn.Module):
    def __init__(self, features: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + self.eps)
        return x / rms * self.weight[:, None]


class ScaledClamp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 0.75
        self.shift = -0.3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x * self.scale + self.shift, min=-self.shift)


class LeakyReLU(nn.Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, negative_slope=self.negative_slope)


class ExclusiveCumsum(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cumsum = torch.cumsum(x.narrow(dim=self.dim, start=0, length=x.size(self.dim) - 1), dim=self.dim)
        return torch.cat((torch.zeros_like(x.select(self.dim, 0).unsqueeze(self.dim)), cumsum), dim=self.dim)


def _randomize(module: nn.Module) -> nn.Module:
    """Random affine params and running stats (never weight = 1, bias = 0)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point():
                continue
            if "var" in name:
                t.uniform_(0.5, 2.0)
            else:
                t.normal_()
    return module.eval()


def _acts(x: torch.Tensor) -> torch.Tensor:
    return (
        F.gelu(x)
        + F.gelu(x, approximate="tanh")
        + F.silu(x) * torch.sigmoid(x)
        - F.softplus(x)
        + F.elu(x)
        + F.selu(x)
        + F.hardsigmoid(x)
        + F.mish(x)
        + F.hardtanh(x)
        + F.softsign(x)
        + torch.tanh(x)
        + torch.relu(x)
    )


def _arith(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    a = x * y + z / 2 - 1
    b = torch.exp(-x.abs()) + torch.log(x.abs() + 1) + torch.sqrt(x.abs()) + torch.rsqrt(x.abs() + 1)
    c = torch.where(x > y, x, y) + (x >= 0).float() + torch.clamp(x, -0.5, 0.5) + (x.abs() + 0.5) ** 1.5
    return a + b + c + x.pow(2)


# --------------------------------------------------------------------------------------------- table

# A shape set: the shapes of the forward's inputs. The first set is the example the author traces;
# the others change the dims that may vary.
Shapes = Sequence[Sequence[int]]


def _normal(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _targets(classes: int) -> Callable[..., torch.Tensor]:
    return lambda *shape: torch.randint(0, classes, shape)


def _simplex(*shape: int) -> torch.Tensor:
    return torch.rand(*shape).softmax(-1)


def _mask(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) > 0.5


@dataclass
class Case:
    id: str
    module: Callable[[], nn.Module]
    shapes: list[Shapes]
    draw: Sequence[Callable[..., torch.Tensor]] = (_normal,)  # per input
    fp16: bool = False
    strategy: dict[str, Any] = field(default_factory=dict)
    offset: bool = False  # rows with mean 2000 and spread 1 (cancellation-prone statistics)


X3 = [[(4, 37, 19)], [(2, 5, 7)], [(1, 3, 33)]]
X4 = [[(3, 8, 5, 7)], [(2, 8, 3, 9)]]

CASES = [
    # elementwise chains, broadcasting, float attributes
    Case("activations", lambda: Model(_acts), X3, fp16=True),
    Case(
        "broadcast_arith",
        lambda: Model(_arith),
        [[(4, 37, 19), (37, 1), (19,)], [(2, 5, 7), (5, 1), (7,)]],
        draw=(_normal, _normal, _normal),
        fp16=True,
    ),
    Case("float_attrs_affine", ScaledClamp, X3),
    Case("leaky_relu_attr", lambda: LeakyReLU(0.2), X3),
    # reductions along any dims, keepdim both ways
    Case("sum_dim1", lambda: Model(lambda x: x.sum(1)), X3, fp16=True),
    Case("mean_dim0_keepdim", lambda: Model(lambda x: x.mean(0, keepdim=True)), X3),
    Case("max_min_dims", lambda: Model(lambda x: (x.amax(-1), x.amin((0, 2), keepdim=True))), X3),
    Case("torch_max_dim", lambda: Model(lambda x: torch.max(x, 1)), X3),
    Case("argmax_argmin", lambda: Model(lambda x: (x.argmax(1), x.argmin(0, keepdim=True), x.argmax())), X3),
    Case("prod_dim2", lambda: Model(lambda x: torch.prod(x, 2)), X3),
    Case("logsumexp", lambda: Model(lambda x: torch.logsumexp(x, 1)), X3),
    Case("std_var", lambda: Model(lambda x: (x.std((0, 2)), x.var(2, keepdim=True, unbiased=False))), X3),
    Case("norms", lambda: Model(lambda x: (x / x.norm(p=2, dim=1, keepdim=True), x.abs().sum(2))), X3),
    Case("frobenius", lambda: Model(lambda x: x / torch.norm(x, p="fro")), X3),
    # softmax and log-softmax along any dim
    Case("softmax_dim1", lambda: Model(lambda x: torch.softmax(x, 1)), X3, fp16=True),
    Case("log_softmax_dim0", lambda: Model(lambda x: torch.log_softmax(x, 0)), X3),
    # normalizations
    Case("rms_norm", lambda: RMSNorm(37), [[(4, 37, 19)], [(2, 37, 5)]]),
    Case("layer_norm_affine", lambda: _randomize(nn.LayerNorm([37, 19])), [[(4, 37, 19)], [(2, 37, 19)]], fp16=True),
    Case("layer_norm_plain", lambda: nn.LayerNorm(19, elementwise_affine=False), X3[:1] + [[(3, 6, 19)]]),
    Case("batch_norm_eval", lambda: _randomize(nn.BatchNorm2d(8)), X4),
    Case("instance_norm", lambda: _randomize(nn.InstanceNorm2d(8, affine=True)), X4),
    Case("group_norm", lambda: _randomize(nn.GroupNorm(4, 8)), X4),
    # scans
    Case("cumsum_cumprod", lambda: Model(lambda x: (torch.cumsum(x, 1), torch.cumprod(x, 2))), X3),
    Case("cumsum_reverse", lambda: Model(lambda x: torch.cumsum(x.flip(1), 1).flip(1)), X3),
    Case("cumsum_exclusive", lambda: ExclusiveCumsum(1), [[(5, 13)], [(3, 7)]]),
    Case(
        "cumsum_masked",
        lambda: Model(lambda x, m: torch.cumsum(x * m, dim=1)),
        [[(5, 13), (5, 13)], [(3, 7), (3, 7)]],
        draw=(_normal, _mask),
    ),
    # losses
    Case(
        "mse_huber",
        lambda: Model(
            lambda a, b: (F.mse_loss(a, b), F.smooth_l1_loss(a, b, reduction="sum"), F.huber_loss(a, b, delta=0.5))
        ),
        [[(6, 9), (6, 9)], [(5, 4), (5, 4)]],
        draw=(_normal, _normal),
    ),
    Case(
        "hinge",
        lambda: Model(lambda p, t: torch.mean(torch.clamp(1 - p * t, min=0))),
        [[(6, 6), (6,)], [(5, 5), (5,)]],
        draw=(_normal, _normal),
    ),
    Case(
        "kl_div",
        lambda: Model(lambda p, t: F.kl_div(torch.log(p), t, reduction="batchmean")),
        [[(6, 9), (6, 9)], [(5, 4), (5, 4)]],
        draw=(_simplex, _simplex),
    ),
    Case(
        "cross_entropy",
        lambda: Model(F.cross_entropy),
        [[(6, 9), (6,)], [(13, 9), (13,)]],
        draw=(_normal, _targets(9)),
        fp16=True,
    ),
    Case(
        "triplet_margin",
        lambda: nn.TripletMarginLoss(margin=1.0),
        [[(6, 9)] * 3, [(5, 4)] * 3],
        draw=(_normal, _normal, _normal),
    ),
    Case(
        "cosine_loss",
        lambda: Model(lambda a, b: torch.mean(1 - F.cosine_similarity(a, b, dim=1))),
        [[(6, 9), (6, 9)], [(5, 4), (5, 4)]],
        draw=(_normal, _normal),
    ),
    # chunked kernels (rows wider than BLOCK_R_MAX)
    Case(
        "chunked_softmax", lambda: Model(lambda x: torch.softmax(x, -1)), [[(3, 2, 19)], [(2, 1, 9)]], strategy=CHUNKED
    ),
    Case(
        "chunked_layer_norm",
        lambda: _randomize(nn.LayerNorm(19)),
        [[(3, 2, 19)]],
        strategy=CHUNKED,
        offset=True,
    ),
    Case(
        "chunked_arg_scan",
        lambda: Model(lambda x: (x.argmax(1), torch.cumsum(x, 1), torch.logsumexp(x, 1))),
        [[(3, 21)], [(2, 9)]],
        strategy=CHUNKED,
    ),
    Case(
        "chunked_cross_entropy",
        lambda: Model(F.cross_entropy),
        [[(5, 19), (5,)]],
        draw=(_normal, _targets(19)),
        strategy=CHUNKED,
    ),
    Case("chunked_group_norm", lambda: _randomize(nn.GroupNorm(2, 4)), [[(2, 4, 3, 5)]], strategy=CHUNKED),
    # reverse scans carry from the last slice to the first; both directions over the same rows
    Case(
        "chunked_scans_both_ways",
        lambda: Model(
            lambda x: (torch.cumsum(x.flip(1), 1).flip(1), torch.cumprod(x.flip(1), 1).flip(1), torch.cumsum(x, 1))
        ),
        [[(3, 21)], [(2, 9)]],
        strategy=CHUNKED,
    ),
    Case("chunked_cumsum_exclusive", lambda: ExclusiveCumsum(1), [[(3, 21)], [(2, 9)]], strategy=CHUNKED),
    # folds from the inputs alone share one loop; the variance after the mean still takes its own
    Case(
        "chunked_sibling_folds",
        lambda: Model(lambda x, y, z: ((x - y).abs().sum(1) - (x - z).pow(2).amax(1), x.var(1), (y * z).mean(1))),
        [[(3, 21)] * 3, [(2, 9)] * 3],
        draw=(_normal, _normal, _normal),
        strategy=CHUNKED,
    ),
    # folds over a non-last dim, chunked: INNER_ROWS rows of the contiguous dim, columns in slices
    Case(
        "chunked_inner_fold",
        lambda: Model(lambda x: (torch.softmax(x, 1), x.argmin(1), x.std(1))),
        [[(3, 37, 5)], [(2, 9, 11)]],
        strategy={"TILE": 64, "INNER_ROWS": 8},
    ),
    # full reductions split over several programs (partials, then one fold)
    Case(
        "split_full_reductions",
        lambda: Model(lambda x, y: (x / torch.norm(x), x.amax(), F.mse_loss(x, y), (x + 2000).var())),
        [[(4, 37, 19), (4, 37, 19)], [(3, 5, 7), (3, 5, 7)]],
        draw=(_normal, _normal),
        strategy={"SPLIT_CHUNK": 16, "SPLIT_PARTS": 8},
    ),
    # numerically hard rows: mean 2000, spread 1
    Case(
        "offset_stats",
        lambda: Model(lambda x: (F.layer_norm(x, (19,)), torch.softmax(x, -1), x.var(-1))),
        [[(4, 3, 19)]],
        offset=True,
    ),
    # pooling: every dim symbolic, padding, dilation, ceil mode, ATen's divisors and indices
    Case(
        "max_pool1d", lambda: nn.MaxPool1d(4, stride=2, padding=2, dilation=3), [[(2, 3, 40)], [(1, 2, 23)]], fp16=True
    ),
    Case(
        "max_pool2d_ceil_indices",
        lambda: nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True, return_indices=True),
        [[(2, 3, 16, 15)], [(1, 2, 9, 12)]],
    ),
    Case("max_pool3d_dilated", lambda: nn.MaxPool3d(2, stride=2, padding=1, dilation=2), [[(1, 2, 7, 8, 9)]]),
    Case("avg_pool1d_padded", lambda: nn.AvgPool1d(8, stride=1, padding=4), [[(2, 3, 30)], [(1, 4, 17)]], fp16=True),
    Case(
        "avg_pool2d_ceil_no_pad_count",
        lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
        [[(2, 3, 16, 15)], [(1, 2, 9, 12)]],
    ),
    Case("avg_pool3d_divisor", lambda: nn.AvgPool3d(2, stride=2, padding=1, divisor_override=5), [[(1, 2, 7, 8, 9)]]),
    # convolutions: window gathers contracted with the weight in one product
    Case("conv1d_strided", lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1), [[(2, 4, 17)], [(1, 4, 12)]]),
    Case(
        "conv2d_asymmetric_dilated_no_bias",
        lambda: nn.Conv2d(4, 6, (3, 5), stride=2, padding=(1, 2), dilation=(2, 1), bias=False),
        [[(2, 4, 13, 12)], [(1, 4, 9, 16)]],
    ),
    Case("conv2d_grouped", lambda: nn.Conv2d(6, 4, 3, padding=1, groups=2), [[(2, 6, 8, 9)]]),
    Case("conv2d_depthwise", lambda: nn.Conv2d(6, 6, 3, padding=1, groups=6), [[(2, 6, 8, 9)]]),
    Case("conv_transpose1d", lambda: nn.ConvTranspose1d(4, 6, 3), [[(2, 4, 7)], [(1, 4, 10)]]),
    Case(
        "conv_transpose2d_strided",
        lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
        [[(2, 4, 5, 6)]],
    ),
]


# --------------------------------------------------------------------------------------------- helpers


def _auto_spec(module: nn.Module, inputs: Sequence[torch.Tensor], op: str = "open.test") -> OpenSpec:
    tensors = tuple(
        (path.replace(".", "_"), path)
        for path, t in list(module.named_parameters()) + list(module.named_buffers())
        if t.is_floating_point()
    )
    floats = []
    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if attr.startswith("_") or attr == "training" or isinstance(value, bool) or not isinstance(value, float):
                continue
            path = f"{prefix}.{attr}" if prefix else attr
            floats.append((path.replace(".", "_"), path))
    names = tuple(f"x{i}" for i in range(len(inputs)))
    return OpenSpec(op, module, names, tuple(inputs), tensors, tuple(floats))


def _resolve(module: nn.Module, path: str) -> Any:
    obj: Any = module
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _kwargs(spec: OpenSpec, module: nn.Module) -> dict[str, Any]:
    return {kp: _resolve(module, path) for kp, path in spec.tensor_params + spec.float_params}


def _load(source: str, tmp_path: Path) -> ModuleType:
    """Import the candidate from a real file (triton reads kernel source with inspect)."""
    name = f"opengen_candidate_{next(_names)}"
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return import_file(path, name)


def _draw(case: Case, shapes: Shapes, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    out = []
    for draw, shape in zip(case.draw, shapes):
        t = draw(*shape)
        if case.offset and t.is_floating_point():
            t = t + 2000.0
        out.append(t)
    return out


def _outputs(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _assert_close(case: Case, got: Any, module: nn.Module, inputs: list[torch.Tensor], dtype: torch.dtype) -> None:
    """entry's outputs vs the module's forward in float64 on the same (rounded) inputs."""
    with torch.no_grad():
        native = _outputs(copy.deepcopy(module).to(dtype)(*inputs))
        ref = _outputs(copy.deepcopy(module).double()(*[t.double() if t.is_floating_point() else t for t in inputs]))
    outs = _outputs(got)
    assert type(got) is type(native[0]) or len(outs) == len(ref), f"{case.id}: output structure differs"
    assert len(outs) == len(ref), f"{case.id}: {len(outs)} outputs, expected {len(ref)}"
    rtol, atol = (1e-4, 1e-5) if dtype == torch.float32 else (1e-2, 2e-3)
    for k, (o, n, r) in enumerate(zip(outs, native, ref)):
        assert o.shape == r.shape, f"{case.id} output {k}: shape {tuple(o.shape)} != {tuple(r.shape)}"
        assert o.dtype == n.dtype, f"{case.id} output {k}: dtype {o.dtype} != {n.dtype}"
        if not o.dtype.is_floating_point:
            assert torch.equal(o.long(), r.long()), f"{case.id} output {k}: integer outputs differ"
            continue
        scale = max(1.0, float(r.abs().max())) if r.numel() else 1.0
        err = (o.double() - r).abs()
        bad = err > atol * scale + rtol * r.abs()
        assert not bool(bad.any()), (
            f"{case.id} output {k} {dtype}: max error {float(err.max()):.3g} (scale {scale:.3g})"
        )


# --------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_candidate_computes_the_module(case: Case, tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = case.module().eval()
    example = _draw(case, case.shapes[0], seed=0)
    spec = _auto_spec(module, example)
    source = write_open_source(spec, case.strategy or None)
    report = check_source(source, "candidate.py", None)
    assert not report.failures, [f.message for f in report.failures]
    assert report.op == "open.test" and report.adapter == spec.adapter
    candidate = _load(source, tmp_path)
    dtypes = [torch.float32] + ([torch.float16] if case.fp16 else [])
    for dtype in dtypes:
        cast = copy.deepcopy(module).to(dtype)
        for seed, shapes in enumerate(case.shapes):
            inputs = [t.to(dtype) if t.is_floating_point() else t for t in _draw(case, shapes, seed)]
            got = candidate.entry(*inputs, **_kwargs(spec, cast))
            _assert_close(case, got, cast, inputs, dtype)


class _LongRowStats(nn.Module):
    """Reductions over dims a parameter fixes (known row lengths): sum, max and a LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(8, 32, 16) + 0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * self.w
        return y.sum(dim=(1, 2, 3)), y.amax(dim=(1, 2, 3)), F.layer_norm(x, (8, 32, 16))


def test_few_long_rows_are_split_over_programs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reductions of rows known to be long (ROW_SPLIT_MIN; lowered here to test at small sizes):
    partials over `_parts` programs per row, then a fold per row, right at any batch size and on
    rows far from zero; rows of a served model's width stay one program each."""
    from gpuyantra.authors.opengen import construct

    monkeypatch.setattr(construct, "ROW_SPLIT_MIN", 1 << 12)
    module = _LongRowStats().eval()
    spec = _auto_spec(module, [torch.randn(3, 8, 32, 16)])
    source = write_open_source(spec, {"SPLIT_CHUNK": 256, "SPLIT_PARTS": 32})
    assert "_parts" in source and "over [s" in source
    candidate = _load(source, tmp_path)
    for batch in (3, 1, 5):
        x = torch.randn(batch, 8, 32, 16) + 2000.0 * (batch == 5)
        got = candidate.entry(x, **_kwargs(spec, module))
        want = copy.deepcopy(module).double()(x.double())
        for g, w, w32 in zip(got, want, module(x)):
            # float32 itself errs on rows at 2000: the verifier's allowance, 16x eager's own error
            allowed = 1e-4 + 1e-4 * w.abs() + 16 * (w32.double() - w).abs().max()
            assert ((g.double() - w).abs() <= allowed).all()
    served = _auto_spec(nn.LayerNorm(1536), [torch.randn(4, 1536)])
    assert "_parts" not in write_open_source(served)


def test_non_contiguous_inputs_are_read_through_strides(tmp_path: Path) -> None:
    module = Model(lambda x, y: torch.softmax(x, 0) + y.sum(1, keepdim=True))
    spec = _auto_spec(module, [torch.randn(6, 5), torch.randn(6, 4)])
    candidate = _load(write_open_source(spec), tmp_path)
    x = torch.randn(5, 6).t()  # a transposed view
    y = torch.randn(6, 8)[:, ::2]  # a strided slice
    assert not x.is_contiguous() and not y.is_contiguous()
    torch.testing.assert_close(candidate.entry(x, y), module(x, y), rtol=1e-5, atol=1e-6)


def test_float_params_are_runtime_arguments(tmp_path: Path) -> None:
    module = RMSNorm(7, eps=1e-5)
    x = torch.randn(3, 7, 5) * 1e-2
    spec = _auto_spec(module, [x])
    assert spec.float_params == (("eps", "eps"),)
    source = write_open_source(spec)
    assert "1e-05" not in source and "1e-5" not in source  # not baked
    candidate = _load(source, tmp_path)
    weight = module.weight.detach()
    small = candidate.entry(x, weight=weight, eps=1e-5)
    large = candidate.entry(x, weight=weight, eps=0.5)
    assert not torch.allclose(small, large)
    module.eps = 0.5
    torch.testing.assert_close(large, module(x), rtol=1e-5, atol=1e-6)


def test_affine_float_param_sites(tmp_path: Path) -> None:
    """`-self.shift` and `self.scale` are both found: the kernel reads shift and scale at run time."""
    module = ScaledClamp()
    x = torch.randn(4, 9)
    spec = _auto_spec(module, [x])
    candidate = _load(write_open_source(spec), tmp_path)
    got = candidate.entry(x, scale=2.0, shift=0.25)
    module.scale, module.shift = 2.0, 0.25
    torch.testing.assert_close(got, module(x))


def test_unused_float_param_is_accepted() -> None:
    """BatchNorm's momentum changes nothing in eval mode: bound, never read."""
    module = _randomize(nn.BatchNorm1d(4))
    spec = _auto_spec(module, [torch.randn(3, 4)])
    assert ("momentum", "momentum") in spec.float_params
    assert "def entry(x0, *," in write_open_source(spec)


@pytest.mark.parametrize(
    ("module", "inputs", "reason"),
    [
        (nn.ConvTranspose2d(4, 4, 3, groups=2), [torch.randn(1, 4, 8, 8)], "grouped transposed convolution"),
        (nn.AdaptiveAvgPool2d(3), [torch.randn(1, 2, 7, 7)], "pool"),
        (Model(lambda x: torch.sort(x, 1).values), [torch.randn(3, 5)], "sort"),
        (Model(lambda x: x[x > 0]), [torch.randn(3, 5)], ""),
        (Model(lambda x: x[:, :3] * 2 if x.shape[1] > 4 else x), [torch.randn(6, 9)], "changes with input sizes"),
    ],
    ids=["grouped_conv_transpose", "adaptive_pool", "sort", "boolean_mask", "size_branch"],
)
def test_unsupported_computations_say_why(module: nn.Module, inputs: list[torch.Tensor], reason: str) -> None:
    spec = _auto_spec(module.eval(), inputs)
    with pytest.raises(Unsupported) as info:
        write_open_source(spec)
    message = str(info.value)
    assert message and "\n" not in message
    assert reason in message


def test_unlocatable_float_param_is_refused() -> None:
    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.threshold = 0.5

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) if self.threshold > 0.4 else x  # used by control flow only

    class Square(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.k = 0.5

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * (self.k * self.k)  # a product of the value with itself: not affine

    assert "def entry" in write_open_source(_auto_spec(Gate(), [torch.randn(3, 4)]))  # same graph: unused
    with pytest.raises(Unsupported, match="non-affine"):
        write_open_source(_auto_spec(Square(), [torch.randn(3, 4)]))


# --------------------------------------------------------------------------------------------- author


def _spec() -> OpenSpec:
    return _auto_spec(nn.LayerNorm(16).eval(), [torch.randn(4, 16)], op="open.layer_norm_test")


def test_strategy_space_is_small_and_starts_at_the_default() -> None:
    space = strategy_space(_spec())
    assert 2 <= len(space) <= 8
    assert space[0] == strategy_space(_spec())[0]
    assert len({tuple(sorted(p.items())) for p in space}) == len(space)


def test_open_author_searches_the_space(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuyantra.authors import open_author

    spec = _spec()
    monkeypatch.setitem(open_author._SPECS, spec.op, spec)
    author = OpenAuthor()
    request = WriteRequest(op=spec.op, module_class="torch.nn.LayerNorm", adapter=spec.adapter)
    first = author.write(request)
    assert first.author == "open" and first.strategy == strategy_space(spec)[0]
    assert not check_source(first.source, "c.py", None).failures
    space = strategy_space(spec)
    history = [Attempt(strategy=first.strategy, reward=1, kernel_us=10.0)]
    seen = [first.strategy]
    while True:
        request.history = history
        try:
            written = author.write(request)
        except ValueError as exc:
            assert str(exc) == "strategies exhausted"
            break
        assert written.strategy not in seen
        seen.append(written.strategy)
        history.append(Attempt(strategy=written.strategy, reward=1, kernel_us=20.0))
    assert len(seen) == len(space)
    assert not author.converged(request)
    request.history = [*history, Attempt(strategy=first.strategy, reward=3, kernel_us=5.0)]
    assert author.converged(request)


def test_next_strategy_moves_near_the_best() -> None:
    space = [
        {"TILE": 4096, "FLAT_BLOCK": 1024},
        {"TILE": 8192, "FLAT_BLOCK": 1024},
        {"TILE": 4096, "FLAT_BLOCK": 4096},
        {"TILE": 16384, "FLAT_BLOCK": 1024},
    ]
    first, _ = next_strategy(space, [])
    assert first["TILE"] == 4096 and first["FLAT_BLOCK"] == 1024
    history = [
        Attempt(strategy=space[0], reward=1, kernel_us=9.0),
        Attempt(strategy=space[1], reward=2, kernel_us=5.0),  # the best: its neighbour comes next
    ]
    chosen, why = next_strategy(space, history)
    assert chosen["TILE"] == 16384 and "best" in why


def test_values_outside_tolerance_on_tensor_cores_move_to_ieee_products() -> None:
    product = Model(lambda a, b: a @ b)
    space = strategy_space(_auto_spec(product, [torch.randn(32, 16), torch.randn(16, 24)], op="open.matmul_test"))
    first, _ = next_strategy(space, [])
    assert first["MM_F32_TC"] == 1
    missed = {"layer": "correctness", "rule": "wrong-values", "message": "output 0: 12 of 8M elements outside atol"}
    chosen, why = next_strategy(space, [Attempt(strategy=first, reward=-1, failures=[missed])])
    assert chosen == {**first, "MM_F32_TC": 0} and "IEEE" in why
    # Another kind of failure keeps the plain order of the space.
    crashed = {"layer": "sandbox", "rule": "crash", "message": "entry raised"}
    chosen, _ = next_strategy(space, [Attempt(strategy=first, reward=-1, failures=[crashed])])
    assert chosen == space[1]


@pytest.mark.parametrize(
    "module",
    [Model(lambda x: torch.cumsum(x.flip(1), 1).flip(1)), ExclusiveCumsum(1)],
    ids=["reverse", "exclusive"],
)
def test_reverse_and_exclusive_scans_are_one_pass(module: nn.Module) -> None:
    # flip-scan-flip and zeros-then-scan read their input once and write the output once: one kernel
    # (single-block and chunked variants), no intermediate buffer.
    source = write_open_source(_auto_spec(module, [torch.randn(4, 13)], op="open.scan_test"), {})
    assert source.count("@triton.jit") == 2 and "_tmp0" not in source, source


def test_window_gathers_and_wide_scans_take_their_own_tiles() -> None:
    # Pooling windows launch with GATHER_BLOCK (smaller programs, gathers mostly cache hits), plain
    # elementwise kernels with FLAT_BLOCK; scans over wide rows slice by SCAN_CHUNK, other row
    # kernels by CHUNK. The strategy space then moves the knobs the file reads.
    pool = _auto_spec(nn.MaxPool1d(4, stride=1, padding=2), [torch.randn(2, 3, 40)])
    pooled = write_open_source(pool)
    assert "_blk = min(GATHER_BLOCK" in pooled and "_blk = min(FLAT_BLOCK" not in pooled
    pool_space = strategy_space(pool)  # once: each call searches the space again
    assert any(p["GATHER_BLOCK"] != pool_space[0]["GATHER_BLOCK"] for p in pool_space)
    wide = write_open_source(_auto_spec(nn.AvgPool2d(9, stride=1, padding=4), [torch.randn(1, 2, 12, 12)]))
    assert "_blk = min(max(16, GATHER_BLOCK // 4)" in wide  # 81 gathers: a large window, smaller programs
    plain = write_open_source(_auto_spec(Model(lambda x: torch.relu(x) * 2), [torch.randn(4, 8)]))
    assert "_blk = min(FLAT_BLOCK" in plain and "GATHER_BLOCK" not in plain.split("def entry")[1]
    scan = _auto_spec(Model(lambda x: torch.cumsum(x.flip(1), 1).flip(1)), [torch.randn(3, 40)])
    scanned = write_open_source(scan)
    assert "BLOCK=SCAN_CHUNK" in scanned and "BLOCK=CHUNK" not in scanned
    scan_space = strategy_space(scan)
    assert any(p["SCAN_CHUNK"] != scan_space[0]["SCAN_CHUNK"] for p in scan_space)
    norm = write_open_source(_auto_spec(nn.LayerNorm(40).eval(), [torch.randn(3, 40)]))
    assert "BLOCK=CHUNK" in norm and "SCAN_CHUNK" not in norm.split("def entry")[1]


def test_run_time_exponents_take_atens_forms(tmp_path: Path) -> None:
    # A norm's p read at run time: 2, 1 and 0.5 as ATen computes them (x * x, x, a square root),
    # every other p through libdevice's pow; each matches the module with that p.
    module = nn.TripletMarginLoss(margin=1.0, p=2.0)
    inputs = [torch.randn(6, 9) for _ in range(3)]
    spec = _auto_spec(module, inputs)
    assert ("p", "p") in spec.float_params
    source = write_open_source(spec)
    assert "_pow_scalar(" in source
    candidate = _load(source, tmp_path)
    for p in (2.0, 1.0, 0.5, 3.0):
        module.p = p
        got = candidate.entry(*inputs, margin=1.0, p=p, eps=module.eps)
        torch.testing.assert_close(got, module(*inputs), rtol=1e-5, atol=1e-6)


def test_independent_folds_share_one_pass() -> None:
    # Two distances from one anchor, chunked: one loop reads the anchor once for both sums.
    module = Model(lambda a, p, n: (a - p).abs().sum(1) + (a - n).abs().sum(1))
    source = write_open_source(_auto_spec(module, [torch.randn(4, 40) for _ in range(3)]), strategy=CHUNKED)
    chunked = source[source.index("def _k0_chunked") :].split("@triton.jit")[0]
    assert chunked.count("for start") == 1 and chunked.count("tl.load(p_x0") == 1
