"""A decoder layer's first residual add and the norm after it as one module call.

Why: a pre-norm decoder layer (Llama, Qwen2, Mistral) runs `residual + attention_output` and then
`post_attention_layernorm` over the sum: two latency-bound kernels per layer at decode (on an H200
under CUDA graphs ~1.3 µs each; Qwen2.5-1.5B runs 28 such adds a step). No module computes the
add, so no kernel can take it over. Here each such layer calls a `ResidualNorm` child
(`post_attention_residual_norm`) that returns `(norm(residual + x), residual + x)`: the
`add_rms_norm` family binds to it (numerically, like any module) and one kernel does both.

What the child computes by itself is exactly the two steps the layer ran: the add, then the live
norm module (a kernel swapped into that norm still runs). The layer's new forward is the class
forward with those two steps routed through the child. Whether it computes what the modeling code
computes is not assumed from names: `fuse` runs the model on a short prompt before and after the
rewrite and keeps it only when the logits are bitwise equal; otherwise it puts the class forwards
back and says why. The layer's second add (after the MLP) feeds the next layer, a different module,
and stays as written.
"""

from __future__ import annotations

import types
from typing import Any

import torch

CHILDREN = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")  # exactly these
CHILD = "post_attention_residual_norm"
CHECK_PROMPT = (5, 17, 300, 42, 7, 99)


def _through_norm(name: str) -> property:
    """An attribute of the wrapped norm, read and written through (parity checks move eps a while)."""

    def read(self: ResidualNorm) -> Any:
        return getattr(self.norm, name, None)

    def write(self: ResidualNorm, value: Any) -> None:
        setattr(self.norm, name, value)

    return property(read, write)


class ResidualNorm(torch.nn.Module):
    """`forward(x, residual) -> (norm(residual + x), residual + x)` over a decoder layer's norm.

    The norm's parameters are reached through it (`weight`, `variance_epsilon`, `eps`): a kernel
    bound here uses the live weights of the norm it replaces."""

    def __init__(self, norm: torch.nn.Module | int, eps: float = 1e-6) -> None:
        """`norm`: the decoder layer's norm module, or a hidden size for a fresh Llama-style RMSNorm
        (how the verifier builds the class on its own)."""
        super().__init__()
        self.norm = norm if isinstance(norm, torch.nn.Module) else _RMSNorm(int(norm), eps)

    weight = property(lambda self: getattr(self.norm, "weight", None))
    variance_epsilon = _through_norm("variance_epsilon")
    eps = _through_norm("eps")

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        summed = residual + x  # the decoder layer's own order and dtype
        return self.norm(summed), summed


class _RMSNorm(torch.nn.Module):
    """LlamaRMSNorm's math (the `rms_norm` family's reference) for a `ResidualNorm` built alone."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from gpuyantra.ops.rms_norm import reference

        return reference(x, weight=self.weight, eps=self.variance_epsilon)


def _layer_forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The pre-norm decoder layer, its first residual add and post-attention norm as one call."""
    if args:  # a positional call this rewrite does not map: the class forward as written
        return type(self).forward(self, hidden_states, *args, **kwargs)
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states = self.self_attn(hidden_states=hidden_states, **kwargs)[0]
    hidden_states, residual = getattr(self, CHILD)(hidden_states, residual)
    hidden_states = self.mlp(hidden_states)
    return residual + hidden_states


def _candidates(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Decoder layers whose children are exactly the pre-norm layer's four (more norms, as in
    Gemma 2, mean another data flow) and whose forward is still the class's own."""
    return [
        module
        for module in model.modules()
        if set(module._modules) == set(CHILDREN) and "forward" not in module.__dict__
    ]


def _check_logits(model: torch.nn.Module) -> torch.Tensor:
    param = next(model.parameters())
    ids = torch.tensor([CHECK_PROMPT], device=param.device) % int(getattr(model.config, "vocab_size", 256) or 256)
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def fuse(model: torch.nn.Module) -> tuple[int, str | None]:
    """Route each pre-norm decoder layer's first residual add and post-attention norm through one
    `ResidualNorm` call (idempotent). Returns (layers fused, why none were where candidates exist)."""
    done: list[torch.nn.Module] = model.__dict__.setdefault("_gpuyantra_norm_fused", [])
    layers = _candidates(model)
    if not layers:
        return len(done), None
    try:
        before = _check_logits(model)
    except Exception as exc:  # noqa: BLE001 - a model this check cannot run is served as written
        return len(done), f"the check's forward pass raised {type(exc).__name__}: {exc}"
    for layer in layers:
        norm = layer.get_submodule("post_attention_layernorm")
        layer.add_module(CHILD, ResidualNorm(norm))
        layer.forward = types.MethodType(_layer_forward, layer)
    try:
        after = _check_logits(model)
        why = None if torch.equal(before, after) else "the rewritten layers' logits differ from the modeling code's"
    except Exception as exc:  # noqa: BLE001 - any failure keeps the modeling code's forwards
        why = f"the rewritten layers raised {type(exc).__name__}: {exc}"
    if why is not None:
        _restore(layers)
        return len(done), why
    done.extend(layers)
    return len(done), None


def _restore(layers: list[torch.nn.Module]) -> None:
    for layer in layers:
        layer.__dict__.pop("forward", None)
        if CHILD in layer._modules:
            del layer._modules[CHILD]


def unfuse(model: torch.nn.Module) -> None:
    """The class forwards back (a kernel swapped into a `ResidualNorm` is rolled back first by the
    swap engine's owner; its child module goes with the rewrite)."""
    _restore(model.__dict__.pop("_gpuyantra_norm_fused", []))
