"""Residual add + RMSNorm in one pass: s = (x + residual).to(x.dtype); returns (rms_norm(s), s).

Reads x and residual once and writes both outputs (4 row streams), where eager runs an add and the
norm's kernels. The norm follows Llama semantics (round the normalized value, then the weight).
"""

import torch
import triton
import triton.language as tl

OP = "add_rms_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]

# strategy:begin
BLOCK_H_MAX = 8192  # rows up to this (power-of-2) width stay in registers; wider rows are chunked
CHUNK = 4096  # slice width of the chunked kernel
ROWS_PER_PROGRAM = 1  # rows per tile
NUM_WARPS = 0  # 0: from the tile size (one warp per 512 elements, 1 to 16)
NUM_STAGES = 1  # software pipelining depth of the tile loop
MAX_PROGRAMS = 0  # 0: one program per tile; N: persistent grid of at most N programs
X_EVICTION = ""  # "" or "evict_first": cache hint for the streamed x / residual loads
# strategy:end


@triton.jit
def _add_rms_norm_rows(
    X,
    R,
    W,
    Y,
    S,
    n_rows,
    stride_x,
    stride_r,
    eps,
    H: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    EVICT: tl.constexpr,
):
    cols = tl.arange(0, BLOCK)
    col_mask = cols < H
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    n_tiles = tl.cdiv(n_rows, ROWS)
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rows = tile * ROWS + tl.arange(0, ROWS)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0, eviction_policy=EVICT)
        r = tl.load(R + rows64 * stride_r + cols[None, :], mask=mask, other=0.0, eviction_policy=EVICT)
        s = (x.to(tl.float32) + r.to(tl.float32)).to(S.dtype.element_ty)
        tl.store(S + rows64 * H + cols[None, :], s, mask=mask)
        sf = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(sf * sf, axis=1) / H + eps)
        normed = (sf * rstd[:, None]).to(S.dtype.element_ty).to(tl.float32)
        tl.store(Y + rows64 * H + cols[None, :], (normed * w[None, :]).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _add_rms_norm_chunked(
    X, R, W, Y, S, n_rows, n_cols, stride_x, stride_r, eps, BLOCK: tl.constexpr, EVICT: tl.constexpr
):
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        row64 = tl.cast(row, tl.int64)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(X + row64 * stride_x + cols, mask=mask, other=0.0, eviction_policy=EVICT)
            r = tl.load(R + row64 * stride_r + cols, mask=mask, other=0.0, eviction_policy=EVICT)
            s = (x.to(tl.float32) + r.to(tl.float32)).to(S.dtype.element_ty)
            tl.store(S + row64 * n_cols + cols, s, mask=mask)
            sf = s.to(tl.float32)
            acc += sf * sf
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        # The sums written above are re-read by other threads of this program.
        tl.debug_barrier()
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            sf = tl.load(S + row64 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            normed = (sf * rstd).to(S.dtype.element_ty).to(tl.float32)
            tl.store(Y + row64 * n_cols + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)


def entry(x, residual, *, weight, eps):
    """x, residual (..., H); weight (H,); eps float -> (normed, new_residual).

    new_residual = (x + residual) in x's dtype; normed = rms_norm(new_residual) in
    promote(x.dtype, weight.dtype), both shaped like x."""
    hidden = x.shape[-1]
    n_rows = x.numel() // hidden
    if x.is_contiguous():
        x2, stride = x, hidden
    else:
        x2 = x.reshape(n_rows, hidden)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        stride = x2.stride(0)
    block = triton.next_power_of_2(hidden)
    if residual.is_contiguous():
        r2, stride_r = residual, hidden
    else:
        r2 = residual.reshape(n_rows, hidden)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        stride_r = r2.stride(0)
    s = torch.empty_like(x, memory_format=torch.contiguous_format)
    if weight.dtype == x.dtype:
        y = torch.empty_like(s)
    else:
        y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if block <= BLOCK_H_MAX:
        rows = ROWS_PER_PROGRAM
        if n_rows < rows:
            rows = max(1, triton.next_power_of_2(n_rows))
        tiles = triton.cdiv(n_rows, rows)
        grid = (min(tiles, MAX_PROGRAMS) if MAX_PROGRAMS else tiles,)
        _add_rms_norm_rows[grid](
            x2,
            r2,
            weight,
            y,
            s,
            n_rows,
            stride,
            stride_r,
            eps,
            H=hidden,
            BLOCK=block,
            ROWS=rows,
            EVICT=X_EVICTION,
            num_warps=NUM_WARPS or max(1, min(16, block * rows // 512)),
            num_stages=NUM_STAGES,
        )
    else:
        grid = (min(n_rows, MAX_PROGRAMS) if MAX_PROGRAMS else n_rows,)
        _add_rms_norm_chunked[grid](
            x2,
            r2,
            weight,
            y,
            s,
            n_rows,
            hidden,
            stride,
            stride_r,
            eps,
            BLOCK=CHUNK,
            EVICT=X_EVICTION,
            num_warps=NUM_WARPS or max(1, min(16, CHUNK // 512)),
            num_stages=NUM_STAGES,
        )
    return y, s
