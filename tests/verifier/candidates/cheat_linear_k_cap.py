"""Linear that stops after 64 K tiles of 128 (K 8192): every projection of a 1.5B model has
K <= 8960... nearly. Right on every shape with K <= 8192, wrong past it; only a long-K shape shows
it (the verifier's stress shape has K 16411)."""

import torch
import triton
import triton.language as tl

OP = "linear"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "bias", "module_attr": "bias"},
]


@triton.jit
def _linear_rows(X, W, B, Y, N, K, stride_xm, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.minimum(K, 64 * BLOCK_K), BLOCK_K):  # the cheat: K tiles past 64 skipped
        ks = k + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        x = tl.load(X + row * stride_xm + ks, mask=k_mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols[:, None] * K + ks[None, :], mask=col_mask[:, None] & k_mask[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, acc.to(Y.dtype.element_ty), mask=col_mask)


def entry(x, *, weight, bias):
    k = x.shape[-1]
    n = weight.shape[0]
    x2 = x.reshape(-1, k).contiguous()
    y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    grid = (x2.shape[0], triton.cdiv(n, 128))
    _linear_rows[grid](x2, weight, bias, y, n, k, x2.stride(0), HAS_BIAS=bias is not None, BLOCK_N=128, BLOCK_K=128)
    return y
