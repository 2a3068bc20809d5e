"""An open target serves every way the live model calls its module, not only the call it was built from.

Qwen2's rotary embedding, `forward(x, position_ids) -> (cos, sin)`, is called with position_ids
(1, S) in a prefill and (B, 1) in a batched decode. Every input's sizes come from the call: the
target links a later input's dims to input 0's (a batch or a sequence of one included) and learns
from all the live calls it saw; the open author's kernel is right at each of them; the verifier's
cases hold every captured call's shapes for every input with distinct positions per row (a kernel
that bakes batch 1 fails there); the swap's parity check runs at every captured call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from torch import nn

from gpuyantra.authors.open_author import spec_from_target
from gpuyantra.authors.opengen import Unsupported, write_open_source
from gpuyantra.candidate import import_file
from gpuyantra.ops.open import build_open_target, register_open
from gpuyantra.verifier import run_verification

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's masked lanes

CANDIDATE = Path(__file__).parent / "open_candidates" / "rotary.py"
HIDDEN, HEADS = 64, 4  # head dim 16
PREFILL = (torch.randn(1, 7, HIDDEN), torch.arange(7)[None])
DECODE = (torch.randn(4, 1, HIDDEN), torch.tensor([[5], [17], [100], [2047]]))  # a position per row
LONE = (torch.randn(1, 1, HIDDEN), torch.tensor([[9]]))
BAKE_BATCH = ("batch, seq = position_ids.shape[0], position_ids.shape[1]", "batch, seq = 1, position_ids.shape[1]")


def _rotary() -> nn.Module:
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    config = transformers.Qwen2Config(
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=2, intermediate_size=128,
        num_hidden_layers=1, vocab_size=100, max_position_embeddings=4096,
    )  # fmt: skip
    return Qwen2RotaryEmbedding(config).eval()


def _shapes(call) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(t.shape) for t in call)


def _kwargs(target, module: nn.Module) -> dict:
    return {p.kernel_param: getattr(module, p.module_attr) for p in target.params}


@pytest.mark.parametrize(
    ("built", "others"), [(PREFILL, (DECODE, LONE)), (DECODE, (PREFILL, LONE))], ids=["prefill", "decode"]
)
def test_a_target_built_from_one_call_is_right_at_the_others(built, others, tmp_path):
    module = _rotary()
    target = build_open_target(module, built, name_hint="rotary")
    # The positions follow x's batch and sequence dims, a size of 1 included.
    assert target.links[1] == ((0, 0), (1, 1))
    assert target.shapes_for((4, 1, HIDDEN)) == [(4, 1, HIDDEN), (4, 1)]
    assert target.shapes_for((1, 7, HIDDEN)) == [(1, 7, HIDDEN), (1, 7)]
    path = tmp_path / "rotary_author.py"
    path.write_text(write_open_source(spec_from_target(target)))
    entry = import_file(path, f"rotary_author_{id(path)}").entry
    for x, positions in (built, *others):
        got, want = entry(x, positions, **_kwargs(target, module)), module(x, positions)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_every_captured_call_is_a_case_with_distinct_positions_per_row():
    target = build_open_target(_rotary(), DECODE, name_hint="rotary", calls=[_shapes(PREFILL), _shapes(LONE)])
    assert target.calls == (_shapes(DECODE), _shapes(PREFILL), _shapes(LONE))
    shapes, _ = target.case_shapes("cpu", None)
    assert [4, 1, HIDDEN] in shapes and [1, 7, HIDDEN] in shapes and [1, 1, HIDDEN] in shapes
    # Positions are not class ids: their range does not follow a dim (of size 1 in a decode).
    assert target.inputs[1].high_dim == -1
    for seed in range(8):
        x, positions = target.example_inputs(target.shapes_for([4, 1, HIDDEN]), seed=seed)
        assert positions.shape == (4, 1) and len(set(positions.flatten().tolist())) > 1


class _Scores(nn.Module):
    """q (B, D) against a cache k (B, T, D): T changes between calls without following q."""

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (q[:, None, :] * k).sum(-1).softmax(-1)


class _Add(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + 2 * y


def test_sizes_that_change_between_calls_are_variable_and_every_call_is_a_case(tmp_path):
    module = _Scores()
    q, k = torch.randn(2, 8), torch.randn(2, 5, 8)
    target = build_open_target(module, (q, k), name_hint="scores", calls=[((2, 8), (2, 9, 8)), ((3, 8), (3, 1, 8))])
    assert target.links[1] == ((0, 0), (2, 1)) and target.free == (((1, 1),),)
    assert target.variable_dims[1] == (0, 1, 2)
    shapes, _ = target.case_shapes("cpu", None)
    # A call the links do not give is named by every input's shape.
    assert [2, 8, 2, 9, 8] in shapes and [3, 8, 3, 1, 8] in shapes
    assert target.shapes_for([3, 8, 3, 1, 8]) == [(3, 8), (3, 1, 8)]
    path = tmp_path / "scores.py"
    path.write_text(write_open_source(spec_from_target(target)))
    entry = import_file(path, "scores_author").entry
    for call in target.calls:
        args = [torch.randn(s) for s in call]
        torch.testing.assert_close(entry(*args), module(*args))
    with pytest.raises(ValueError, match="shape"):  # a dim the target fixes is checked, never assumed
        entry(torch.randn(2, 8), torch.randn(2, 5, 6))


def test_the_author_refuses_a_live_call_its_trace_cannot_compute():
    # Built from y (4, H), called live with y (1, H): traced as a y of x's rows, the kernel would
    # read past y's one row; the author says why instead of writing it.
    target = build_open_target(
        _Add(), (torch.randn(4, 8), torch.randn(4, 8)), name_hint="add", calls=[((4, 8), (1, 8))]
    )
    with pytest.raises(Unsupported, match=r"live call passes y of shape \[1, 8\]"):
        write_open_source(spec_from_target(target))
    # Built from the broadcast call, the same module is written and right at both calls.
    target = build_open_target(
        _Add(), (torch.randn(1, 8), torch.randn(1, 8)), name_hint="add", calls=[((4, 8), (1, 8))]
    )
    assert [4, 8] in target.case_shapes("cpu", None)[0] and target.shapes_for([4, 8]) == [(4, 8), (1, 8)]


def _candidate(tmp_path: Path, op: str, bake: bool) -> Path:
    source = CANDIDATE.read_text().replace("OPNAME", op)
    if bake:
        assert BAKE_BATCH[0] in source
        source = source.replace(*BAKE_BATCH)
    path = tmp_path / ("baked.py" if bake else "honest.py")
    path.write_text(source)
    return path


def test_the_verifier_rejects_a_rotary_kernel_that_bakes_batch_one(tmp_path):
    # Built from a prefill (batch 1) alone: the cases still draw other batches, positions per row.
    target = build_open_target(_rotary(), PREFILL, name_hint="rotary")
    register_open(target)
    honest = run_verification(_candidate(tmp_path, target.op, False), device="cpu", seeds=(0,), dtypes=["float32"])
    assert honest.accepted, honest.failures
    baked = run_verification(_candidate(tmp_path, target.op, True), device="cpu", seeds=(0,), dtypes=["float32"])
    assert not baked.accepted
    assert {f.rule for f in baked.failures} & {"output-shape", "wrong-values"}, baked.failures


def test_the_swap_checks_parity_at_every_captured_call(tmp_path):
    from gpuyantra.binding import find_module_groups, find_open_groups
    from gpuyantra.swap import SwapEngine
    from gpuyantra.swap.records import ParityError
    from serving.models import load_model

    model = load_model("tiny-qwen2").model

    def workloads() -> None:  # a prefill, then a batched decode step with a position per row
        with torch.no_grad():
            model(input_ids=torch.tensor([[5, 17, 300, 42, 7, 99, 256]]), use_cache=False)
            model(input_ids=torch.tensor([[3], [4], [5], [6]]), position_ids=DECODE[1], use_cache=False)

    groups = find_open_groups(model, workloads, find_module_groups(model))
    [group] = [g for g in groups if g.module_class == "Qwen2RotaryEmbedding"]
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    with pytest.raises(ParityError, match=r"\[4, 1, 64\]"):
        engine.swap(_candidate(tmp_path, group.op, True))
    record = engine.swap(_candidate(tmp_path, group.op, False))
    assert record.status == "committed"
    assert [1, 7, 64] in record.parity["shapes"] and [4, 1, 64] in record.parity["shapes"]
