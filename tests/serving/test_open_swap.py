"""A served model's costliest uncovered module becomes an open target: found by the profiler's
discovery, swapped with parity like a family, rolled back, and re-applied after a restart by name."""

from __future__ import annotations

from pathlib import Path

import torch

from gpuyantra import ops as registry
from gpuyantra.binding import find_module_groups, find_open_groups
from gpuyantra.swap import SwapEngine, swapped_id
from serving.models import load_model

KERNEL = Path(__file__).parent / "open_gelu_kernel.py"
IDS = torch.tensor([[5, 17, 300, 42, 7, 99, 256, 1]])


def _forward(model):
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False).logits


def _gelu_group(model):
    covered = find_module_groups(model)
    groups = find_open_groups(model, lambda: _forward(model), covered)
    [group] = [g for g in groups if g.module_class == "GELUActivation"]
    return covered, groups, group


def test_uncovered_activation_becomes_an_open_group():
    model = load_model("tiny-llama-gelu").model
    covered, groups, group = _gelu_group(model)
    assert "silu_mul" not in {g.op for g in covered}  # exact GELU: no family binds the MLP
    assert group.op.startswith("open.geluactivation_") and group.count == 2
    assert group.adapter == []
    assert all(g.module_class != "Embedding" for g in groups)  # int inputs: no open target
    family = registry.get_op(group.op)
    x = torch.randn(3, 128, dtype=torch.float64)
    torch.testing.assert_close(family.reference(x), torch.nn.functional.gelu(x))


def _candidate(tmp_path: Path, op: str) -> Path:
    path = tmp_path / "gelu_candidate.py"
    path.write_text(KERNEL.read_text().replace("OPNAME", op))
    return path


def test_open_target_swaps_with_parity_rolls_back_and_survives_a_restart(tmp_path):
    model = load_model("tiny-llama-gelu").model
    _, _, group = _gelu_group(model)
    want = _forward(model)
    engine = SwapEngine(model, tmp_path, model_id="tiny-llama-gelu")
    record = engine.swap(_candidate(tmp_path, group.op))
    assert record.status == "committed" and record.modules == 2 and record.op == group.op
    torch.testing.assert_close(_forward(model), want, atol=1e-4, rtol=1e-4)
    gelus = [m for m in model.modules() if type(m).__name__ == "GELUActivation"]
    assert [swapped_id(m) for m in gelus] == [record.swap_id] * 2

    # A new process knows the target only by name: it loads it from the state folder.
    registry._REGISTRY.pop(group.op)
    model2 = load_model("tiny-llama-gelu").model
    engine2 = SwapEngine(model2, tmp_path, model_id="tiny-llama-gelu")
    assert engine2.reapply() == [{"swap_id": record.swap_id, "status": "committed", "reapplied": True}]
    torch.testing.assert_close(_forward(model2), want, atol=1e-4, rtol=1e-4)

    [rolled] = engine2.rollback(record.swap_id)
    assert rolled.status == "rolled_back"
    assert torch.equal(_forward(model2), _forward(load_model("tiny-llama-gelu").model))
