"""Honest: LayerNorm over chunks of 256 with a per-lane Welford update (count, mean, M2), lanes
merged at the end (Chan et al.), then a normalizing pass."""

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
def _ln_welford(X, W, B, Y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    count = tl.zeros([BLOCK], dtype=tl.float32)
    mean = tl.zeros([BLOCK], dtype=tl.float32)
    m2 = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = cols < n_cols
        x = tl.load(X + row * n_cols + cols, mask=valid, other=0.0).to(tl.float32)
        new_count = count + tl.where(valid, 1.0, 0.0)
        delta = x - mean
        mean = tl.where(valid, mean + delta / tl.maximum(new_count, 1.0), mean)
        m2 = tl.where(valid, m2 + delta * (x - mean), m2)
        count = new_count
    total = tl.sum(count, axis=0)
    row_mean = tl.sum(mean * count, axis=0) / total
    shift = mean - row_mean
    var = (tl.sum(m2, axis=0) + tl.sum(count * shift * shift, axis=0)) / total
    rstd = 1.0 / tl.sqrt(var + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * n_cols + cols, ((x - row_mean) * rstd * w + b).to(Y.dtype.element_ty), mask=mask)


def entry(x, *, weight, bias, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    _ln_welford[(x2.shape[0],)](x2, weight, bias, y, hidden, eps, BLOCK=min(256, triton.next_power_of_2(hidden)))
    return y.view(x.shape)
