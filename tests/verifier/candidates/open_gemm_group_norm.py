"""Honest kernel for tests.verifier.test_conditioning.GemmGroupNorm: group_norm(x @ W.T + b), two groups.

One program per (row, group): the group's channels of the GEMM, accumulated in float32 over K in
tiles (the sum of each tile, then the tiles in order: not the reference's order), then a two-pass
GroupNorm of them. ACCUMULATE is the only line the test's cheats change.
"""

import torch
import triton
import triton.language as tl

OP = "OPNAME"
ADAPTER = [
    {"kernel_param": "gemm_weight", "module_attr": "gemm.weight"},
    {"kernel_param": "gemm_bias", "module_attr": "gemm.bias"},
    {"kernel_param": "group_norm_weight", "module_attr": "group_norm.weight"},
    {"kernel_param": "group_norm_bias", "module_attr": "group_norm.bias"},
    {"kernel_param": "group_norm_eps", "module_attr": "group_norm.eps"},
]
GROUPS = 2  # the module's structure (GroupNorm(2, N)), not a bound value


@triton.jit
def _gemm_group_norm(X, W, B, GW, GB, Y, K, N, eps, CPG: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    channels = tl.program_id(1) * CPG + tl.arange(0, CPG)
    acc = tl.zeros([CPG], dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        in_k = ks < K
        x = tl.load(X + row * K + ks, mask=in_k, other=0.0).to(tl.float32)
        w = tl.load(W + channels[:, None].to(tl.int64) * K + ks[None, :], mask=in_k[None, :], other=0.0)
        acc = acc + tl.sum(w.to(tl.float32) * x[None, :], axis=1)  # ACCUMULATE
    h = acc + tl.load(B + channels).to(tl.float32)
    mean = tl.sum(h, 0) / CPG
    centered = h - mean
    var = tl.sum(centered * centered, 0) / CPG
    y = centered / tl.sqrt(var + eps) * tl.load(GW + channels).to(tl.float32) + tl.load(GB + channels).to(tl.float32)
    tl.store(Y + row * N + channels, y.to(Y.dtype.element_ty))


def entry(x, *, gemm_weight, gemm_bias, group_norm_weight, group_norm_bias, group_norm_eps):
    k = x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    n = gemm_weight.shape[0]
    y = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    _gemm_group_norm[(x2.shape[0], GROUPS)](
        x2,
        gemm_weight.contiguous(),
        gemm_bias,
        group_norm_weight,
        group_norm_bias,
        y,
        k,
        n,
        group_norm_eps,
        CPG=n // GROUPS,
        BLOCK_K=4096,
    )
    return y.view(*x.shape[:-1], n)
