"""Unstable: softmax as exp(x) / sum(exp(x)) with no max shift: overflows for logits past ~88."""

import torch
import triton
import triton.language as tl

OP = "softmax"
ADAPTER = []


@triton.jit
def _softmax_rows(X, Y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x)
    tl.store(Y + row * n_cols + cols, (e / tl.sum(e, axis=0)).to(Y.dtype.element_ty), mask=mask)


def entry(x):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    _softmax_rows[(x2.shape[0],)](x2, y, hidden, BLOCK=triton.next_power_of_2(hidden))
    return y.view(x.shape)
