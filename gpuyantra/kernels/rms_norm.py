"""RMSNorm (Llama / Qwen / Mistral semantics): y = weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype).

Two kernels. `_rms_norm_rows` keeps whole rows in registers and normalizes a [ROWS, BLOCK] tile per
step; with MAX_PROGRAMS > 0 the grid is capped and each program strides over the tiles (a
persistent grid that loads the weight once). `_rms_norm_chunked` handles rows wider than
BLOCK_H_MAX: a sum-of-squares pass and a write pass over CHUNK-wide slices.
"""

import torch
import triton
import triton.language as tl

OP = "rms_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]

# strategy:begin
BLOCK_H_MAX = 8192  # rows up to this (power-of-2) width stay in registers; wider rows are chunked
CHUNK = 4096  # slice width of the chunked kernel
ROWS_PER_PROGRAM = 1  # rows per tile (amortizes the weight load and launch for small H)
NUM_WARPS = 0  # 0: from the tile size (one warp per 512 elements, 1 to 16)
NUM_STAGES = 1  # software pipelining depth of the tile loop
MAX_PROGRAMS = 0  # 0: one program per tile; N: persistent grid of at most N programs
X_EVICTION = ""  # "" or "evict_first": cache hint for the streamed x loads
# strategy:end


@triton.jit
def _rms_norm_rows(
    X, W, Y, n_rows, stride_x, eps, H: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, EVICT: tl.constexpr
):
    cols = tl.arange(0, BLOCK)
    col_mask = cols < H
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    n_tiles = tl.cdiv(n_rows, ROWS)
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rows = tile * ROWS + tl.arange(0, ROWS)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / H + eps)
        # Round the normalized value to the input dtype before the weight, as transformers does.
        normed = (x * rstd[:, None]).to(X.dtype.element_ty).to(tl.float32)
        tl.store(Y + rows64 * H + cols[None, :], (normed * w[None, :]).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_chunked(X, W, Y, n_rows, n_cols, stride_x, eps, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * stride_x
        y_row = Y + tl.cast(row, tl.int64) * n_cols
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
            w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            normed = (x * rstd).to(X.dtype.element_ty).to(tl.float32)
            tl.store(y_row + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)


def entry(x, *, weight, eps):
    """x (..., H), weight (H,), eps float -> y (..., H) of dtype promote(x.dtype, weight.dtype)."""
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
    if weight.dtype == x.dtype:
        y = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if block <= BLOCK_H_MAX:
        rows = ROWS_PER_PROGRAM
        if n_rows < rows:
            rows = max(1, triton.next_power_of_2(n_rows))
        tiles = triton.cdiv(n_rows, rows)
        grid = (min(tiles, MAX_PROGRAMS) if MAX_PROGRAMS else tiles,)
        _rms_norm_rows[grid](
            x2,
            weight,
            y,
            n_rows,
            stride,
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
        _rms_norm_chunked[grid](
            x2,
            weight,
            y,
            n_rows,
            hidden,
            stride,
            eps,
            BLOCK=CHUNK,
            EVICT=X_EVICTION,
            num_warps=NUM_WARPS or max(1, min(16, CHUNK // 512)),
            num_stages=NUM_STAGES,
        )
    return y
