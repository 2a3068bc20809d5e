"""Wrong (large_tensor): a persistent elementwise kernel of at most 64 programs, each looping a
capped number of times; past 64 x 1024 = 2^16 elements the tail is never written. The old CPU
plan's largest tensor held 32,822 elements (on a GPU the same bug sits at 2^20)."""

import torch
import triton
import triton.language as tl

OP = "silu_mul"
ADAPTER = []

MAX_PROGRAMS = 64
BLOCK = 1024


@triton.jit
def _silu_mul_persistent(G, U, O, n, BLOCK: tl.constexpr, TRIPS: tl.constexpr):
    for t in range(TRIPS):
        offs = (t * tl.num_programs(0) + tl.program_id(0)) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(U + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(O + offs, (g / (1.0 + tl.exp(-g)) * u).to(O.dtype.element_ty), mask=mask)


def entry(gate, up):
    g = gate.contiguous()
    u = up.contiguous()
    out = torch.empty_like(g)
    n = out.numel()
    programs = min(MAX_PROGRAMS, triton.cdiv(n, BLOCK))
    _silu_mul_persistent[(programs,)](g, u, out, n, BLOCK=BLOCK, TRIPS=1)
    return out
