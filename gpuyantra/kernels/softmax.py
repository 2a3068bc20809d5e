"""Last-dim softmax in float32, rounded to x's dtype: y = exp(x - max) / sum(exp(x - max)).

Rows up to BLOCK_H_MAX wide: one read, one write from registers. Wider rows: an online pass that
keeps a running max and rescaled sum per lane, then a write pass.
"""

import torch
import triton
import triton.language as tl

OP = "softmax"
ADAPTER = [  # type: ignore[var-annotated]  # kept bare: render() rewrites this block by regex
]

# strategy:begin
BLOCK_H_MAX = 8192  # rows up to this (power-of-2) width stay in registers; wider rows are chunked
CHUNK = 4096  # slice width of the chunked kernel
ROWS_PER_PROGRAM = 1  # rows per tile
NUM_WARPS = 0  # 0: from the tile size (one warp per 512 elements, 1 to 16)
NUM_STAGES = 1  # software pipelining depth of the tile loop
MAX_PROGRAMS = 0  # 0: one program per tile; N: persistent grid of at most N programs
X_EVICTION = ""  # "" or "evict_first": cache hint for the streamed x loads
# strategy:end


@triton.jit
def _softmax_rows(
    X, Y, n_rows, stride_x, H: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, EVICT: tl.constexpr
):
    cols = tl.arange(0, BLOCK)
    col_mask = cols < H
    n_tiles = tl.cdiv(n_rows, ROWS)
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rows = tile * ROWS + tl.arange(0, ROWS)
        mask = (rows < n_rows)[:, None] & col_mask[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=-float("inf"), eviction_policy=EVICT).to(
            tl.float32
        )
        m = tl.max(x, axis=1)
        e = tl.exp(x - m[:, None])
        y = e / tl.sum(e, axis=1)[:, None]
        tl.store(Y + rows64 * H + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_chunked(X, Y, n_rows, n_cols, stride_x, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    for row in range(tl.program_id(0), n_rows, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * stride_x
        y_row = Y + tl.cast(row, tl.int64) * n_cols
        m_lane = tl.full([BLOCK], -float("inf"), tl.float32)
        s_lane = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m_lane, x)
            # Lanes that have seen only -inf keep a zero sum (avoids -inf - -inf).
            safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s_lane = s_lane * tl.exp(m_lane - safe) + tl.exp(x - safe)
            m_lane = m_new
        m = tl.max(m_lane, axis=0)
        total = tl.sum(tl.where(m_lane == -float("inf"), 0.0, s_lane * tl.exp(m_lane - m)), axis=0)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=-float("inf"), eviction_policy=EVICT).to(tl.float32)
            tl.store(y_row + cols, (tl.exp(x - m) / total).to(Y.dtype.element_ty), mask=mask)


def entry(x):
    """x (..., N) -> softmax over the last dim computed in float32, in x's dtype."""
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
        _softmax_rows[grid](
            x2,
            y,
            n_rows,
            stride,
            H=hidden,
            BLOCK=block,
            ROWS=rows,
            EVICT=X_EVICTION,
            num_warps=NUM_WARPS or max(1, min(16, block * rows // 512)),
            num_stages=NUM_STAGES,
        )
    else:
        grid = (min(n_rows, MAX_PROGRAMS) if MAX_PROGRAMS else n_rows,)
        _softmax_chunked[grid](
            x2,
            y,
            n_rows,
            hidden,
            stride,
            BLOCK=CHUNK,
            EVICT=X_EVICTION,
            num_warps=NUM_WARPS or max(1, min(16, CHUNK // 512)),
            num_stages=NUM_STAGES,
        )
    return y
