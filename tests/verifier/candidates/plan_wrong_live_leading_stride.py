"""Wrong (live_layout): reads rows at the input's last row stride and takes every leading dim to be
laid out as the rows inside it, as in a chunked half (`x.chunk(2, -1)[1]`, which the view class
draws). The head's input of a served prefill, `h[:, -1:, :]`, has a last row stride of the hidden
size but sequences a whole prompt apart: every sequence but the first is read at the wrong place.
Only the served layout exposes it."""

import torch
import triton
import triton.language as tl

OP = "rms_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]


@triton.jit
def _rms_rows(X, W, Y, n_rows, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * n_cols + cols, (normed * w).to(Y.dtype.element_ty), mask=mask)


def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    n_rows = x.numel() // hidden
    row_stride = x.stride(-2) if x.dim() > 1 else hidden
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(hidden)
    _rms_rows[(n_rows,)](x, weight, y, n_rows, row_stride, hidden, eps, BLOCK=block)
    return y
