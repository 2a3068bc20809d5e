"""Rotary embedding (rotate-half) on q and k in one launch.

Two kernels over the same math, [.., D/2] tiles of the two halves in float32:
    out1 = x1 * cos1 - x2 * sin1,  out2 = x2 * cos2 + x1 * sin2
each product and each sum rounded to the output dtype, as eager's `q * cos + rotate_half(q) * sin`
rounds in bfloat16/float16 (and launched without FMA contraction, as eager rounds each float32 op):
a kernel rounding once is more accurate, but its outputs differ from eager's in the last bit often
enough to change a served model's greedy output.
* token mode (FLAT_ROWS = 0): a program takes TOKENS_PER_PROGRAM tokens (b, s), loads their cos/sin
  once and rotates every q head and every k head of those tokens in [tokens, heads, D/2] tiles. With
  all heads in one tile (HEAD_BLOCK = 0) every q and k load is issued before the first store (one
  memory round trip per program); HEAD_BLOCK = N walks the heads N at a time instead;
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
ADAPTER = [  # type: ignore[var-annotated]  # kept bare: render() rewrites this block by regex
]

# strategy:begin
HEAD_BLOCK = 0  # heads per tile; 0: all heads of the tokens in one tile (all loads before the stores)
TOKENS_PER_PROGRAM = 2  # tokens per tile in token mode (cos/sin loaded once per token, shared by all heads)
NUM_WARPS = 0  # 0: from the tile size (one warp per 512 q elements of a half, 1 to 8)
MAX_PROGRAMS = 0  # 0: one program per token tile; N: persistent grid of at most N programs (token mode)
FLAT_ROWS = 0  # 0: token mode; N: flat mode, N head vectors per program
# strategy:end


@triton.jit
def _rotate_as_eager(x1, x2, c1, c2, s1, s2, XO, ROUND16: tl.constexpr):
    """(x1 c1 - x2 s1, x2 c2 + x1 s2) rounded as eager rounds: each product and sum in XO's dtype
    when q and cos share a 16-bit dtype (ROUND16), else in float32 (cos/sin in float32 promote)."""
    dt = XO.dtype.element_ty
    if ROUND16:
        o1 = (x1 * c1).to(dt).to(tl.float32) - (x2 * s1).to(dt).to(tl.float32)
        o2 = (x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)
    else:
        o1 = x1 * c1 - x2 * s1
        o2 = x2 * c2 + x1 * s2
    return o1.to(dt), o2.to(dt)


@triton.jit
def _rope_rotate(X, XO, off, mask, c1, c2, s1, s2, HALF: tl.constexpr, ROUND16: tl.constexpr):
    """Load both halves at `off` (any tile shape), rotate, store: one head block."""
    x1 = tl.load(X + off, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(X + off + HALF, mask=mask, other=0.0).to(tl.float32)
    o1, o2 = _rotate_as_eager(x1, x2, c1, c2, s1, s2, XO, ROUND16)
    tl.store(XO + off, o1, mask=mask)
    tl.store(XO + off + HALF, o2, mask=mask)


@triton.jit
def _rope_copy_tail(X, XO, base, mask_th, HEAD_DIM: tl.constexpr, ROT: tl.constexpr, BLOCK_PASS: tl.constexpr):
    """Partial rotary: copy dims ROT..HEAD_DIM of a [tokens, heads] block unchanged."""
    p = ROT + tl.arange(0, BLOCK_PASS)[None, None, :]
    pmask = mask_th & (p < HEAD_DIM)
    tl.store(XO + base + p, tl.load(X + base + p, mask=pmask, other=0.0), mask=pmask)


@triton.jit
def _rope_kernel(
    Q,
    K,
    COS,
    SIN,
    QO,
    KO,
    seq_len,
    n_tokens,
    sqb,
    sqh,
    sqs,
    skb,
    skh,
    sks,
    scb,
    scs,
    HQ: tl.constexpr,
    HK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    HAS_PASS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    TOKENS: tl.constexpr,
    HBQ: tl.constexpr,
    HBK: tl.constexpr,
    ONE_SHOT: tl.constexpr,
    ROUND16: tl.constexpr,
):
    d = tl.arange(0, BLOCK_HALF)[None, None, :]  # [1, 1, BLOCK_HALF]
    d_mask = d < HALF
    hq = tl.arange(0, HBQ)[None, :, None]  # [1, HBQ, 1]
    hk = tl.arange(0, HBK)[None, :, None]
    for blk in range(tl.program_id(0), tl.cdiv(n_tokens, TOKENS), tl.num_programs(0)):
        tok = blk * TOKENS + tl.arange(0, TOKENS)
        t_mask = (tok < n_tokens)[:, None, None]  # [TOKENS, 1, 1]
        b = (tok // seq_len).to(tl.int64)[:, None, None]
        s = (tok % seq_len).to(tl.int64)[:, None, None]
        # cos/sin of each token: loaded once, broadcast over every q and k head.
        cs = b * scb + s * scs + d
        cs_mask = t_mask & d_mask
        c1 = tl.load(COS + cs, mask=cs_mask, other=0.0).to(tl.float32)
        c2 = tl.load(COS + cs + HALF, mask=cs_mask, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + cs, mask=cs_mask, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + cs + HALF, mask=cs_mask, other=0.0).to(tl.float32)
        q_base = b * sqb + s * sqs
        k_base = b * skb + s * sks
        if ONE_SHOT:
            # Every head of q and k in one tile each: all four loads are in flight before any store.
            q_row = q_base + hq.to(tl.int64) * sqh
            k_row = k_base + hk.to(tl.int64) * skh
            q_th = t_mask & (hq < HQ)
            k_th = t_mask & (hk < HK)
            q_mask = q_th & d_mask
            k_mask = k_th & d_mask
            q1 = tl.load(Q + q_row + d, mask=q_mask, other=0.0)
            q2 = tl.load(Q + q_row + HALF + d, mask=q_mask, other=0.0)
            k1 = tl.load(K + k_row + d, mask=k_mask, other=0.0)
            k2 = tl.load(K + k_row + HALF + d, mask=k_mask, other=0.0)
            q1 = q1.to(tl.float32)
            q2 = q2.to(tl.float32)
            k1 = k1.to(tl.float32)
            k2 = k2.to(tl.float32)
            qa, qb = _rotate_as_eager(q1, q2, c1, c2, s1, s2, QO, ROUND16)
            ka, kb = _rotate_as_eager(k1, k2, c1, c2, s1, s2, KO, ROUND16)
            tl.store(QO + q_row + d, qa, mask=q_mask)
            tl.store(QO + q_row + HALF + d, qb, mask=q_mask)
            tl.store(KO + k_row + d, ka, mask=k_mask)
            tl.store(KO + k_row + HALF + d, kb, mask=k_mask)
            if HAS_PASS:
                _rope_copy_tail(Q, QO, q_row, q_th, HEAD_DIM, 2 * HALF, BLOCK_PASS)
                _rope_copy_tail(K, KO, k_row, k_th, HEAD_DIM, 2 * HALF, BLOCK_PASS)
        else:
            for h0 in range(0, HQ, HBQ):
                row = q_base + (h0 + hq).to(tl.int64) * sqh
                th = t_mask & (h0 + hq < HQ)
                _rope_rotate(Q, QO, row + d, th & d_mask, c1, c2, s1, s2, HALF, ROUND16)
                if HAS_PASS:
                    _rope_copy_tail(Q, QO, row, th, HEAD_DIM, 2 * HALF, BLOCK_PASS)
            for h0 in range(0, HK, HBK):
                row = k_base + (h0 + hk).to(tl.int64) * skh
                th = t_mask & (h0 + hk < HK)
                _rope_rotate(K, KO, row + d, th & d_mask, c1, c2, s1, s2, HALF, ROUND16)
                if HAS_PASS:
                    _rope_copy_tail(K, KO, row, th, HEAD_DIM, 2 * HALF, BLOCK_PASS)


@triton.jit
def _rope_rows(
    X,
    XO,
    COS,
    SIN,
    start,
    n_rows,
    n_heads,
    seq_len,
    sb,
    sh,
    ss,
    scb,
    scs,
    head_dim,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    HAS_PASS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    ROWS: tl.constexpr,
    ROUND16: tl.constexpr,
):
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
    o1, o2 = _rotate_as_eager(x1, x2, c1, c2, s1, s2, XO, ROUND16)
    tl.store(XO + base + d, o1, mask=mask)
    tl.store(XO + base + HALF + d, o2, mask=mask)
    if HAS_PASS:
        p = 2 * HALF + tl.arange(0, BLOCK_PASS)[None, :]
        pmask = row_mask[:, None] & (p < head_dim)
        tl.store(XO + base + p, tl.load(X + base + p, mask=pmask, other=0.0), mask=pmask)


@triton.jit
def _rope_flat(
    Q,
    K,
    COS,
    SIN,
    QO,
    KO,
    seq_len,
    hq,
    hk,
    head_dim,
    n_q_rows,
    n_k_rows,
    q_programs,
    sqb,
    sqh,
    sqs,
    skb,
    skh,
    sks,
    scb,
    scs,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    HAS_PASS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    ROWS: tl.constexpr,
    ROUND16: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < q_programs:
        _rope_rows(
            Q,
            QO,
            COS,
            SIN,
            pid * ROWS,
            n_q_rows,
            hq,
            seq_len,
            sqb,
            sqh,
            sqs,
            scb,
            scs,
            head_dim,
            HALF,
            BLOCK_HALF,
            HAS_PASS,
            BLOCK_PASS,
            ROWS,
            ROUND16,
        )
    else:
        _rope_rows(
            K,
            KO,
            COS,
            SIN,
            (pid - q_programs) * ROWS,
            n_k_rows,
            hk,
            seq_len,
            skb,
            skh,
            sks,
            scb,
            scs,
            head_dim,
            HALF,
            BLOCK_HALF,
            HAS_PASS,
            BLOCK_PASS,
            ROWS,
            ROUND16,
        )


def _non_overlapping(x: torch.Tensor) -> bool:
    """No two elements share an address: dims ordered by stride, each steps past the previous span."""
    span = 1
    for stride, size in sorted((st, d) for d, st in zip(x.shape, x.stride()) if d > 1):
        if stride < span:
            return False
        span = stride * size
    return True


def _in_kernel_layout(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels index it, with one set of strides for input and output (the output is
    allocated with x's strides). A head-dim-contiguous, non-overlapping view keeps its layout even
    when it is not dense (the q and k slices of a fused q/k/v output at batch > 1): the output then
    spans the same gaps, where a copy to a dense layout costs a launch per call. Anything else is
    copied to dense."""
    if x.shape[-1] > 1 and x.stride(-1) != 1 or not _non_overlapping(x):
        return x.contiguous()
    return x


def entry(q, k, cos, sin):
    """q [B, Hq, S, D], k [B, Hk, S, D], cos/sin [B or 1, S, R] (R <= D, even) -> (q_embed, k_embed)."""
    batch, hq, seq, head_dim = q.shape
    hk = k.shape[1]
    rot = cos.shape[-1]
    sc = cos.stride()
    q = _in_kernel_layout(q)
    k = _in_kernel_layout(k)
    qo = torch.empty_strided(q.shape, q.stride(), dtype=q.dtype, device=q.device)
    ko = torch.empty_strided(k.shape, k.stride(), dtype=k.dtype, device=k.device)
    sq = q.stride()
    sk = k.stride()
    if sc[-1] != 1 or sin.stride() != sc:
        cos = cos.contiguous()
        sin = sin.contiguous()
        sc = cos.stride()
    n_tokens = batch * seq
    half = rot // 2
    block_half = triton.next_power_of_2(half)
    has_pass = rot < head_dim
    block_pass = triton.next_power_of_2(head_dim - rot) if has_pass else 1
    scb = sc[0] if cos.shape[0] != 1 else 0
    # Eager's `q * cos + rotate_half(q) * sin` computes in q's 16-bit dtype when cos shares it.
    round16 = q.dtype == cos.dtype and q.dtype in (torch.float16, torch.bfloat16)
    if FLAT_ROWS:
        q_programs = triton.cdiv(n_tokens * hq, FLAT_ROWS)
        _rope_flat[(q_programs + triton.cdiv(n_tokens * hk, FLAT_ROWS),)](
            q,
            k,
            cos,
            sin,
            qo,
            ko,
            seq,
            hq,
            hk,
            head_dim,
            n_tokens * hq,
            n_tokens * hk,
            q_programs,
            sq[0],
            sq[1],
            sq[2],
            sk[0],
            sk[1],
            sk[2],
            scb,
            sc[1],
            HALF=half,
            BLOCK_HALF=block_half,
            HAS_PASS=has_pass,
            BLOCK_PASS=block_pass,
            ROWS=FLAT_ROWS,
            ROUND16=round16,
            num_warps=NUM_WARPS or max(1, min(8, FLAT_ROWS * block_half // 128)),
            enable_fp_fusion=False,  # no FMA: eager rounds float32 products before the sum
        )
        return qo, ko
    hbq = triton.next_power_of_2(hq)
    hbk = triton.next_power_of_2(hk)
    if HEAD_BLOCK:
        hbq = min(hbq, HEAD_BLOCK)
        hbk = min(hbk, HEAD_BLOCK)
    one_shot = hbq >= hq and hbk >= hk
    tokens = min(TOKENS_PER_PROGRAM, triton.next_power_of_2(n_tokens))
    tiles = triton.cdiv(n_tokens, tokens)
    if NUM_WARPS:
        warps = NUM_WARPS
    elif one_shot:
        # 512 elements of each q half per warp: 16 per lane (two 128-bit vectors in 16-bit types),
        # few enough registers (~72 at D 128) for 7 programs of 4 warps per SM.
        warps = max(1, min(8, tokens * hbq * block_half // 512))
    else:
        warps = max(1, min(8, tokens * hbq * block_half // 128))
    _rope_kernel[(min(tiles, MAX_PROGRAMS) if MAX_PROGRAMS else tiles,)](
        q,
        k,
        cos,
        sin,
        qo,
        ko,
        seq,
        n_tokens,
        sq[0],
        sq[1],
        sq[2],
        sk[0],
        sk[1],
        sk[2],
        scb,
        sc[1],
        HQ=hq,
        HK=hk,
        HEAD_DIM=head_dim,
        HALF=half,
        BLOCK_HALF=block_half,
        HAS_PASS=has_pass,
        BLOCK_PASS=block_pass,
        TOKENS=tokens,
        HBQ=hbq,
        HBK=hbk,
        ONE_SHOT=one_shot,
        ROUND16=round16,
        num_warps=warps,
        enable_fp_fusion=False,  # no FMA: eager rounds float32 products before the sum
    )
    return qo, ko
