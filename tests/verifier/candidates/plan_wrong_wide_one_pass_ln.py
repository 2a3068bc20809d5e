"""Wrong (wide_rows): two-pass LayerNorm in one tile, but rows wider than one tile take a chunked
path with a one-pass variance E[x^2] - E[x]^2, which cancels on rows far from zero mean. The old
plan's wide rows (16411 columns) were N(0, 1) only, its 16-bit rows at most 1000 wide."""

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
def _ln_tile(X, W, B, Y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * n_cols + cols, (d * rstd * w + b).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _ln_wide(X, W, B, Y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * n_cols + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += x
        acc2 += x * x
    mean = tl.sum(acc, axis=0) / n_cols
    var = tl.sum(acc2, axis=0) / n_cols - mean * mean
    rstd = 1.0 / tl.sqrt(var + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * n_cols + cols, ((x - mean) * rstd * w + b).to(Y.dtype.element_ty), mask=mask)


def entry(x, *, weight, bias, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    block = triton.next_power_of_2(hidden)
    if block <= 1024:
        _ln_tile[(x2.shape[0],)](x2, weight, bias, y, hidden, eps, BLOCK=block)
    else:
        _ln_wide[(x2.shape[0],)](x2, weight, bias, y, hidden, eps, BLOCK=1024)
    return y.view(x.shape)
