"""An honest candidate for a + scale * b (tests/verify_open). OP names the open target; the tests
write the name each run's target has in place of OPNAME."""

import torch
import triton
import triton.language as tl

OP = "OPNAME"
ADAPTER = [{"kernel_param": "scale", "module_attr": "scale"}]


@triton.jit
def _scaled_add(A, B, Y, n, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    a = tl.load(A + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offsets, (a + scale * b).to(Y.dtype.element_ty), mask=mask)


def entry(a, b, *, scale):
    a, b = a.contiguous(), b.contiguous()
    y = torch.empty_like(a)
    n = a.numel()
    _scaled_add[(triton.cdiv(n, 1024),)](a, b, y, n, scale, BLOCK=1024)
    return y
