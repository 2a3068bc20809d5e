"""Honest: two passes over fixed-size chunks, several rows per program (strategy 2)."""

import torch
import triton
import triton.language as tl

OP = "rms_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]


CHUNK = 128
ROWS = 4


@triton.jit
def _rms_chunked(X, W, Y, n_rows, n_cols, stride, eps, CHUNK: tl.constexpr, ROWS: tl.constexpr):
    for r in tl.static_range(ROWS):
        row = tl.program_id(0) * ROWS + r
        if row < n_rows:
            acc = tl.zeros([CHUNK], dtype=tl.float32)
            for start in range(0, n_cols, CHUNK):
                cols = start + tl.arange(0, CHUNK)
                x = tl.load(X + row * stride + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
                acc += x * x
            rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
            for start in range(0, n_cols, CHUNK):
                cols = start + tl.arange(0, CHUNK)
                mask = cols < n_cols
                x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
                normed = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)
                tl.store(Y + row * n_cols + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)


def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n_rows = x2.shape[0]
    y = torch.empty((n_rows, hidden), dtype=x.dtype, device=x.device)
    _rms_chunked[(triton.cdiv(n_rows, ROWS),)](x2, weight, y, n_rows, hidden, x2.stride(0), eps,
                                               CHUNK=CHUNK, ROWS=ROWS)
    return y.reshape(x.shape)
