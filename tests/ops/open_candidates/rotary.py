"""Hand-written kernel for transformers' Qwen2RotaryEmbedding.forward(x, position_ids) -> (cos, sin):
one program per token, the angles position * inv_freq repeated over both halves of the head dim.
Honest as written; the cheat tests bake the batch at 1 (the first row's positions for every row)."""

import torch
import triton
import triton.language as tl

OP = "OPNAME"
ADAPTER = [
    {"kernel_param": "inv_freq", "module_attr": "inv_freq"},
    {"kernel_param": "original_inv_freq", "module_attr": "original_inv_freq"},
    {"kernel_param": "attention_scaling", "module_attr": "attention_scaling"},
]


@triton.jit
def _rotary(P, F, COS, SIN, half, scaling, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < 2 * half
    position = tl.load(P + token).to(tl.float32)
    freq = tl.load(F + cols % half, mask=mask, other=0.0).to(tl.float32)
    angle = position * freq
    out = token * 2 * half + cols
    tl.store(COS + out, (tl.cos(angle) * scaling).to(COS.dtype.element_ty), mask=mask)
    tl.store(SIN + out, (tl.sin(angle) * scaling).to(SIN.dtype.element_ty), mask=mask)


def entry(x, position_ids, *, inv_freq, original_inv_freq, attention_scaling):
    batch, seq = position_ids.shape[0], position_ids.shape[1]  # the batch: the cheat bakes it
    positions = position_ids.contiguous()
    half = inv_freq.shape[0]
    cos = torch.empty((batch, seq, 2 * half), dtype=x.dtype, device=x.device)
    sin = torch.empty((batch, seq, 2 * half), dtype=x.dtype, device=x.device)
    _rotary[(batch * seq,)](
        positions, inv_freq, cos, sin, half, attention_scaling, BLOCK=triton.next_power_of_2(2 * half)
    )
    return cos, sin
