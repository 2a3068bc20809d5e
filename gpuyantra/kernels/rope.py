"""Rotary embedding (rotate-half) on q and k in one launch.

Two kernels over the same math, [rows, D/2] tiles of the two halves in float32, rounded once:
    out1 = x1 * cos1 - x2 * sin1,  out2 = x2 * cos2 + x1 * sin2
* token mode (FLAT_ROWS = 0): a program takes one token (b, s), loads its cos/sin once and rotates
  every q head and every k head of the token, HEAD_BLOCK heads per step;
* flat mode (FLAT_ROWS = N): the (b, s, h) head vectors of q and then of k form one row space in
  memory order of the usual layout; a program streams N consecutive rows (cos/sin re-read from
  cache per row), the first programs doing q and the rest k.
Dims past the rotary width (partial rotary) are copied. q/k may be strided views (the usual
[B, S, H, D] -> transpose(1, 2) layout); outputs keep the inputs' layout.
"""
import torch
import triton
import triton.language as tl

OP = "rope"
ADAPTER = [
]

# strategy:begin
HEAD_BLOCK = 0  # heads per tile; 0: all heads of the token in one tile
NUM_WARPS = 0  # 0: from the tile size (one warp per 256 elements, 1 to 8)
MAX_PROGRAMS = 0  # 0: one program per token; N: persistent grid of at most N programs (token mode)
FLAT_ROWS = 0  # 0: token mode; N: flat mode, N head vectors per program
# strategy:end


@triton.jit
def _rope_heads(X, XO, base, n_heads, stride_h, d, d_mask, c1, c2, s1, s2, head_dim,
                HALF: tl.constexpr, HEAD_BLOCK: tl.constexpr, HAS_PASS: tl.constexpr, BLOCK_PASS: tl.constexpr):
    for h0 in range(0, n_heads, HEAD_BLOCK):
        heads = h0 + tl.arange(0, HEAD_BLOCK)
        row = base + heads.to(tl.int64)[:, None] * stride_h
        mask = (heads < n_heads)[:, None] & d_mask[None, :]
        x1 = tl.load(X + row + d[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(X + row + HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(XO + row + d[None, :], (x1 * c1[None, :] - x2 * s1[None, :]).to(XO.dtype.element_ty), mask=mask)
        tl.store(XO + row + HALF + d[None, :], (x2 * c2[None, :] + x1 * s2[None, :]).to(XO.dtype.element_ty),
                 mask=mask)
        if HAS_PASS:
            p = 2 * HALF + tl.arange(0, BLOCK_PASS)
            pmask = (heads < n_heads)[:, None] & (p < head_dim)[None, :]
            tl.store(XO + row + p[None, :], tl.load(X + row + p[None, :], mask=pmask, other=0.0), mask=pmask)


@triton.jit
def _rope_kernel(Q, K, COS, SIN, QO, KO, seq_len, n_tokens, hq, hk, head_dim,
                 sqb, sqh, sqs, skb, skh, sks, scb, scs,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, HAS_PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
                 HEAD_BLOCK_Q: tl.constexpr, HEAD_BLOCK_K: tl.constexpr):
    d = tl.arange(0, BLOCK_HALF)
    d_mask = d < HALF
    for token in range(tl.program_id(0), n_tokens, tl.num_programs(0)):
        b = tl.cast(token // seq_len, tl.int64)
        s = tl.cast(token % seq_len, tl.int64)
        cs = b * scb + s * scs
        c1 = tl.load(COS + cs + d, mask=d_mask, other=0.0).to(tl.float32)
        c2 = tl.load(COS + cs + HALF + d, mask=d_mask, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + cs + d, mask=d_mask, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + cs + HALF + d, mask=d_mask, other=0.0).to(tl.float32)
        _rope_heads(Q, QO, b * sqb + s * sqs, hq, sqh, d, d_mask, c1, c2, s1, s2, head_dim,
                    HALF, HEAD_BLOCK_Q, HAS_PASS, BLOCK_PASS)
        _rope_heads(K, KO, b * skb + s * sks, hk, skh, d, d_mask, c1, c2, s1, s2, head_dim,
                    HALF, HEAD_BLOCK_K, HAS_PASS, BLOCK_PASS)


@triton.jit
def _rope_rows(X, XO, COS, SIN, start, n_rows, n_heads, seq_len, sb, sh, ss, scb, scs, head_dim,
               HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, HAS_PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
               ROWS: tl.constexpr):
    rows = start + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    head = rows % n_heads
    token = rows // n_heads
    s = (token % seq_len).to(tl.int64)
    b = (token // seq_len).to(tl.int64)
    base = (b * sb + head.to(tl.int64) * sh + s * ss)[:, None]
    cbase = (b * scb + s * scs)[:, None]
    d = tl.arange(0, BLOCK_HALF)[None, :]
    mask = row_mask[:, None] & (d < HALF)
    x1 = tl.load(X + base + d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + base + HALF + d, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(COS + cbase + d, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(COS + cbase + HALF + d, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(SIN + cbase + d, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(SIN + cbase + HALF + d, mask=mask, other=0.0).to(tl.float32)
    tl.store(XO + base + d, (x1 * c1 - x2 * s1).to(XO.dtype.element_ty), mask=mask)
    tl.store(XO + base + HALF + d, (x2 * c2 + x1 * s2).to(XO.dtype.element_ty), mask=mask)
    if HAS_PASS:
        p = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, :]
        pmask = row_mask[:, None] & (p < head_dim)
        tl.store(XO + base + p, tl.load(X + base + p, mask=pmask, other=0.0), mask=pmask)


@triton.jit
def _rope_flat(Q, K, COS, SIN, QO, KO, seq_len, hq, hk, head_dim, n_q_rows, n_k_rows, q_programs,
               sqb, sqh, sqs, skb, skh, sks, scb, scs,
               HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, HAS_PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
               ROWS: tl.constexpr):
    pid = tl.program_id(0)
    if pid < q_programs:
        _rope_rows(Q, QO, COS, SIN, pid * ROWS, n_q_rows, hq, seq_len, sqb, sqh, sqs, scb, scs, head_dim,
                   HALF, BLOCK_HALF, HAS_PASS, BLOCK_PASS, ROWS)
    else:
        _rope_rows(K, KO, COS, SIN, (pid - q_programs) * ROWS, n_k_rows, hk, seq_len, skb, skh, sks, scb, scs,
                   head_dim, HALF, BLOCK_HALF, HAS_PASS, BLOCK_PASS, ROWS)


def entry(q, k, cos, sin):
    """q [B, Hq, S, D], k [B, Hk, S, D], cos/sin [B or 1, S, R] (R <= D, even) -> (q_embed, k_embed)."""
    batch, hq, seq, head_dim = q.shape
    hk = k.shape[1]
    rot = cos.shape[-1]
    sq = q.stride()
    sk = k.stride()
    sc = cos.stride()
    qo = torch.empty_like(q)
    if sq[3] != 1 or qo.stride() != sq:
        q = q.contiguous()
        sq = q.stride()
        qo = torch.empty_like(q)
    ko = torch.empty_like(k)
    if sk[3] != 1 or ko.stride() != sk:
        k = k.contiguous()
        sk = k.stride()
        ko = torch.empty_like(k)
    if sc[-1] != 1 or sin.stride() != sc:
        cos = cos.contiguous()
        sin = sin.contiguous()
        sc = cos.stride()
    n_tokens = batch * seq
    half = rot // 2
    block_half = triton.next_power_of_2(half)
    hbq = triton.next_power_of_2(hq)
    hbk = triton.next_power_of_2(hk)
    if HEAD_BLOCK:
        hbq = min(hbq, HEAD_BLOCK)
        hbk = min(hbk, HEAD_BLOCK)
    if FLAT_ROWS:
        q_programs = triton.cdiv(n_tokens * hq, FLAT_ROWS)
        _rope_flat[(q_programs + triton.cdiv(n_tokens * hk, FLAT_ROWS),)](
            q, k, cos, sin, qo, ko, seq, hq, hk, head_dim, n_tokens * hq, n_tokens * hk, q_programs,
            sq[0], sq[1], sq[2], sk[0], sk[1], sk[2], sc[0] if cos.shape[0] != 1 else 0, sc[1],
            HALF=half, BLOCK_HALF=block_half, HAS_PASS=rot < head_dim,
            BLOCK_PASS=triton.next_power_of_2(head_dim - rot) if rot < head_dim else 1, ROWS=FLAT_ROWS,
            num_warps=NUM_WARPS or max(1, min(8, FLAT_ROWS * block_half // 128)))
        return qo, ko
    grid = (min(n_tokens, MAX_PROGRAMS) if MAX_PROGRAMS else n_tokens,)
    _rope_kernel[grid](q, k, cos, sin, qo, ko, seq, n_tokens, hq, hk, head_dim,
                       sq[0], sq[1], sq[2], sk[0], sk[1], sk[2], sc[0] if cos.shape[0] != 1 else 0, sc[1],
                       HALF=half, BLOCK_HALF=block_half, HAS_PASS=rot < head_dim,
                       BLOCK_PASS=triton.next_power_of_2(head_dim - rot) if rot < head_dim else 1,
                       HEAD_BLOCK_Q=hbq, HEAD_BLOCK_K=hbk,
                       num_warps=NUM_WARPS or max(1, min(8, hbq * block_half // 128)))
    return qo, ko
