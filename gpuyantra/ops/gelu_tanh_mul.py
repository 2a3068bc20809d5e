"""GeGLU with the tanh-approximated GELU: `gelu(gate, approximate="tanh") * up` (Gemma 1-3 MLPs,
`hidden_act`/`hidden_activation` = "gelu_pytorch_tanh"; `gelu_new` is the same function).

entry(gate, up) -> gelu_tanh(gate) * up, in gate's dtype, where
gelu_tanh(g) = 0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3)))  (= g * sigmoid(2 * that arg)).

Binds GemmaMLP, Gemma2MLP, Gemma3MLP (and any gated MLP whose activation is numerically this),
ADAPTER empty, like `silu_mul`.
"""

from __future__ import annotations

import torch

from gpuyantra.ops._gated import gated_family
from gpuyantra.ops.base import Tensor
from gpuyantra.ops.registry import register


def reference(gate: Tensor, up: Tensor) -> Tensor:
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


FAMILY = register(
    gated_family(
        "gelu_tanh_mul",
        reference,
        default_module="transformers.models.gemma.modeling_gemma.GemmaMLP",
        known_modules=(
            "transformers.models.gemma.modeling_gemma.GemmaMLP",
            "transformers.models.gemma2.modeling_gemma2.Gemma2MLP",
            "transformers.models.gemma3.modeling_gemma3.Gemma3MLP",
        ),
        flops_per_element=9,
    )
)
