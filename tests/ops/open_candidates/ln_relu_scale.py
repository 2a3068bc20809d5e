"""Honest kernel for tests.ops.test_open_targets.LnReluScale: relu(layer_norm(x)) * scale."""

import torch
import triton
import triton.language as tl

OP = "OPNAME"
ADAPTER = [
    {"kernel_param": "ln_weight", "module_attr": "ln.weight"},
    {"kernel_param": "ln_bias", "module_attr": "ln.bias"},
    {"kernel_param": "scale", "module_attr": "scale"},
    {"kernel_param": "ln_eps", "module_attr": "ln.eps"},
]


@triton.jit
def _ln_relu_scale(X, W, B, Y, H, eps, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(X + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, 0) / H
    centered = tl.where(mask, x - mean, 0.0)
    var = tl.sum(centered * centered, 0) / H
    w = tl.load(W + cols, mask=mask).to(tl.float32)
    b = tl.load(B + cols, mask=mask).to(tl.float32)
    y = tl.maximum(centered / tl.sqrt(var + eps) * w + b, 0.0) * scale  # the bound float (the cheat test bakes it)
    tl.store(Y + row * H + cols, y.to(Y.dtype.element_ty), mask=mask)


def entry(x, *, ln_weight, ln_bias, scale, ln_eps):
    x = x.contiguous()
    y = torch.empty_like(x)
    hidden = x.shape[-1]
    _ln_relu_scale[(x.numel() // hidden,)](
        x, ln_weight, ln_bias, y, hidden, ln_eps, scale, BLOCK=triton.next_power_of_2(hidden)
    )
    return y
