"""Model binding on tiny random-weight models of every listed architecture: which module classes
bind to which family (by computation), and that swapping in the template kernels keeps the
model's logits (float32, Triton interpreter)."""

from __future__ import annotations

import types

import pytest
import torch

from gpuyantra.binding import find_module_groups
from gpuyantra.ops import get_op

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    vocab_size=128,
    head_dim=16,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

ARCHS = {
    # model_type: (extra config, expected {(op, module class)}); every arch also binds `linear` to
    # its nn.Linear projections and lm_head (LINEAR below), one group per weight shape.
    "llama": ({}, {("rms_norm", "LlamaRMSNorm"), ("silu_mul", "LlamaMLP")}),
    "mistral": ({}, {("rms_norm", "MistralRMSNorm"), ("silu_mul", "MistralMLP")}),
    "qwen2": ({}, {("rms_norm", "Qwen2RMSNorm"), ("silu_mul", "Qwen2MLP")}),
    "qwen3": ({}, {("rms_norm", "Qwen3RMSNorm"), ("silu_mul", "Qwen3MLP")}),
    "gemma": ({}, {("gemma_rms_norm", "GemmaRMSNorm"), ("gelu_tanh_mul", "GemmaMLP")}),
    "gemma2": ({}, {("gemma_rms_norm", "Gemma2RMSNorm"), ("gelu_tanh_mul", "Gemma2MLP")}),
    "gemma3_text": ({}, {("gemma_rms_norm", "Gemma3RMSNorm"), ("gelu_tanh_mul", "Gemma3MLP")}),
    "phi3": ({}, {("rms_norm", "Phi3RMSNorm"), ("silu_mul", "Phi3MLP")}),
    "gpt2": (dict(n_embd=64, n_head=4, n_layer=2, n_inner=128, n_positions=64), {("layer_norm", "LayerNorm")}),
    "granite": ({}, {("rms_norm", "GraniteRMSNorm"), ("silu_mul", "GraniteMLP")}),
    "olmo2": ({}, {("rms_norm", "Olmo2RMSNorm"), ("silu_mul", "Olmo2MLP")}),
    # MoE: the shared parts bind (norms, the shared expert MLP); fused experts are not a family.
    "qwen2_moe": (
        dict(moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2),
        {("rms_norm", "Qwen2MoeRMSNorm"), ("silu_mul", "Qwen2MoeMLP")},
    ),
    "mixtral": (dict(num_local_experts=4, num_experts_per_tok=2), {("rms_norm", "MixtralRMSNorm")}),
}


LINEAR = ("linear", "Linear")


def tiny_model(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    extra, _ = ARCHS[model_type]
    config = AutoConfig.for_model(model_type, **COMMON, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    # Random-weight models start norms at 1 (or 0 for Gemma): move them off so bindings matter.
    with torch.no_grad():
        for _, param in model.named_parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.3)
    return model


@pytest.mark.parametrize("model_type", list(ARCHS))
def test_bindings_and_logits_with_template_kernels(model_type, load_rendered):
    model = tiny_model(model_type)
    groups = find_module_groups(model)
    bound = {(g.op, g.module_class) for g in groups}
    assert bound == ARCHS[model_type][1] | {LINEAR}
    for group in groups:
        if group.module_class.startswith("Gemma"):
            assert group.op != "rms_norm"  # a Gemma norm must never receive plain rms_norm
        if group.op == "linear":  # one group per weight shape (lm_head alone): shapes all alike
            weights = {tuple(model.get_submodule(n).weight.shape) for n in group.names}
            assert weights == {tuple(group.param_shapes["weight"])}
        else:
            assert group.count >= 2

    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
    for group in groups:
        family = get_op(group.op)
        candidate = load_rendered(group.op, adapter=group.adapter)
        for name in group.names:
            module = model.get_submodule(name)
            forward = family.replacement_forward(module, candidate.entry, candidate.adapter)
            module.forward = types.MethodType(forward, module)
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_rope_kernel_in_a_llama_attention(load_rendered, monkeypatch):
    """No module computes rope; its kernel replaces the module-level `apply_rotary_pos_emb`."""
    from transformers.models.llama import modeling_llama

    model = tiny_model("llama")
    ids = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits
    entry = load_rendered("rope").entry
    calls = []

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        calls.append(q.shape)
        return entry(q, k, cos, sin)

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", apply_rotary_pos_emb)
    with torch.no_grad():
        got = model(ids).logits
    assert len(calls) == 2
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def test_find_module_groups_restricted_to_ops():
    model = tiny_model("gemma")
    assert {g.op for g in find_module_groups(model, ops=["gemma_rms_norm"])} == {"gemma_rms_norm"}
    assert find_module_groups(model, ops=["rms_norm"]) == []
