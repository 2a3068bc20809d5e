"""Swapping the `linear` template into the nn.Linear projections of a served tiny Qwen2: parity on
the live weights, restriction to one projection shape, rollback on a wrong kernel, the manifest,
and the engine's static (CUDA-graph) decode path with fused q/k/v and gate/up GEMMs."""

from __future__ import annotations

import pytest
import torch

from gpuyantra.swap import ParityError, SwapEngine, swapped_id
from gpuyantra.swap.guards import serves_kernel
from serving.engine import Engine, GenRequest
from serving.models import load_model
from tests.serving.helpers import PROMPTS, REPO, reference_greedy

LINEAR_KERNEL = REPO / "gpuyantra" / "kernels" / "linear.py"
O_PROJ = {"weight": [64, 64], "bias": None}  # tiny-qwen2: hidden 64, o_proj without bias
IDS = torch.tensor([[5, 17, 300, 42, 7, 99, 256, 1]])


def logits(model):
    with torch.no_grad():
        return model(input_ids=IDS, use_cache=False).logits


def linears(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def test_swap_restricted_to_one_projection_shape_then_all_and_rollback(tmp_path):
    model = load_model("tiny-qwen2").model
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    want = logits(model)
    record = engine.swap(LINEAR_KERNEL, param_shapes=O_PROJ)
    assert record.status == "committed" and record.op == "linear" and record.module_class == "Linear"
    assert record.module_names == ["model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"]
    assert record.requested_param_shapes == O_PROJ and record.parity["max_abs_err"] < 1e-4
    assert {n for n, m in linears(model).items() if swapped_id(m)} == set(record.module_names)
    torch.testing.assert_close(logits(model), want, atol=1e-4, rtol=1e-4)
    assert record.calls == 2  # the served forward ran the kernel in both o_proj

    engine.rollback(all=True)
    everything = engine.swap(LINEAR_KERNEL)  # no restriction: every Linear shape of the model
    assert everything.modules == len(linears(model)) == 15
    torch.testing.assert_close(logits(model), want, atol=1e-4, rtol=1e-4)
    engine.rollback(everything.swap_id)
    assert not any(swapped_id(m) for m in linears(model).values())
    assert torch.equal(logits(model), want)


def test_manifest_reapplies_the_shape_restriction(tmp_path):
    model = load_model("tiny-qwen2").model
    record = SwapEngine(model, tmp_path, model_id="tiny-qwen2").swap(LINEAR_KERNEL, param_shapes=O_PROJ)
    other = load_model("tiny-qwen2").model  # a restarted server: same weights, nothing bound
    results = SwapEngine(other, tmp_path, model_id="tiny-qwen2").reapply()
    assert results == [{"swap_id": record.swap_id, "status": "committed", "reapplied": True}]
    assert {n for n, m in linears(other).items() if swapped_id(m)} == set(record.module_names)


def test_a_rows_gate_serves_the_rows_the_kernel_lost_with_the_original_and_survives_a_restart(tmp_path):
    model = load_model("tiny-qwen2").model
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    gate = {"kernel": [1, 54], "original": [8]}  # as timed: faster at 1 and 54 rows, slower at 8
    record = engine.swap(LINEAR_KERNEL, param_shapes=O_PROJ, rows_gate=gate)
    assert record.rows_gate == gate and record.calls == record.original_calls == 0  # parity calls do not count
    o_proj = model.model.layers[0].self_attn.o_proj
    for rows, kernel_calls, original_calls in ((1, 1, 0), (6, 1, 1), (8, 1, 2), (30, 2, 2), (100, 3, 2)):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(o_proj(x), torch.nn.functional.linear(x, o_proj.weight), atol=1e-4, rtol=1e-4)
        assert (record.calls, record.original_calls) == (kernel_calls, original_calls), rows
    other = load_model("tiny-qwen2").model  # a restarted server keeps the gate
    restarted = SwapEngine(other, tmp_path, model_id="tiny-qwen2")
    restarted.reapply()
    assert restarted.active()[0]["rows_gate"] == gate
    counted = restarted.active()[0]["original_calls"]
    other.model.layers[0].self_attn.o_proj(torch.randn(8, 64))
    assert restarted.active()[0]["original_calls"] == counted + 1


def test_a_rows_gate_follows_the_nearest_timed_row_count():
    gate = {"kernel": [1, 54], "original": [8]}
    assert [serves_kernel(gate, rows) for rows in (1, 2, 3, 4, 8, 16, 20, 21, 54, 4096)] == [
        True,  # timed
        True,  # nearer 1 than 8 (ratios 2 and 4)
        False,  # nearer 8 (ratio 2.67) than 1 (3)
        False,  # 4: ratio 4 from 1, 2 from 8
        False,
        False,  # 16: ratio 2 from 8, 3.4 from 54
        False,
        True,  # 21: ratio 2.57 from 54, 2.625 from 8
        True,
        True,
    ]
    assert serves_kernel(None, 8) and serves_kernel({"kernel": [1], "original": []}, 8)
    assert not serves_kernel({"kernel": [], "original": [8]}, 1)  # slower everywhere it was timed
    assert not serves_kernel({"kernel": [2], "original": [8]}, 4)  # a tie goes to the original


def test_a_wrong_linear_kernel_is_rolled_back_everywhere(tmp_path):
    model = load_model("tiny-qwen2").model
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    source = (REPO / "tests" / "verifier" / "candidates" / "cheat_linear_k_cap.py").read_text()
    source = source.replace("64 * BLOCK_K", "1 * BLOCK_K").replace("BLOCK_K=128)", "BLOCK_K=16)")  # K cap 16
    with pytest.raises(ParityError, match="parity failed"):
        engine.swap(source=source)
    assert not any(swapped_id(m) for m in linears(model).values())
    assert engine.history()[-1]["status"] == "rolled_back"


def test_engine_swaps_the_fused_projections_under_the_graph_decode_path(tmp_path):
    loaded = load_model("tiny-qwen2")
    want = [reference_greedy(loaded.model, p, 4) for p in PROMPTS[:3]]
    engine = Engine(loaded, state_dir=tmp_path, max_batch=2, max_seq_len=64, cuda_graphs=True, fuse_projections="on")
    fused_qkv = {"weight": [128, 64], "bias": [128]}  # q 64 + k 32 + v 32 rows, with Qwen2's bias
    variants = {g.variant: g.names for g in engine.groups if g.op == "linear"}
    assert variants["weight=128x64,bias=128"] == [
        "model.layers.0.self_attn.fused_q_proj_k_proj_v_proj",
        "model.layers.1.self_attn.fused_q_proj_k_proj_v_proj",
    ]
    assert not any("q_proj" == name.rsplit(".", 1)[-1] for names in variants.values() for name in names)
    engine.start()
    try:
        captures = engine.graphs.captures
        record = engine.call(lambda: engine.swaps.swap(LINEAR_KERNEL, param_shapes=fused_qkv)).result()
        assert record.status == "committed" and record.modules == 2
        assert record.parity["graph"]["buckets"] == [1, 2]  # re-captured and checked on the graph path
        assert engine.graphs.captures == captures + 1
        reqs = [engine.submit(GenRequest(p, 4)) for p in PROMPTS[:3]]
        for r in reqs:
            assert r.done.wait(120)
        assert [r.output_ids for r in reqs] == want
        assert engine.swaps.get(record.swap_id)["calls"] > 0  # the fused GEMM ran the kernel
        engine.call(lambda: engine.swaps.rollback(all=True)).result()
        assert engine.graphs.captures == captures + 2
    finally:
        engine.stop()
