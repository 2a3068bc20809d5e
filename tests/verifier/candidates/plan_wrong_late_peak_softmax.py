"""Wrong (late_peak): takes the max shift from the first chunk only and sums exp(x - that max)
over all chunks; a later logit more than exp's range above it overflows to inf / inf. Right when
the row fits one chunk or its peak sits early; the old plan's wide rows were N(0, 1)."""

import torch
import triton
import triton.language as tl

OP = "softmax"
ADAPTER = []

CHUNK = 1024


@triton.jit
def _softmax_first_max(X, Y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    first = tl.load(X + row * n_cols + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    m = tl.max(first, axis=0)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * n_cols + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        s += tl.exp(x - m)
    total = tl.sum(s, axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(Y + row * n_cols + cols, (tl.exp(x - m) / total).to(Y.dtype.element_ty), mask=mask)


def entry(x):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    _softmax_first_max[(x2.shape[0],)](x2, y, hidden, BLOCK=min(CHUNK, triton.next_power_of_2(hidden)))
    return y.view(x.shape)
