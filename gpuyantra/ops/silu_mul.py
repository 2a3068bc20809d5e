"""SwiGLU's activation: `silu(gate) * up`, the math between a gated MLP's projections.

entry(gate, up) -> silu(gate) * up, in gate's dtype. Eager (bf16/fp16) rounds silu(gate) to the
dtype before the product; a kernel may do the same or keep it in float32 (within tolerance).
gate and up may be row-strided views (Phi-3's `gate_up_proj(x).chunk(2, -1)`).

Binds the MLP module (ADAPTER empty): LlamaMLP, MistralMLP, Qwen2MLP, Qwen3MLP, Qwen2MoeMLP (the
MoE shared expert), GraniteMLP, Olmo2MLP, Phi3MLP (fused gate_up_proj) — only when the module's
activation is numerically SiLU (an MLP configured with another `hidden_act` does not bind).
"""

from __future__ import annotations

import torch

from gpuyantra.ops._gated import gated_family
from gpuyantra.ops.base import Tensor
from gpuyantra.ops.registry import register


def reference(gate: Tensor, up: Tensor) -> Tensor:
    return torch.nn.functional.silu(gate) * up


FAMILY = register(
    gated_family(
        "silu_mul",
        reference,
        default_module="transformers.models.llama.modeling_llama.LlamaMLP",
        known_modules=(
            "transformers.models.llama.modeling_llama.LlamaMLP",
            "transformers.models.mistral.modeling_mistral.MistralMLP",
            "transformers.models.qwen2.modeling_qwen2.Qwen2MLP",
            "transformers.models.qwen3.modeling_qwen3.Qwen3MLP",
            "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeMLP",
            "transformers.models.granite.modeling_granite.GraniteMLP",
            "transformers.models.olmo2.modeling_olmo2.Olmo2MLP",
            "transformers.models.phi3.modeling_phi3.Phi3MLP",
        ),
        flops_per_element=5,
    )
)
