"""Wrong (partial_rotary): rotates the whole head dim, taking the rotary dim to be the head dim; with
Phi-3's partial rotary (cos and sin narrower than the head) it reads cos/sin rows at the wrong
places and rotates dims that pass through. The old plan's cos and sin were always as wide as the
head."""

import torch
import triton
import triton.language as tl

OP = "rope"
ADAPTER = []


@triton.jit
def _rope_rows(X, C, S_, Y, heads, seq, sxb, sxh, sxs, scb, D, HALF, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    s = pid % seq
    h = (pid // seq) % heads
    b = pid // (seq * heads)
    first = tl.arange(0, BLOCK)
    m = first < HALF
    base = X + b * sxb + h * sxh + s * sxs
    x1 = tl.load(base + first, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + first, mask=m, other=0.0).to(tl.float32)
    row = C + b * scb + s * D  # the bug: a cos row is D wide
    c1 = tl.load(row + first, mask=m, other=0.0).to(tl.float32)
    c2 = tl.load(row + HALF + first, mask=m, other=0.0).to(tl.float32)
    srow = S_ + b * scb + s * D
    s1 = tl.load(srow + first, mask=m, other=0.0).to(tl.float32)
    s2 = tl.load(srow + HALF + first, mask=m, other=0.0).to(tl.float32)
    out = Y + pid * D
    tl.store(out + first, (x1 * c1 - x2 * s1).to(Y.dtype.element_ty), mask=m)
    tl.store(out + HALF + first, (x2 * c2 + x1 * s2).to(Y.dtype.element_ty), mask=m)


def _apply(x, cos, sin):
    batch, heads, seq, dim = x.shape
    y = torch.empty((batch, heads, seq, dim), dtype=x.dtype, device=x.device)
    cos_batch_stride = cos.stride(0) if cos.shape[0] > 1 else 0
    _rope_rows[(batch * heads * seq,)](
        x,
        cos,
        sin,
        y,
        heads,
        seq,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        cos_batch_stride,
        dim,
        dim // 2,
        BLOCK=triton.next_power_of_2(dim // 2),
    )
    return y


def entry(q, k, cos, sin):
    return _apply(q, cos.contiguous(), sin.contiguous()), _apply(k, cos.contiguous(), sin.contiguous())
