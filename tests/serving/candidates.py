"""Candidate kernel sources for the serving tests (each written to a real file before use)."""

TEMPLATE = """import torch
import triton
import triton.language as tl

OP = "rms_norm"
ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]

SCALE = __SCALE__          # 1.0: exact rms_norm; anything else: a wrong kernel
MAX_ROWS = __MAX_ROWS__    # 0: any number of rows; N: raise on more than N rows (a kernel with a shape bug)


@triton.jit
def _rms_norm(X, W, Y, n_cols, eps, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    normed = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * n_cols + cols, (normed * w * scale).to(Y.dtype.element_ty), mask=mask)


def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    if MAX_ROWS and x2.shape[0] > MAX_ROWS:
        raise RuntimeError(f"this kernel does not support {x2.shape[0]} rows (max {MAX_ROWS})")
    y = torch.empty_like(x2, dtype=torch.promote_types(x.dtype, weight.dtype))
    _rms_norm[(x2.shape[0],)](x2, weight, y, hidden, eps, SCALE, BLOCK=triton.next_power_of_2(hidden))
    return y.reshape(*x.shape[:-1], hidden)
"""


def rms_norm_source(scale: float = 1.0, max_rows: int = 0) -> str:
    return TEMPLATE.replace("__SCALE__", repr(float(scale))).replace("__MAX_ROWS__", str(int(max_rows)))


# Loads, but binds an attribute no norm has.
BAD_ADAPTER = rms_norm_source().replace('"module_attr": "variance_epsilon"', '"module_attr": "no_such_attr"')

# Raises inside the kernel call for every shape.
ALWAYS_RAISES = rms_norm_source().replace("    hidden = x.shape[-1]\n", "    raise ValueError('boom')\n", 1)

# Not importable.
SYNTAX_ERROR = "OP = 'rms_norm'\nADAPTER = [\ndef entry(:\n"
