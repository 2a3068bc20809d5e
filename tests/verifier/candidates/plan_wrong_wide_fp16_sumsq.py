"""Wrong (wide_rows): RMSNorm right in one tile; rows wider than a tile sum their squares chunk by
chunk in x's dtype, which overflows float16 on outliers (600^2 > 65504). The old plan's 16-bit
rows were at most 1000 wide; its only wide rows were float32."""

import torch
import triton
import triton.language as tl

OP = "rms_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]


@triton.jit
def _rms(X, W, Y, n_cols, eps, BLOCK: tl.constexpr, N_CHUNKS: tl.constexpr):
    row = tl.program_id(0)
    if N_CHUNKS == 1:
        cols = tl.arange(0, BLOCK)
        x = tl.load(X + row * n_cols + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        sum_sq = tl.sum(x * x, axis=0)
    else:
        total = tl.zeros([BLOCK], dtype=X.dtype.element_ty)  # the bug: 16-bit partial sums
        for c in range(N_CHUNKS):
            cols = c * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(X + row * n_cols + cols, mask=cols < n_cols, other=0.0)
            total += x * x
        sum_sq = tl.sum(total.to(tl.float32), axis=0)
    rstd = 1.0 / tl.sqrt(sum_sq / n_cols + eps)
    for c in range(N_CHUNKS):
        cols = c * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        normed = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)
        tl.store(Y + row * n_cols + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)


def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    block = min(triton.next_power_of_2(hidden), 1024)
    _rms[(x2.shape[0],)](x2, weight, y, hidden, eps, BLOCK=block, N_CHUNKS=triton.cdiv(hidden, block))
    return y.view(x.shape)
