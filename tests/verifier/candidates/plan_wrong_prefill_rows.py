"""Wrong (prefill_rows): one program per row, except that prefill-sized inputs (128 rows or more)
at a width that is no power of two take a path of 4 rows per program whose grid drops the last
n_rows % 4 rows. The old plan's many-row shapes had power-of-two widths (1031 x 8) or under 128
rows (67 x 96, live rows capped at 64)."""

import torch
import triton
import triton.language as tl

OP = "rms_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]


@triton.jit
def _rms_rows(X, W, Y, n_rows, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * n_cols + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_four_rows(X, W, Y, n_cols, eps, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    for r in range(4):
        row = tl.program_id(0) * 4 + r
        x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        normed = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)
        tl.store(Y + row * n_cols + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)


def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    n_rows = x2.shape[0]
    block = triton.next_power_of_2(hidden)
    padded = block != hidden
    if n_rows >= 128 and padded:
        _rms_four_rows[(n_rows // 4,)](x2, weight, y, hidden, eps, BLOCK=block)
    else:
        _rms_rows[(n_rows,)](x2, weight, y, n_rows, hidden, hidden, eps, BLOCK=block)
    return y.view(x.shape)
