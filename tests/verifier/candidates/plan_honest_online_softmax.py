"""Honest: online softmax over chunks with a correct rescale, lanes that saw only -inf kept at a
zero sum."""

import torch
import triton
import triton.language as tl

OP = "softmax"
ADAPTER = []

CHUNK = 1024


@triton.jit
def _softmax_online(X, Y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * n_cols + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - safe) + tl.exp(x - safe)
        m = m_new
    row_max = tl.max(m, axis=0)
    total = tl.sum(tl.where(m == -float("inf"), 0.0, s * tl.exp(m - row_max)), axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(Y + row * n_cols + cols, (tl.exp(x - row_max) / total).to(Y.dtype.element_ty), mask=mask)


def entry(x):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    _softmax_online[(x2.shape[0],)](x2, y, hidden, BLOCK=min(CHUNK, triton.next_power_of_2(hidden)))
    return y.view(x.shape)
