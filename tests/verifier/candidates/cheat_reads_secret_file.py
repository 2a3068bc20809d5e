"""Cheat: reads a secret file of the verifier's (the state folder's attestation.key, its
admin-token). The test puts the file's path in place of __TARGET__; the probe's result is the
import error's message (run with the static layer off)."""

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


TARGET = "__TARGET__"


def _read(path):
    try:
        with open(path, "rb") as handle:
            return "READ " + repr(handle.read(4096))
    except OSError as exc:
        return f"blocked ({type(exc).__name__})"


raise RuntimeError(f"PROBE {_read(TARGET)}")
