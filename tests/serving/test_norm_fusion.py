"""A decoder layer's first residual add and post-attention norm as one call (`serving/norm_fusion.py`):
bitwise the modeling code's logits, the `add_rms_norm` family binds to the new call and the verifier
judges at it, a layer of another data flow is left alone (the engine serving with the kernel swapped
in: tests/serving/test_fusion.py)."""

from __future__ import annotations

import copy

import torch

from gpuyantra.binding import find_module_groups
from serving import fusion, norm_fusion
from serving.models import load_model
from tests.serving.helpers import REPO, logits


def test_fused_layers_are_bitwise_the_modeling_code_and_bind_add_rms_norm():
    model = load_model("tiny-qwen2").model
    plain = copy.deepcopy(model)
    layers = len(model.model.layers)
    fusion.fuse(model)  # with fused projections too, as served on a GPU
    assert norm_fusion.fuse(model) == (layers, None)
    assert norm_fusion.fuse(model) == (layers, None)  # idempotent
    assert torch.equal(logits(model), logits(plain))
    groups = {g.op: g for g in find_module_groups(model)}
    assert groups["add_rms_norm"].module_class == "ResidualNorm"
    assert groups["add_rms_norm"].count == layers
    layer = model.model.layers[0]
    assert layer.post_attention_residual_norm.weight is layer.post_attention_layernorm.weight  # live weights
    norm_fusion.unfuse(model)
    assert "forward" not in layer.__dict__ and not hasattr(layer, norm_fusion.CHILD)
    assert torch.equal(logits(model), logits(plain))


def test_the_verifier_judges_the_add_rms_norm_template_against_the_fused_class(tmp_path):
    """The campaign verifies at the bound class: it must build alone (from a hidden size) with the
    attributes the template's ADAPTER reads."""
    from gpuyantra import verifier

    path = tmp_path / "add_rms_norm.py"
    path.write_text((REPO / "gpuyantra" / "kernels" / "add_rms_norm.py").read_text())
    verdict = verifier.verify(path, device="cpu", module_class="serving.norm_fusion.ResidualNorm", shapes=[[3, 64]])
    assert verdict.accepted, [f"{f.layer}/{f.rule}: {f.message}" for f in verdict.failures]


def test_a_layer_whose_forward_differs_keeps_the_modeling_code():
    """Names alone never decide: a layer class with the four children but another data flow (here the
    add after the norm is dropped) gives other logits, so nothing is rewritten and the reason is said."""
    model = load_model("tiny-qwen2").model
    layer_class = type(model.model.layers[0])

    class ParallelLayer(layer_class):  # attention and MLP both read the input norm, one residual
        def forward(self, hidden_states, **kwargs):
            normed = self.input_layernorm(hidden_states)
            attn = self.self_attn(hidden_states=normed, **kwargs)[0]
            return hidden_states + attn + self.mlp(self.post_attention_layernorm(normed))

    for layer in model.model.layers:
        layer.__class__ = ParallelLayer
    before = logits(model)
    fused, why = norm_fusion.fuse(model)
    assert fused == 0 and "differ" in why
    layers = model.model.layers
    assert all("forward" not in layer.__dict__ and not hasattr(layer, norm_fusion.CHILD) for layer in layers)
    assert torch.equal(logits(model), before)


def test_a_model_the_check_cannot_run_is_left_as_written():
    model = load_model("tiny-qwen2").model

    def refuse(ids):
        raise RuntimeError("this embedding takes no plain token ids")

    model.model.embed_tokens.forward = refuse  # the check's forward pass cannot run
    fused, why = norm_fusion.fuse(model)
    assert fused == 0 and "raised" in why
    assert not any(hasattr(layer, norm_fusion.CHILD) for layer in model.model.layers)
