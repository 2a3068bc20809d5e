"""Cheat: a double fork whose middle process leaves the session (setsid) so the grandchild outlives
the verdict unseen. Says the grandchild's pid and whether setsid worked in the import error
(static layer off)."""

import os
import time

import torch
import triton
import triton.language as tl

OP = "rms_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]


@triton.jit
def _rms_rows(X, W, Y, n_cols, eps, BLOCK: tl.constexpr):
    # One program per row, the whole row in registers.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * n_cols + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)


def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    _rms_rows[(x2.shape[0],)](x2, weight, y, hidden, eps, BLOCK=triton.next_power_of_2(hidden))
    return y.view(x.shape)


_read_end, _write_end = os.pipe()
if os.fork() == 0:
    try:
        os.setsid()
        _how = "escaped"
    except OSError:
        _how = "stayed"
    if os.fork() == 0:
        os.write(_write_end, f"{os.getpid()} {_how}".encode())
        time.sleep(60)
    os._exit(0)
os.close(_write_end)
raise RuntimeError(f"PROBE grandchild {os.read(_read_end, 100).decode()}")
