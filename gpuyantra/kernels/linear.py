"""Linear (torch.nn.Linear): y = x Wᵀ + b, summed in float32 and rounded once to x's dtype.

x is viewed as [M, K] (any leading dims, any row stride); W is [N, K]. Three regimes, by M, each
with its own knobs, so one strategy serves batch-1 decode, batched decode and prefill:

* GEMV (M <= GEMV_MAX_ROWS: decode). Bandwidth-bound: a program owns BLOCK_N output features of
  up to ROWS rows and one of SPLIT_K slices of K, and streams its [BLOCK_N, BLOCK_K] weight tiles
  once (every weight byte is read once per row tile) with float32 products and sums. With
  SPLIT_K > 1 each slice writes float32 partial sums to a scratch buffer and `_splitk_reduce` adds
  them in a fixed order (deterministic, no atomics), then the bias, then the one rounding.
  `_gemv_unrolled` (GEMV_UNROLL, up to GEMV_UNROLL_ROWS rows, a slice of at most GEMV_MAX_STEPS K steps):
  K is a compile-time constant and the K loop unrolled, so a program's weight loads are all issued
  before the first product waits on one; x is read as a tile in the weight tile's layout (no layout
  change in the loop) and each row keeps its own per-lane sums. On an H200 it reads the decode
  projections' weights at 82-96 % of copy bandwidth where the looped `_gemv` (any rows, any K) read
  them at 61-77 %. With 4 rows its per-row sums cost registers: gate/up, down_proj and lm_head ran
  at 0.66-0.80 of cuBLAS, so by default it takes 1 row and the looped one the rest, long K included.
* small-row `_matmul` (GEMV_MAX_ROWS < M <= SMALL_MAX_ROWS: batched decode). 16-row tl.dot tiles
  (the smallest the tensor cores take) over SMALL_BLOCK_N features; on an H200 such a tile streams
  the weights of a batch-8 decode faster than the GEMV's broadcast product. With few tiles (down_proj)
  K is split (SMALL_SPLIT_K, 0: automatic, ~TARGET_PROGRAMS programs) and reduced like the GEMV's.
  With SMALL_SWAP_AB, `_matmul_swapped` computes the transposed tile, y^T = W x^T: the weight tile
  [SMALL_BLOCK_N, K step] is the dot's left operand and the 16 rows its right one, so the feature
  block is free of the 16-row minimum that binds the rows (the tensor cores' wide-M shapes take it).
* big-tile `_matmul` (more rows: prefill). Tiled tl.dot over [BLOCK_M, MM_BLOCK_N] outputs with
  GROUP_M swizzling (neighbouring programs share weight tiles in L2), optionally split over K
  (MM_SPLIT_K, 0: automatic), reduced the same way.

Both matmuls take float32 inputs as IEEE products (TF32 would not meet float32 accuracy over long
K) and 16-bit inputs on the tensor cores.
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
GEMV_MAX_ROWS = 4  # rows (tokens) up to this run the GEMV kernel
GEMV_ROWS = 0  # rows per GEMV program (0: all of them, up to GEMV_MAX_ROWS)
BLOCK_N = 4  # GEMV: output features per program
BLOCK_K = 512  # GEMV: K elements per step (contiguous, vectorized weight loads)
SPLIT_K = 1  # GEMV: K slices reduced by a second kernel (0: auto, ~TARGET_PROGRAMS programs)
TARGET_PROGRAMS = 264  # auto splits: programs to aim for (2 per SM on a 132-SM H100/H200)
GEMV_WARPS = 4  # GEMV: num_warps
W_EVICTION = "evict_first"  # "" or "evict_first": cache hint for the GEMV's streamed weight tiles
DEFER_REDUCE = True  # GEMV: keep [ROWS, BLOCK_N, BLOCK_K] partial products, reduce over K once at the end
GEMV_UNROLL = True  # GEMV: the unrolled kernel where it applies (<= GEMV_UNROLL_ROWS rows, <= GEMV_MAX_STEPS K steps)
GEMV_UNROLL_ROWS = 1  # GEMV: rows the unrolled kernel takes at most (1-4; more rows, more registers a program)
SMALL_MAX_ROWS = 16  # rows above GEMV_MAX_ROWS and up to this run 16-row tiles (batched decode)
SMALL_BLOCK_N = 16  # small-row matmul: output features per 16-row tile
SMALL_BLOCK_K = 128  # small-row matmul: K per step
SMALL_SPLIT_K = 0  # small-row matmul: K slices (0: auto, ~TARGET_PROGRAMS programs where tiles are few)
SMALL_WARPS = 4  # small-row matmul: num_warps
SMALL_STAGES = 5  # small-row matmul: software pipelining depth of the K loop
SMALL_SWAP_AB = False  # small-row matmul: weight tile as the dot's left operand (y^T = W x^T)
BLOCK_M = 64  # big-tile matmul (more rows: prefill): rows per tile
MM_BLOCK_N = 64  # big-tile matmul: output features per tile
MM_BLOCK_K = 32  # big-tile matmul: K per step
MM_SPLIT_K = 1  # big-tile matmul: K slices (0: auto, ~TARGET_PROGRAMS programs where tiles are few)
GROUP_M = 8  # big-tile matmul: row tiles per swizzle group
MM_WARPS = 4  # big-tile matmul: num_warps
NUM_STAGES = 3  # big-tile matmul: software pipelining depth of the K loop
# strategy:end

SMALL_BLOCK_M = 16  # rows per small-row tile: the smallest tl.dot tile
GEMV_MAX_STEPS = 32  # unrolled GEMV: K steps a slice may hold (the unrolled code and its compile time grow with it)
UNROLLED_MAX_ROWS = 4  # unrolled GEMV: rows a program can hold (one set of per-lane sums each)
GEMV_MIN_SLICE_STEPS = 4  # auto split: K steps a GEMV slice keeps at least
MATMUL_MIN_SLICE_STEPS = 8  # auto split: K steps a tl.dot slice keeps (its pipeline fills)
MAX_SLICES = 64  # auto split: at most this many K slices


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
def _x_tile(X, row, stride_xm, ks, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MASKED: tl.constexpr):
    """x[row, ks] as a [BLOCK_N, BLOCK_K] tile (every row the same), in the weight tile's layout: a
    [BLOCK_K] vector would need a layout change (shared memory and barriers) in every K step. The
    repeated addresses hit L1."""
    ptrs = tl.broadcast_to((X + row.to(tl.int64) * stride_xm + ks)[None, :], (BLOCK_N, BLOCK_K))
    if MASKED:
        return tl.load(ptrs, mask=(ks < K)[None, :], other=0.0).to(tl.float32)
    return tl.load(ptrs).to(tl.float32)


@triton.jit
def _gemv_row_out(lanes, row, pid_k, M, P, B, Y, cols, N, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    """Row `row` of this program's outputs: partial sums of its K slice, or bias, rounding and y."""
    acc = tl.sum(lanes, axis=1)
    mask = (cols < N) & ((row + tl.zeros_like(cols)) < M)  # elementwise: a scalar term broke the interpreter
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)
        tl.store(Y + row.to(tl.int64) * N + cols, acc.to(Y.dtype.element_ty), mask=mask)
    else:
        tl.store(P + (pid_k * M + row.to(tl.int64)) * N + cols, acc, mask=mask)


@triton.jit
def _gemv_unrolled(
    X,
    W,
    B,
    Y,
    P,
    M,
    N,
    stride_xm,
    stride_wn,
    K: tl.constexpr,
    SLICE: tl.constexpr,
    FULL_STEPS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVICT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    row0 = tl.program_id(2) * ROWS
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Columns past N re-read row N-1 and rows past M re-read row M-1 (their results are not
    # stored): no masks on the streamed loads; only steps that may cross K are masked.
    w_rows = W + tl.minimum(cols, N - 1).to(tl.int64)[:, None] * stride_wn
    r0 = tl.minimum(row0, M - 1)
    r1 = tl.minimum(row0 + 1, M - 1)
    r2 = tl.minimum(row0 + 2, M - 1)
    r3 = tl.minimum(row0 + 3, M - 1)
    l0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    l1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    l2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    l3 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    k0 = pid_k * SLICE
    for i in tl.static_range(SLICE // BLOCK_K):
        ks = k0 + i * BLOCK_K + tl.arange(0, BLOCK_K)
        # Steps below FULL_STEPS lie inside K in every slice: unmasked (decided at compile time).
        if i >= FULL_STEPS:
            w = tl.load(w_rows + ks[None, :], mask=(ks < K)[None, :], other=0.0, eviction_policy=EVICT)
        else:
            w = tl.load(w_rows + ks[None, :], eviction_policy=EVICT)
        w = w.to(tl.float32)  # products of 16-bit inputs are exact in float32
        l0 += _x_tile(X, r0, stride_xm, ks, K, BLOCK_N, BLOCK_K, i >= FULL_STEPS) * w
        if ROWS > 1:
            l1 += _x_tile(X, r1, stride_xm, ks, K, BLOCK_N, BLOCK_K, i >= FULL_STEPS) * w
        if ROWS > 2:
            l2 += _x_tile(X, r2, stride_xm, ks, K, BLOCK_N, BLOCK_K, i >= FULL_STEPS) * w
        if ROWS > 3:
            l3 += _x_tile(X, r3, stride_xm, ks, K, BLOCK_N, BLOCK_K, i >= FULL_STEPS) * w
    _gemv_row_out(l0, row0, pid_k, M, P, B, Y, cols, N, HAS_BIAS, SPLIT)
    if ROWS > 1:
        _gemv_row_out(l1, row0 + 1, pid_k, M, P, B, Y, cols, N, HAS_BIAS, SPLIT)
    if ROWS > 2:
        _gemv_row_out(l2, row0 + 2, pid_k, M, P, B, Y, cols, N, HAS_BIAS, SPLIT)
    if ROWS > 3:
        _gemv_row_out(l3, row0 + 3, pid_k, M, P, B, Y, cols, N, HAS_BIAS, SPLIT)


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
        acc = _dot(a, b, acc, X.dtype.element_ty == tl.float32)
        x_tile += BLOCK_K
        w_tile += BLOCK_K
    _store_tile(acc, rm, rn, M, N, B, Y, P, HAS_BIAS, SPLIT)


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b: float32 inputs as IEEE products (TF32 would not be float32 accuracy), 16-bit on the tensor cores."""
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _store_tile(acc, rm, rn, M, N, B, Y, P, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    """The [rows, features] tile `acc`: bias, one rounding and y, or this K slice's float32 partial sums."""
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(B + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(Y + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(Y.dtype.element_ty), mask=mask)
    else:
        part = P + (tl.program_id(1) * M + rm.to(tl.int64))[:, None] * N + rn[None, :]
        tl.store(part, acc, mask=mask)


@triton.jit
def _matmul_swapped(
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
):
    """The small-row tile transposed: acc[BLOCK_N, BLOCK_M] = W[cols, ks] @ x[rows, ks]^T."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    k_start = tl.program_id(1) * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    rk = tl.arange(0, BLOCK_K)
    w_tile = W + rn.to(tl.int64)[:, None] * stride_wn + (k_start + rk)[None, :]  # [BLOCK_N, BLOCK_K]
    x_tile = X + rm.to(tl.int64)[None, :] * stride_xm + (k_start + rk)[:, None]  # [BLOCK_K, BLOCK_M] of x^T
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        k_mask = (k + rk) < k_end
        w = tl.load(w_tile, mask=(rn < N)[:, None] & k_mask[None, :], other=0.0)
        xt = tl.load(x_tile, mask=k_mask[:, None] & (rm < M)[None, :], other=0.0)
        acc = _dot(w, xt, acc, X.dtype.element_ty == tl.float32)
        w_tile += BLOCK_K
        x_tile += BLOCK_K
    _store_tile(tl.trans(acc), rm, rn, M, N, B, Y, P, HAS_BIAS, SPLIT)


def _reduce_splits(partials, bias, y, m, n, split):
    block = 1024
    _splitk_reduce[(triton.cdiv(m * n, block),)](
        partials, bias, y, m, n, HAS_BIAS=bias is not None, SPLIT=split, BLOCK=block, num_warps=4
    )


def _k_slices(k: int, block_k: int, split: int, tiles: int, min_steps: int) -> tuple[int, int]:
    """(K slices, K per slice) for `split` slices asked (0: auto) over `tiles` output tiles.

    Auto: enough slices for ~TARGET_PROGRAMS programs, each at least `min_steps` K steps, so only
    few tiles over a long K are split. Slices are whole K steps; the last one may be shorter."""
    k_blocks = triton.cdiv(k, block_k)
    if split == 0:
        split = max(1, min(k_blocks // min_steps, TARGET_PROGRAMS // max(1, tiles), MAX_SLICES))
    k_per_split = triton.cdiv(k_blocks, min(split, k_blocks)) * block_k
    return triton.cdiv(k, k_per_split), k_per_split


def _launch_gemv(x2, weight, bias, y, m, n, k):
    rows = min(GEMV_ROWS or GEMV_MAX_ROWS, triton.next_power_of_2(m))
    n_blocks = triton.cdiv(n, BLOCK_N)
    split, k_per_split = _k_slices(k, BLOCK_K, SPLIT_K, n_blocks, GEMV_MIN_SLICE_STEPS)
    partials = torch.empty((split, m, n), dtype=torch.float32, device=x2.device) if split > 1 else y
    unrolled_rows = min(GEMV_ROWS or GEMV_MAX_ROWS, m)
    fits = unrolled_rows <= min(GEMV_UNROLL_ROWS, UNROLLED_MAX_ROWS) and k_per_split // BLOCK_K <= GEMV_MAX_STEPS
    if GEMV_UNROLL and fits:
        # Every slice but the last is whole steps; the last (shortest) one sets the unmasked steps.
        full_steps = (k - (split - 1) * k_per_split) // BLOCK_K
        _gemv_unrolled[(n_blocks, split, triton.cdiv(m, unrolled_rows))](
            x2,
            weight,
            bias,
            y,
            partials,
            m,
            n,
            x2.stride(0),
            weight.stride(0),
            K=k,
            SLICE=k_per_split,
            FULL_STEPS=full_steps,
            HAS_BIAS=bias is not None,
            SPLIT=split,
            ROWS=unrolled_rows,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
            EVICT=W_EVICTION,
            num_warps=GEMV_WARPS,
        )
    else:
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


def _launch_matmul(
    x2, weight, bias, y, m, n, k, *, block_m, block_n, block_k, split, group_m, warps, stages, swapped=False
):
    """A tiled tl.dot launch (`_matmul`, or `_matmul_swapped` for the transposed small-row tile), its
    K split over `split` slices (0: automatic) reduced by `_splitk_reduce`."""
    tiles_m, tiles_n = triton.cdiv(m, block_m), triton.cdiv(n, block_n)
    split, k_per_split = _k_slices(k, block_k, split, tiles_m * tiles_n, MATMUL_MIN_SLICE_STEPS)
    partials = torch.empty((split, m, n), dtype=torch.float32, device=x2.device) if split > 1 else y
    args = (x2, weight, bias, y, partials, m, n, k, x2.stride(0), weight.stride(0), k_per_split)
    meta = {
        "HAS_BIAS": bias is not None,
        "SPLIT": split,
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_K": block_k,
        "num_warps": warps,
        "num_stages": stages,
    }
    if swapped:
        _matmul_swapped[(tiles_n, split, tiles_m)](*args, **meta)
    else:
        _matmul[(tiles_m * tiles_n, split)](*args, GROUP_M=group_m, **meta)
    if split > 1:
        _reduce_splits(partials, bias, y, m, n, split)


def _launch_small_rows(x2, weight, bias, y, m, n, k):
    _launch_matmul(
        x2,
        weight,
        bias,
        y,
        m,
        n,
        k,
        block_m=SMALL_BLOCK_M,
        block_n=SMALL_BLOCK_N,
        block_k=SMALL_BLOCK_K,
        split=SMALL_SPLIT_K,
        group_m=triton.cdiv(SMALL_MAX_ROWS, SMALL_BLOCK_M),  # every row tile of a weight tile back to back
        warps=SMALL_WARPS,
        stages=SMALL_STAGES,
        swapped=SMALL_SWAP_AB,
    )


def _launch_big_tiles(x2, weight, bias, y, m, n, k):
    _launch_matmul(
        x2,
        weight,
        bias,
        y,
        m,
        n,
        k,
        block_m=BLOCK_M,
        block_n=MM_BLOCK_N,
        block_k=MM_BLOCK_K,
        split=MM_SPLIT_K,
        group_m=GROUP_M,
        warps=MM_WARPS,
        stages=NUM_STAGES,
    )


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
    elif m <= SMALL_MAX_ROWS:
        _launch_small_rows(x2, weight, bias, y, m, n, k)
    else:
        _launch_big_tiles(x2, weight, bias, y, m, n, k)
    return y
