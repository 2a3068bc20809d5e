"""Honest: a tiled GEMM in float32 with K masked on the last tile, with or without a bias."""

import torch
import triton
import triton.language as tl

OP = "linear"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "bias", "module_attr": "bias"},
]


@triton.jit
def _gemm(
    X,
    W,
    B,
    Y,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    MASK_K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        k_ok = rk < K if MASK_K else rk >= 0
        x = tl.load(X + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & k_ok[None, :], other=0.0)
        w = tl.load(W + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & k_ok[:, None], other=0.0)
        acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(B + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rm[:, None] * N + rn[None, :], acc.to(Y.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def entry(x, *, weight, bias):
    k = x.shape[-1]
    n = weight.shape[0]
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    has_bias = bias is not None
    grid = (triton.cdiv(m, 16), triton.cdiv(n, 64))
    _gemm[grid](
        x2, weight, bias if has_bias else weight, y, m, n, k, HAS_BIAS=has_bias, MASK_K=True, BM=16, BN=64, BK=64
    )
    return y.view(*x.shape[:-1], n)
