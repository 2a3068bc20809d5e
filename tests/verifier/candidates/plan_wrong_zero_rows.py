"""Wrong (zero_rows): skips the store of rows that are all zero (padding rows, it assumes), whose
LayerNorm output is the bias. No plan row was all zero before."""

import torch
import triton
import triton.language as tl

OP = "layer_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "bias", "module_attr": "bias"},
    {"kernel_param": "eps", "module_attr": "eps"},
]


@triton.jit
def _ln_rows(X, W, B, Y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    row_peak = tl.zeros([BLOCK], dtype=tl.float32) + tl.max(tl.abs(x), axis=0)
    tl.store(Y + row * n_cols + cols, (d * rstd * w + b).to(Y.dtype.element_ty), mask=mask & (row_peak > 0.0))


def entry(x, *, weight, bias, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    _ln_rows[(x2.shape[0],)](x2, weight, bias, y, hidden, eps, BLOCK=triton.next_power_of_2(hidden))
    return y.view(x.shape)
