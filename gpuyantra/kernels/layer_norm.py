"""LayerNorm over the last dim in float32: y = ((x - mean) * rstd * weight + bias).to(x.dtype).

Mean and variance come from the row held in registers (x is read once): two dependent reductions
(mean, then centered squares, as torch computes them), or with SHIFTED_STATS one paired reduction of
shifted moments. RELOAD_AFFINE re-reads weight/bias per tile instead of holding them in float32
registers (fewer registers per program, more programs per SM). Rows wider than BLOCK_H_MAX use a
chunked kernel (sum pass, centered-square pass, write pass). weight and bias may be None.
"""

import torch
import triton
import triton.language as tl

OP = "layer_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "bias", "module_attr": "bias"},
    {"kernel_param": "eps", "module_attr": "eps"},
]

# strategy:begin
BLOCK_H_MAX = 8192  # rows up to this (power-of-2) width stay in registers; wider rows are chunked
CHUNK = 4096  # slice width of the chunked kernel
ROWS_PER_PROGRAM = 1  # rows per tile
NUM_WARPS = 0  # 0: from the tile size (one warp per 512 elements, 1 to 16)
NUM_STAGES = 1  # software pipelining depth of the tile loop
MAX_PROGRAMS = 0  # 0: one program per tile; N: persistent grid of at most N programs
X_EVICTION = ""  # "" or "evict_first": cache hint for the streamed x loads
SHIFTED_STATS = True  # True: mean and variance from one sweep of x - x[0] (one paired reduction)
RELOAD_AFFINE = True  # True: weight/bias re-read per tile after the stats instead of held in registers
# strategy:end


@triton.jit
def _add_pair(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit
def _layer_norm_rows(
    X,
    W,
    B,
    Y,
    n_rows,
    stride_x,
    eps,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    SHIFTED: tl.constexpr,
    RELOAD: tl.constexpr,
    H: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    EVICT: tl.constexpr,
):
    cols = tl.arange(0, BLOCK)
    col_mask = cols < H
    if not RELOAD:
        # Held in float32 registers for the program's life (2 x BLOCK / threads registers each).
        if HAS_W:
            w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        if HAS_B:
            b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    n_tiles = tl.cdiv(n_rows, ROWS)
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rows = tile * ROWS + tl.arange(0, ROWS)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        # x is read once; mean and variance come from the registers. Padded rows load zeros, so
        # only padded columns (H not a power of 2) need zeroing before the sums.
        x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
        if SHIFTED:
            # Shifted one-pass moments in ONE reduction round (a paired sum of d and d^2); the
            # shift by the row's first element keeps E[d^2] - E[d]^2 free of cancellation.
            k = tl.load(X + rows64 * stride_x, mask=(rows < n_rows)[:, None], other=0.0).to(tl.float32)
            dlt = x - k
            if H < BLOCK:
                dlt = tl.where(col_mask[None, :], dlt, 0.0)
            s1, s2 = tl.reduce((dlt, dlt * dlt), 1, _add_pair)
            m1 = s1 / H
            var = tl.maximum(s2 / H - m1 * m1, 0.0)
            xc = dlt - m1[:, None]
        else:
            # Two dependent reductions: the mean, then the centered squares (as torch computes them).
            mean = tl.sum(x, axis=1) / H
            xc = x - mean[:, None]
            if H < BLOCK:
                xc = tl.where(col_mask[None, :], xc, 0.0)
            var = tl.sum(xc * xc, axis=1) / H
        y = xc * tl.rsqrt(var + eps)[:, None]
        if RELOAD:
            # Re-read per tile after the statistics (L1/L2 hits): the registers stay free for x
            # while the loads are in flight, so more programs fit on an SM.
            if HAS_W:
                y = y * tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
            if HAS_B:
                y = y + tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        else:
            if HAS_W:
                y = y * w[None, :]
            if HAS_B:
                y = y + b[None, :]
        tl.store(Y + rows64 * H + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_chunked(
    X,
    W,
    B,
    Y,
    n_rows,
    n_cols,
    stride_x,
    eps,
    HAS_W: tl.constexpr,
    HAS_B: tl.constexpr,
    SHIFTED: tl.constexpr,
    BLOCK: tl.constexpr,
    EVICT: tl.constexpr,
):
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * stride_x
        y_row = Y + tl.cast(row, tl.int64) * n_cols
        if SHIFTED:
            # One statistics pass: shifted sums of x - x[0] and their squares.
            k = tl.load(x_row).to(tl.float32)
            acc1 = tl.zeros([BLOCK], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                mask = cols < n_cols
                dlt = tl.where(mask, tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) - k, 0.0)
                acc1 += dlt
                acc2 += dlt * dlt
            m1 = tl.sum(acc1, axis=0) / n_cols
            mean = k + m1
            rstd = tl.rsqrt(tl.maximum(tl.sum(acc2, axis=0) / n_cols - m1 * m1, 0.0) + eps)
        else:
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                acc += tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            mean = tl.sum(acc, axis=0) / n_cols
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                mask = cols < n_cols
                xc = tl.where(mask, tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32) - mean, 0.0)
                acc += xc * xc
            rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy=EVICT).to(tl.float32)
            y = (x - mean) * rstd
            if HAS_W:
                y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, y.to(Y.dtype.element_ty), mask=mask)


def entry(x, *, weight, bias, eps):
    """x (..., H); weight, bias (H,) or None; eps float -> y (..., H) in x's dtype."""
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
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if block <= BLOCK_H_MAX:
        rows = ROWS_PER_PROGRAM
        if n_rows < rows:
            rows = max(1, triton.next_power_of_2(n_rows))
        tiles = triton.cdiv(n_rows, rows)
        grid = (min(tiles, MAX_PROGRAMS) if MAX_PROGRAMS else tiles,)
        _layer_norm_rows[grid](
            x2,
            weight,
            bias,
            y,
            n_rows,
            stride,
            eps,
            HAS_W=weight is not None,
            HAS_B=bias is not None,
            SHIFTED=SHIFTED_STATS,
            RELOAD=RELOAD_AFFINE,
            H=hidden,
            BLOCK=block,
            ROWS=rows,
            EVICT=X_EVICTION,
            num_warps=NUM_WARPS or max(1, min(16, block * rows // 512)),
            num_stages=NUM_STAGES,
        )
    else:
        grid = (min(n_rows, MAX_PROGRAMS) if MAX_PROGRAMS else n_rows,)
        _layer_norm_chunked[grid](
            x2,
            weight,
            bias,
            y,
            n_rows,
            hidden,
            stride,
            eps,
            HAS_W=weight is not None,
            HAS_B=bias is not None,
            SHIFTED=SHIFTED_STATS,
            BLOCK=CHUNK,
            EVICT=X_EVICTION,
            num_warps=NUM_WARPS or max(1, min(16, CHUNK // 512)),
            num_stages=NUM_STAGES,
        )
    return y
