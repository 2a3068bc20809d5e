"""How the parent judges outputs, not what it decides: the element-wise comparison in few tensor ops
with one read back from the device, and each judging on a CUDA stream of its own. Six verifications
judging in one worker at once queued every kernel on the one default stream, each behind the
others', and waited for the device two or three times per call: their judging took 6-12x one's.

What it decides is pinned here against a per-element definition written out in Python, with NaN,
Inf and values past the output dtype's range in both the output and the reference."""

from __future__ import annotations

import contextlib
import math
import random
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gpuyantra.verifier.judge as judge_module
from gpuyantra.ops import get_op
from gpuyantra.verifier.cases import plan
from gpuyantra.verifier.judge import (
    CONDITIONING_SLACK,
    OutputValues,
    References,
    _conditioning_slack,
    compare_values,
    judging_stream,
)
from tests.verifier.conftest import module_outputs

SPECS = [{"name": "weight", "kind": "tensor", "shape": ["H"]}, {"name": "eps", "kind": "float", "value": 1e-6}]
SPECIALS = [float("nan"), float("inf"), -float("inf"), 1e6, -7e4, 3.5e38]  # past bf16/f16/f32 ranges too


class _Ops(TorchDispatchMode):
    """Counts the tensor ops dispatched inside."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _spec(got, want, tol, slack=None, bound=None) -> tuple[bool, int, tuple[int, ...], str] | None:  # noqa: ANN001
    """compare_values's decision, element by element in Python floats: an element is judged where
    the reference fits the output's dtype; there a NaN/Inf output fails first, then |got - want| past
    atol + rtol |want| + slack + bound. Where the reference is NaN (a softmax row masked whole) the
    output must be NaN too. None, or (NaN/Inf?, how many elements, the first, what the message says
    of them)."""
    atol, rtol = tol
    flat_got, flat_want = got.reshape(-1), want.reshape(-1)
    extra = [torch.zeros_like(want) if t is None else t.expand_as(want).reshape(-1) for t in (slack, bound)]
    nonfinite, wrong, errors = [], [], []
    for i in range(want.numel()):
        w, g = float(flat_want[i]), float(flat_got[i])
        judged = math.isfinite(float(flat_want[i].to(got.dtype)))
        allowed = atol + rtol * abs(w) + float(extra[0].reshape(-1)[i]) + float(extra[1].reshape(-1)[i])
        errors.append(abs(g - w) if judged else 0.0)
        if judged and not math.isfinite(g):
            nonfinite.append(i)
        if (not math.isnan(g)) if math.isnan(w) else not (errors[-1] <= allowed):
            wrong.append(i)
    failed = nonfinite or wrong
    if not failed:
        return None
    first = tuple(int(d) for d in torch.unravel_index(torch.tensor(failed[0]), want.shape))
    if nonfinite:
        return True, len(nonfinite), first, f"first at {first}, on"
    # The largest error over every element (those not judged count 0), then the first one's values.
    said = (
        f"max abs err {max(errors):.3g}, first at {first}: got {float(got[first]):.6g}, want {float(want[first]):.6g})"
    )
    return False, len(wrong), first, said


def _draw(rng: random.Random, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A reference, and an output that is its rounding with a few elements off, special or past range."""
    want = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(rng.randrange(2**31)))
    flat = want.reshape(-1)
    for _ in range(rng.randrange(3)):
        flat[rng.randrange(flat.numel())] = rng.choice(SPECIALS)
    got = want.to(dtype)
    flat = got.reshape(-1)
    for _ in range(rng.randrange(3)):
        i = rng.randrange(flat.numel())
        value = rng.choice([*SPECIALS, float(flat[i]) + rng.choice([1e-6, 1e-3, 0.05, 3.0])])
        flat[i : i + 1] = torch.tensor([value], dtype=torch.float64)  # past the dtype's range: inf
    return got, want


def test_the_comparison_decides_as_the_per_element_definition():
    rng = random.Random(7)
    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
    shapes = [(), (9,), (3, 5), (2, 3, 4)]
    seen = Counter()
    for trial in range(500):
        dtype, shape = rng.choice(dtypes), rng.choice(shapes)
        got, want = _draw(rng, shape, dtype)
        tol = {torch.bfloat16: (8e-3, 8e-3), torch.float16: (1e-3, 1e-3)}.get(dtype, (1e-5, 1e-5))
        row = (*shape[:-1], 1) if shape else ()
        slack = rng.choice([None, torch.rand(row, dtype=torch.float64) * 0.01, torch.rand(shape, dtype=torch.float64)])
        bound = rng.choice([None, torch.rand(shape, dtype=torch.float64) * 0.1])
        expected = _spec(got, want, tol, slack, bound)
        finding = compare_values(got, want, tol, 1, f"trial {trial}", slack, bound)
        if expected is None:
            assert finding is None, (trial, finding)
            seen["pass"] += 1
            continue
        nonfinite, count, _, said = expected
        assert finding is not None and finding.nonfinite == nonfinite and finding.rule is None, (trial, finding)
        assert f"output 1: {count} of {got.numel()} elements" in finding.message and said in finding.message, trial
        seen["nonfinite" if nonfinite else "wrong"] += 1
    assert min(seen.values()) >= 40, seen  # every outcome drawn often


def test_the_conditioning_slack_is_the_rms_of_the_finite_float32_errors():
    want = torch.randn(4, 6, dtype=torch.float64)
    float32 = (want * 1.001).float()
    float32[1, 2], float32[3, 0] = float("nan"), float("inf")
    slack = _conditioning_slack(float32, want)
    assert slack is not None and slack.shape == (4, 1)
    for r in range(4):
        errors = [abs(float(float32[r, c]) - float(want[r, c])) for c in range(6)]
        rms = math.sqrt(sum(e * e for e in errors if math.isfinite(e)) / 6)
        assert float(slack[r, 0]) == pytest.approx(CONDITIONING_SLACK * rms, rel=1e-12)


def test_a_passing_output_is_judged_in_few_ops_and_one_read_back():
    # Before: 39 ops, two of them a wait for the device each (`bool(mask.any())`); each op a kernel
    # launch and a pass over up to 12M elements.
    want = torch.randn(4, 8, dtype=torch.float64)
    float32, got = want.float(), want.to(torch.bfloat16)
    with _Ops() as counted:
        slack = _conditioning_slack(float32, want)
        assert compare_values(got, want, (8e-3, 8e-3), 0, "case", slack) is None
    # One scalar read back per output, none per element: whether the reference holds a NaN (a softmax
    # row masked whole), which must then be matched by NaN in the output.
    assert counted.ops["aten._local_scalar_dense.default"] <= 1
    assert sum(counted.ops.values()) <= 30, counted.ops  # 27, and the NaN check's isnan, any, read back


def test_each_chunk_and_each_missing_call_is_judged_inside_a_judging_stream(monkeypatch):
    family = get_op("rms_norm")
    cases = plan("cpu", [[2, 16]], ["float32"], (0,))
    entered: list[str] = []

    @contextlib.contextmanager
    def stream(device):  # noqa: ANN001, ANN202
        entered.append(str(device))
        yield

    monkeypatch.setattr(judge_module, "judging_stream", stream)
    values = OutputValues(family, cases, References(family, SPECS, "cpu"))
    values.consume(module_outputs(family, cases[:-1], SPECS))
    assert entered == ["cpu"] and all(not values.of(c).findings for c in cases[:-1])
    assert values.of(cases[-1]).findings[0].rule == "output-type"  # never arrived: judged missing
    assert entered == ["cpu", "cpu"]


class _FakeStream:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.waited_for: list[_FakeStream] = []

    def wait_stream(self, other: _FakeStream) -> None:
        self.waited_for.append(other)


def test_concurrent_judgings_get_streams_of_their_own_and_give_them_back(monkeypatch):
    current: list[_FakeStream] = []
    caller = _FakeStream(torch.device("cuda", 0))  # the thread's stream before any judging

    @contextlib.contextmanager
    def use(stream):  # noqa: ANN001, ANN202
        current.append(stream)
        yield
        current.pop()

    monkeypatch.setattr(judge_module, "_FREE_STREAMS", {})
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", use)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[-1] if current else caller)
    with judging_stream("cuda"):
        first = current[-1]
        with judging_stream("cuda:0"):  # a second judging at the same time: another stream
            second = current[-1]
            assert second is not first
    assert current == []
    # Each queues behind the work its caller's stream had queued (outputs still being copied there).
    assert first.waited_for == [caller] and second.waited_for == [first]
    with judging_stream("cuda"), judging_stream("cuda"):
        assert {id(s) for s in current} == {id(first), id(second)}  # taken back from the pool
    assert {torch.device("cuda", 0)} == set(judge_module._FREE_STREAMS)
    assert sorted(map(id, judge_module._FREE_STREAMS[torch.device("cuda", 0)])) == sorted((id(first), id(second)))
    with judging_stream("cpu"):
        assert current == []  # the CPU has no streams: nothing changes


def test_a_chunk_is_read_back_from_the_device_once_and_a_failing_output_again_for_its_message(monkeypatch):
    # Before: one wait per output; on a GPU shared with the children each wait was a turn of theirs.
    family = get_op("rms_norm")
    cases = plan("cpu", [[3, 32]], ["float32"], (0, 1))
    reads: list[int] = []
    tolist = torch.Tensor.tolist

    def counted(self):  # noqa: ANN001, ANN202
        reads.append(self.numel())
        return tolist(self)

    def poison(out: torch.Tensor) -> None:
        out.view(-1)[5] = float("nan")

    passing, failing = module_outputs(family, cases, SPECS), module_outputs(family, cases, SPECS, {cases[2].id: poison})
    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    values = OutputValues(family, cases, References(family, SPECS, "cpu"))
    values.consume(passing)
    assert len(cases) >= 3 and reads == [2 * len(cases)]  # every output's two counts, in one read
    assert all(not values.of(c).findings for c in cases)
    reads.clear()
    values = OutputValues(family, cases, References(family, SPECS, "cpu"))
    values.consume(failing)
    assert reads == [2 * len(cases), 2]  # the chunk once, the failing output again for its message
    finding = values.of(cases[2]).findings[0]
    assert finding.nonfinite and "1 of 96 elements are NaN/Inf" in finding.message
    assert all(not values.of(c).findings for c in cases if c.id != cases[2].id)
