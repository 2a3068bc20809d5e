"""Linear (torch.nn.Linear): y = x Wᵀ + b, summed in float32 and rounded once to x's dtype.

x is viewed as [M, K] (any leading dims, any row stride); W is [N, K]. Two kernels, by M:

* `_gemv` (M <= GEMV_MAX_ROWS: decode). Bandwidth-bound: a program owns BLOCK_N output features of
  up to ROWS rows and one of SPLIT_K slices of K, and streams its [BLOCK_N, BLOCK_K] weight tiles
  once (every weight byte is read once per row tile) with float32 products and sums. With
  SPLIT_K > 1 each slice writes float32 partial sums to a scratch buffer and `_splitk_reduce` adds
  them in a fixed order (deterministic, no atomics), then the bias, then the one rounding. Long K
  with few output features (down_proj: N 1536, K 8960) needs the split to fill the GPU.
* `_matmul` (more rows: batched decode, prefill). Tiled tl.dot over [BLOCK_M, BLOCK_N] outputs with
  GROUP_M swizzling (neighbouring programs share weight tiles in L2), optionally split over K
  (MM_SPLIT_K, reduced like the GEMV's). float32 inputs use IEEE products (TF32 would not meet
  float32 accuracy over long K); 16-bit inputs the tensor cores. On an H200 a 16-row tile already
  streams the weights of a batch-8 decode faster than the GEMV's broadcast product.
"""

import torch
import triton
import triton.language as tl

OP = "linear"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "bias", "module_attr": "bias"},
]

# strategy:begin
GEMV_MAX_ROWS = 4  # rows (tokens) up to this run the GEMV kernel; more run the tiled matmul
GEMV_ROWS = 0  # rows per GEMV program (0: all of them, up to GEMV_MAX_ROWS)
BLOCK_N = 16  # GEMV: output features per program
BLOCK_K = 256  # GEMV: K elements per step (contiguous, vectorized weight loads)
SPLIT_K = 1  # GEMV: K slices reduced by a second kernel (0: auto, ~TARGET_PROGRAMS programs)
TARGET_PROGRAMS = 264  # GEMV auto split: programs to aim for (2 per SM on a 132-SM H100/H200)
GEMV_WARPS = 4  # GEMV: num_warps
W_EVICTION = ""  # "" or "evict_first": cache hint for the streamed weight tiles
DEFER_REDUCE = True  # GEMV: keep [ROWS, BLOCK_N, BLOCK_K] partial products, reduce over K once at the end
BLOCK_M = 64  # matmul: rows per tile
MM_BLOCK_N = 64  # matmul: output features per tile
MM_BLOCK_K = 32  # matmul: K per step
MM_SPLIT_K = 1  # matmul: K slices reduced by a second kernel (few row tiles, long K: batched down_proj)
GROUP_M = 8  # matmul: row tiles per swizzle group
MM_WARPS = 4  # matmul: num_warps
NUM_STAGES = 3  # matmul: software pipelining depth of the K loop
# strategy:end


@triton.jit
def _gemv(
    X,
    W,
    B,
    Y,
    P,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    k_per_split,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVICT: tl.constexpr,
    DEFER: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.program_id(2) * ROWS + tl.arange(0, ROWS)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < M
    col_mask = cols < N
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = X + rows.to(tl.int64)[:, None] * stride_xm
    w_rows = W + cols.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    # DEFER: per-lane float32 sums over the K loop, one cross-lane reduction at the end.
    if DEFER:
        lanes = tl.zeros([ROWS, BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        lanes = tl.zeros([1, 1, 1], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k in range(k_start, k_end, BLOCK_K):
        ks = k + offs_k
        k_mask = ks < k_end
        w = tl.load(w_rows + ks[None, :], mask=col_mask[:, None] & k_mask[None, :], other=0.0, eviction_policy=EVICT)
        x = tl.load(x_rows + ks[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        # Products of 16-bit inputs are exact in float32; the sum stays float32 throughout.
        prod = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        if DEFER:
            lanes += prod
        else:
            acc += tl.sum(prod, axis=2)
    if DEFER:
        acc += tl.sum(lanes, axis=2)
    mask = row_mask[:, None] & col_mask[None, :]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        out = Y + rows.to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(out, acc.to(Y.dtype.element_ty), mask=mask)
    else:
        part = P + (pid_k * M + rows.to(tl.int64))[:, None] * N + cols[None, :]
        tl.store(part, acc, mask=mask)


@triton.jit
def _splitk_reduce(P, B, Y, M, N, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    total = M * N  # the stride between slices (M == 1 or N == 1 may arrive as constexprs)
    mask = offs < total
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    part = P + offs
    for _split in tl.static_range(SPLIT):  # a fixed order: the same sum on every run
        acc += tl.load(part, mask=mask, other=0.0)
        part += total  # 64-bit pointer steps: no int32 product of slice and size
    if HAS_BIAS:
        acc += tl.load(B + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _matmul(
    X,
    W,
    B,
    Y,
    P,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    k_per_split,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(1) * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    rk = tl.arange(0, BLOCK_K)
    x_tile = X + rm.to(tl.int64)[:, None] * stride_xm + (k_start + rk)[None, :]
    w_tile = W + rn.to(tl.int64)[None, :] * stride_wn + (k_start + rk)[:, None]  # a [BLOCK_K, BLOCK_N] tile of Wᵀ
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        k_mask = (k + rk) < k_end
        a = tl.load(x_tile, mask=(rm < M)[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(w_tile, mask=k_mask[:, None] & (rn < N)[None, :], other=0.0)
        if X.dtype.element_ty == tl.float32:
            acc = tl.dot(a, b, acc, input_precision="ieee")  # TF32 would not be float32 accuracy
        else:
            acc = tl.dot(a, b, acc)
        x_tile += BLOCK_K
        w_tile += BLOCK_K
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(B + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(Y.dtype.element_ty), mask=mask)
    else:
        part = P + (tl.program_id(1) * M + rm.to(tl.int64))[:, None] * N + rn[None, :]
        tl.store(part, acc, mask=mask)


def _reduce_splits(partials, bias, y, m, n, split):
    block = 1024
    _splitk_reduce[(triton.cdiv(m * n, block),)](
        partials, bias, y, m, n, HAS_BIAS=bias is not None, SPLIT=split, BLOCK=block, num_warps=4
    )


def _launch_gemv(x2, weight, bias, y, m, n, k):
    rows = min(GEMV_ROWS or GEMV_MAX_ROWS, triton.next_power_of_2(m))
    n_blocks = triton.cdiv(n, BLOCK_N)
    k_blocks = triton.cdiv(k, BLOCK_K)
    # Auto: enough slices for ~TARGET_PROGRAMS programs, each at least 4 K steps (at most 64 slices).
    split = SPLIT_K or max(1, min(k_blocks // 4, TARGET_PROGRAMS // max(1, n_blocks), 64))
    k_per_split = triton.cdiv(k_blocks, min(split, k_blocks)) * BLOCK_K
    split = triton.cdiv(k, k_per_split)
    partials = torch.empty((split, m, n), dtype=torch.float32, device=x2.device) if split > 1 else y
    _gemv[(n_blocks, split, triton.cdiv(m, rows))](
        x2,
        weight,
        bias,
        y,
        partials,
        m,
        n,
        k,
        x2.stride(0),
        weight.stride(0),
        k_per_split,
        HAS_BIAS=bias is not None,
        SPLIT=split,
        ROWS=rows,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
        EVICT=W_EVICTION,
        DEFER=DEFER_REDUCE,
        num_warps=GEMV_WARPS,
    )
    if split > 1:
        _reduce_splits(partials, bias, y, m, n, split)


def _launch_matmul(x2, weight, bias, y, m, n, k):
    k_blocks = triton.cdiv(k, MM_BLOCK_K)
    k_per_split = triton.cdiv(k_blocks, min(MM_SPLIT_K, k_blocks)) * MM_BLOCK_K
    split = triton.cdiv(k, k_per_split)
    partials = torch.empty((split, m, n), dtype=torch.float32, device=x2.device) if split > 1 else y
    grid = (triton.cdiv(m, BLOCK_M) * triton.cdiv(n, MM_BLOCK_N), split)
    _matmul[grid](
        x2,
        weight,
        bias,
        y,
        partials,
        m,
        n,
        k,
        x2.stride(0),
        weight.stride(0),
        k_per_split,
        HAS_BIAS=bias is not None,
        SPLIT=split,
        BLOCK_M=BLOCK_M,
        BLOCK_N=MM_BLOCK_N,
        BLOCK_K=MM_BLOCK_K,
        GROUP_M=GROUP_M,
        num_warps=MM_WARPS,
        num_stages=NUM_STAGES,
    )
    if split > 1:
        _reduce_splits(partials, bias, y, m, n, split)


def entry(x, *, weight, bias):
    """x (..., K), weight (N, K), bias (N,) or None -> y (..., N) of x's dtype."""
    k = x.shape[-1]
    n = weight.shape[0]
    m = x.numel() // k
    x2 = x.reshape(m, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    if m <= GEMV_MAX_ROWS:
        _launch_gemv(x2, weight, bias, y, m, n, k)
    else:
        _launch_matmul(x2, weight, bias, y, m, n, k)
    return y
