"""Softmax over the last dimension, computed in float32 and returned in x's dtype.

entry(x) -> softmax(x, dim=-1, dtype=float32).to(x.dtype), what the eager attention of every
transformers decoder computes on its scores (`nn.functional.softmax(w, dim=-1, dtype=torch.float32)
.to(query.dtype)`), and what MoE routers compute on router logits. Rows that are all -inf give NaN,
as torch does.

No transformers module computes it (it is a call inside the attention functions), so the family's
default module is `LastDimSoftmax` below; `torch.nn.Softmax(dim=-1)` also binds, by computation.
"""

from __future__ import annotations

import torch

from gpuyantra.ops._error_model import softmax_error_bound
from gpuyantra.ops._rows import (
    call_module,
    compute_dtype,
    forward_with_entry,
    is_parameterless_leaf,
    make_x,
    norm_bytes,
    per_element_flops,
)
from gpuyantra.ops.base import OpFamily, Tensor
from gpuyantra.ops.registry import register


def reference(x: Tensor) -> Tensor:
    return torch.softmax(x, dim=-1, dtype=compute_dtype(x)).to(x.dtype)


class LastDimSoftmax(torch.nn.Module):
    """`softmax(x, -1)` in float32, rounded to x's dtype: the module form of the family."""

    def forward(self, x: Tensor) -> Tensor:
        return reference(x)


FAMILY = register(
    OpFamily(
        name="softmax",
        activations=("x",),
        params=(),
        default_module="gpuyantra.ops.softmax.LastDimSoftmax",
        reference=reference,
        make_activations=make_x,
        module_call=call_module,
        replacement_forward=forward_with_entry,
        bytes_moved=norm_bytes(n_vectors=0, n_row_streams=2),
        flops=per_element_flops(5),
        known_modules=("gpuyantra.ops.softmax.LastDimSoftmax", "torch.nn.Softmax"),
        hidden_of=lambda module: 64,
        module_filter=is_parameterless_leaf,
        logits_input=True,
        error_bound=softmax_error_bound,
    )
)
