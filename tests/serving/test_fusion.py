"""Sibling projections fused into one GEMM (`serving/fusion.py`): same outputs, weights stay live
views, foreign calls unaffected, unfuse restores; and the engine serves the reference tokens with
fusion, the Triton decode attention and the campaign's swaps together."""

from __future__ import annotations

import copy

import torch

from serving import fusion
from serving.models import load_model
from tests.serving.helpers import REPO, logits


def test_fused_model_matches_and_weights_stay_live():
    model = load_model("tiny-qwen2").model
    plain = copy.deepcopy(model)
    layers = len(model.model.layers)
    assert fusion.fuse(model) == 2 * layers  # q/k/v and gate/up per layer
    assert fusion.fuse(model) == 2 * layers  # idempotent
    torch.testing.assert_close(logits(model), logits(plain), atol=1e-5, rtol=1e-5)
    attn = model.model.layers[0].self_attn
    fused_weight = model._gpuyantra_fused[0].weight
    assert attn.k_proj.weight.data_ptr() == fused_weight[attn.q_proj.weight.shape[0] :].data_ptr()
    with torch.no_grad():  # an in-place update through the sibling's parameter reaches the fused GEMM
        attn.k_proj.weight.mul_(1.5)
        plain.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
    torch.testing.assert_close(logits(model), logits(plain), atol=1e-5, rtol=1e-5)
    x = torch.randn(2, attn.k_proj.in_features)  # a foreign call never gets another input's slice
    torch.testing.assert_close(attn.k_proj(x), torch.nn.functional.linear(x, attn.k_proj.weight, attn.k_proj.bias))
    fusion.unfuse(model)
    assert "forward" not in attn.q_proj.__dict__ and not hasattr(model, "_gpuyantra_fused")
    torch.testing.assert_close(logits(model), logits(plain), atol=1e-5, rtol=1e-5)


def test_engine_with_fusion_attention_and_swaps_serves_the_reference_tokens(tmp_path):
    from serving.engine import Engine, GenRequest
    from tests.serving.helpers import PROMPTS, reference_greedy

    loaded = load_model("tiny-qwen2")
    want = [reference_greedy(loaded.model, p, 4) for p in PROMPTS]
    engine = Engine(
        loaded,
        state_dir=tmp_path,
        max_batch=4,
        max_seq_len=64,
        cuda_graphs=True,
        decode_attention="triton",
        fuse_projections="on",
        fuse_norms="on",
    )
    assert engine.fused_projections == 2 * len(loaded.model.model.layers)
    assert engine.fused_residual_norms == len(loaded.model.model.layers) and engine.norm_fusion_refused is None
    engine.start()
    try:
        for name in ("rms_norm", "rope", "silu_mul", "add_rms_norm"):
            record = engine.call(lambda n=name: engine.swaps.swap(REPO / "gpuyantra" / "kernels" / f"{n}.py")).result()
            assert record.status == "committed", (name, record.parity)
        assert record.modules == len(loaded.model.model.layers)  # add_rms_norm: one ResidualNorm a layer
        reqs = [engine.submit(GenRequest(p, 4)) for p in PROMPTS]
        for r in reqs:
            assert r.done.wait(300)
        assert [r.output_ids for r in reqs] == want
    finally:
        engine.call(lambda: engine.swaps.rollback(all=True)).result()
        engine.stop()
        from transformers.models.qwen2 import modeling_qwen2

        assert "apply_rotary_pos_emb" in vars(modeling_qwen2)
