"""The op registry: signatures, references checked against the real transformers modules, the
roofline byte model, and binding by computation on single modules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpuyantra.binding import computes_family
from gpuyantra.ops import all_ops, get_op
from gpuyantra.ops.base import as_tuple, import_class, numel
from gpuyantra.ops.meta import build_instance, meta_instance

FAMILIES = ["rms_norm", "gemma_rms_norm", "layer_norm", "add_rms_norm", "silu_mul", "gelu_tanh_mul", "rope", "softmax"]

SIGNATURES = {
    "rms_norm": (("x",), ("weight", "eps")),
    "gemma_rms_norm": (("x",), ("weight", "eps")),
    "layer_norm": (("x",), ("weight", "bias", "eps")),
    "add_rms_norm": (("x", "residual"), ("weight", "eps")),
    "silu_mul": (("gate", "up"), ()),
    "gelu_tanh_mul": (("gate", "up"), ()),
    "rope": (("q", "k", "cos", "sin"), ()),
    "softmax": (("x",), ()),
}


def test_registry_has_every_family_with_its_signature():
    names = {f.name for f in all_ops()}
    assert set(FAMILIES) <= names
    for name, (acts, params) in SIGNATURES.items():
        family = get_op(name)
        assert family.activations == acts
        assert tuple(p.name for p in family.params) == params


@pytest.mark.parametrize("name", FAMILIES)
def test_default_module_builds_and_gives_the_default_adapter(name):
    family = get_op(name)
    cls = import_class(family.default_module)
    assert meta_instance(cls) is not None
    adapter = family.default_adapter(cls)
    assert [b["kernel_param"] for b in adapter] == [p.name for p in family.params]
    module = build_instance(cls)
    assert computes_family(module, family) == adapter


def _module(dotted: str, dtype=torch.float32):
    module = build_instance(import_class(dotted))
    assert module is not None, dotted
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape) * 0.5 + 0.3)
    return module.to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["rms_norm", "gemma_rms_norm", "layer_norm"])
def test_norm_references_equal_every_known_module(name, dtype):
    family = get_op(name)
    for dotted in family.known_modules:
        module = _module(dotted, dtype)
        x = torch.randn(4, 7, family.hidden_size(module)).to(dtype)
        kwargs = {b["kernel_param"]: getattr(module, b["module_attr"]) for b in family.default_adapter(module)}
        with torch.no_grad():
            got, want = module(x), family.reference(x, **kwargs)
        assert got.dtype == want.dtype, dotted
        if "Olmo2" in dotted and dtype != torch.float32:
            # OLMo2 multiplies by the weight before rounding: one rounding apart in 16-bit types.
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        else:
            torch.testing.assert_close(got, want, atol=0, rtol=0, msg=dotted)


def test_gemma_reference_keeps_x_dtype_with_float32_weight():
    family = get_op("gemma_rms_norm")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    module = Gemma3RMSNorm(32, eps=1e-6)
    torch.nn.init.normal_(module.weight)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    got = module(x)
    want = family.reference(x, weight=module.weight, eps=module.eps)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["silu_mul", "gelu_tanh_mul"])
def test_gated_references_equal_the_mlp_modules(name, dtype):
    family = get_op(name)
    for dotted in family.known_modules:
        module = _module(dotted, dtype)
        (x,) = family.activations_for_module(module, (2, 3), dtype, "cpu", torch.Generator().manual_seed(0))
        with torch.no_grad():
            got = module(x)
            want = family.expected_module_output(module, (x,), [])
        torch.testing.assert_close(got, want, atol=0, rtol=0, msg=dotted)


def test_gelu_tanh_reference_is_gelu_new_and_pytorch_tanh():
    from transformers.activations import ACT2FN

    g, u = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)
    want = get_op("gelu_tanh_mul").reference(g, u)
    torch.testing.assert_close(ACT2FN["gelu_pytorch_tanh"](g) * u, want)
    torch.testing.assert_close(ACT2FN["gelu_new"](g) * u, want)


@pytest.mark.parametrize("model", ["llama", "qwen3", "gemma3", "olmo2", "phi3"])
def test_rope_reference_equals_apply_rotary_pos_emb(model):
    import importlib

    family = get_op("rope")
    mod = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        q, k, cos, sin = family.make_activations((2, 8, 5), 16, dtype, "cpu", gen)
        if model == "olmo2":
            cos, sin = cos.float(), sin.float()  # OLMo2's rotary module returns float32 cos/sin
        got = mod.apply_rotary_pos_emb(q, k, cos, sin)
        want = family.reference(q, k, cos, sin)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            torch.testing.assert_close(g, w, atol=0, rtol=0)
    if model == "phi3":  # partial rotary: cos/sin narrower than the head dim
        q, k, cos, sin = family.make_activations((1, 4, 3), 16, torch.float32, "cpu", gen)
        got = mod.apply_rotary_pos_emb(q, k, cos[..., :8], sin[..., :8])
        want = family.reference(q, k, cos[..., :8], sin[..., :8])
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_softmax_reference_is_eager_attention_softmax():
    x = torch.randn(2, 4, 5, 9, dtype=torch.bfloat16)
    x[..., -2:] = float("-inf")
    want = F.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)
    torch.testing.assert_close(get_op("softmax").reference(x), want, atol=0, rtol=0)


def test_add_rms_norm_reference_is_the_decoder_residual_then_norm():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(32, eps=1e-5).to(torch.bfloat16)
    torch.nn.init.normal_(norm.weight)
    x, residual = torch.randn(3, 32, dtype=torch.bfloat16), torch.randn(3, 32, dtype=torch.bfloat16)
    hidden = residual + x  # what the decoder layer does
    normed, new_residual = get_op("add_rms_norm").reference(x, residual, weight=norm.weight, eps=norm.variance_epsilon)
    torch.testing.assert_close(new_residual, hidden, atol=0, rtol=0)
    torch.testing.assert_close(normed, norm(hidden), atol=0, rtol=0)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_bytes_moved_counts_each_input_and_output_once(name, dtype):
    family = get_op(name)
    rows, hidden = ((2, 8, 6), 16) if name == "rope" else ((3, 5), 48)
    gen = torch.Generator().manual_seed(0)
    acts = family.make_activations(rows, hidden, dtype, "cpu", gen)
    params = family.make_params(hidden, dtype, "cpu", gen)
    out = family.reference(*acts, **params)
    tensors = list(acts) + [v for v in params.values() if isinstance(v, torch.Tensor)] + list(as_tuple(out))
    assert family.bytes_moved(list(acts[0].shape), dtype) == sum(t.numel() * t.element_size() for t in tensors)
    assert family.flops(list(acts[0].shape)) >= numel(acts[0].shape)


# ------------------------------------------------------------------------- binding by computation


def test_gemma_norms_never_bind_rms_norm_and_llama_norms_never_bind_gemma():
    rms, gemma = get_op("rms_norm"), get_op("gemma_rms_norm")
    for dotted in gemma.known_modules:
        module = build_instance(import_class(dotted))
        assert computes_family(module, rms) is None, dotted
        assert computes_family(module, gemma) == [
            {"kernel_param": "weight", "module_attr": "weight"},
            {"kernel_param": "eps", "module_attr": "eps"},
        ]
    for dotted in rms.known_modules:
        module = build_instance(import_class(dotted))
        assert computes_family(module, gemma) is None, dotted
        assert computes_family(module, rms) is not None, dotted


def test_mlp_binds_by_its_activation_not_its_class():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    silu, gelu = get_op("silu_mul"), get_op("gelu_tanh_mul")
    config = LlamaConfig(hidden_size=32, intermediate_size=64)
    assert computes_family(LlamaMLP(config), silu) == []
    assert computes_family(LlamaMLP(config), gelu) is None
    config.hidden_act = "gelu_pytorch_tanh"
    assert computes_family(LlamaMLP(config), silu) is None
    assert computes_family(LlamaMLP(config), gelu) == []
    config.hidden_act = "relu"
    assert computes_family(LlamaMLP(config), silu) is None
    assert computes_family(LlamaMLP(config), gelu) is None


def test_layer_norm_binds_torch_layer_norm_only():
    ln = torch.nn.LayerNorm(32)
    assert computes_family(ln, get_op("layer_norm")) == [
        {"kernel_param": "weight", "module_attr": "weight"},
        {"kernel_param": "bias", "module_attr": "bias"},
        {"kernel_param": "eps", "module_attr": "eps"},
    ]
    assert computes_family(ln, get_op("rms_norm")) is None
    assert computes_family(torch.nn.LayerNorm(32, bias=False), get_op("layer_norm")) is not None


def test_softmax_binds_last_dim_softmax_only():
    family = get_op("softmax")
    assert computes_family(torch.nn.Softmax(dim=-1), family) == []
    assert computes_family(torch.nn.Softmax(dim=0), family) is None
    assert computes_family(torch.nn.Identity(), family) is None
    assert computes_family(torch.nn.ReLU(), family) is None


class _Float32Norm(torch.nn.Module):
    """RMSNorm math, but returns float32 whatever the input dtype (different dtype handling)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        xf = x.float()
        return self.weight.float() * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def test_binding_checks_dtype_handling_not_only_float64_math():
    assert computes_family(_Float32Norm(32), get_op("rms_norm")) is None


def test_binding_probe_never_touches_the_live_module():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    module = LlamaRMSNorm(16)
    before = module.weight.detach().clone()
    assert computes_family(module, get_op("rms_norm")) is not None
    assert torch.equal(module.weight, before) and module.weight.dtype == torch.float32
