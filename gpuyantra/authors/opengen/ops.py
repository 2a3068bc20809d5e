"""Triton spellings of the pointwise ops, in float32, computed as PyTorch computes them on the GPU.

PyTorch's CUDA kernels call CUDA's math library (expf, cosf, tanhf, powf, ...: libdevice), divide
with IEEE rounding, take IEEE square roots and round after every eager op. Triton's own spellings
differ on NVIDIA (read from the PTX Triton 3.9 writes for sm_90): `tl.exp` is ex2.approx of
x * log2(e), `tl.exp2` ex2.approx, `tl.sqrt` sqrt.approx, a float32 `/` div.full (none of them
expf, exp2f, sqrtf or IEEE division); tl.sin, tl.cos, tl.log and tl.erf do call libdevice, but
Triton links it flushing subnormals to zero unless told otherwise. So the candidate calls libdevice
by name (the `_acc_*` helpers), divides with `tl.div_rn`, takes `tl.sqrt_rn`, and the host launches
the kernels without flush-to-zero and (outside matmuls) without contracting a product and a sum into
one FMA (source.py, `_numerics`). Division by a scalar (a number or a scalar argument: eager holds
it as a CPU scalar) multiplies by its reciprocal, as ATen's CUDA div kernel does.

Triton's CPU interpreter has no libdevice: each `_acc_*` helper takes the kernel's constexpr
LIBDEVICE (true when the tensors are on a GPU) and without it computes in float64 and rounds once,
within half an ulp of the exact value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuyantra.authors.opengen.spec import Unsupported

LIBDEVICE_FLAG = "LIBDEVICE"  # the kernels' constexpr: call libdevice (compiled for a GPU) or not
LIBDEVICE_HOST = "_dev.type == 'cuda'"  # its host expression (the interpreter runs CPU tensors)

# op -> (libdevice function, the interpreter's float64 form of x (w) and y (v), helpers it calls):
# the function ATen's CUDA kernel for the op calls.
_LIBM: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "exp": ("exp", "tl.exp(w)", ()),
    "exp2": ("exp2", "tl.exp2(w)", ()),
    "expm1": ("expm1", "_expm1(w)", ("_expm1",)),
    "log": ("log", "tl.log(w)", ()),
    "log2": ("log2", "tl.log2(w)", ()),
    "log10": ("log10", "tl.log(w) * 0.4342944819032518", ()),
    "log1p": ("log1p", "_log1p(w)", ("_log1p",)),
    "rsqrt": ("rsqrt", "1.0 / tl.sqrt(w)", ()),
    "sin": ("sin", "tl.sin(w)", ()),
    "cos": ("cos", "tl.cos(w)", ()),
    "tan": ("tan", "tl.sin(w) / tl.cos(w)", ()),
    "erf": ("erf", "tl.erf(w)", ()),
    "erfc": ("erfc", "1.0 - tl.erf(w)", ()),
    "tanh": ("tanh", "_tanh(w)", ("_tanh",)),
    "sinh": ("sinh", "_sinh(w)", ("_sinh",)),
    "cosh": ("cosh", "0.5 * (tl.exp(w) + tl.exp(-w))", ()),
    "pow": ("pow", "_pow(w, v)", ("_pow",)),
    "fmod": ("fmod", "w - v * _trunc(w / v)", ("_trunc",)),
}
_LIBM_BINARY = frozenset({"pow", "fmod"})


def _libm_helper(op: str) -> str:
    fn, form, _ = _LIBM[op]
    args = "x, y" if op in _LIBM_BINARY else "x"
    wide = ["        w = x.to(tl.float64)"] + (["        v = y.to(tl.float64)"] if op in _LIBM_BINARY else [])
    return "\n".join(
        [
            "@triton.jit",
            f"def _acc_{op}({args}, LIBDEVICE: tl.constexpr):",
            f"    # torch's {op} on CUDA: libdevice's {fn}; the interpreter (no libdevice): float64, rounded once",
            "    if LIBDEVICE:",
            f"        r = libdevice.{fn}({args})",
            "    else:",
            *wide,
            f"        r = ({form}).to(x.dtype)",
            "    return r",
            "",
        ]
    )


# Helper functions by name. _tanh, _log1p, _expm1, _pow, _sinh and _trunc are the interpreter's
# float64 forms behind the _acc_* helpers (libdevice on the GPU); the others serve the kernels directly.
HELPERS: dict[str, str] = {
    "_tanh": """@triton.jit
def _tanh(x):
    # sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|) never overflows; an odd series near 0 keeps digits.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    s = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    return tl.where(tl.abs(x) < 0.0625, s, tl.where(x < 0.0, -t, t))
""",
    "_log1p": """@triton.jit
def _log1p(x):
    # log(u) * x / (u - 1) with u = 1 + x: exact where 1 + x rounds (Goldberg).
    u = 1.0 + x
    d = u - 1.0
    r = tl.log(u) * (x / tl.where(d == 0.0, 1.0, d))
    r = tl.where(d == 0.0, x, r)
    return tl.where(u == float("inf"), u, r)
""",
    "_expm1": """@triton.jit
def _expm1(x):
    # exp(x) - 1 away from 0; near 0 (where the subtraction would lose digits) a degree-9 Taylor
    # polynomial, accurate to 3e-10 for |x| < 0.5.
    p = 1.0 + x * (0.5 + x * (0.16666666666666666 + x * (0.041666666666666664 + x * (0.008333333333333333 + x * (
        0.001388888888888889 + x * (0.0001984126984126984 + x * (2.48015873015873e-05 + x * 2.755731922398589e-06)))))))
    return tl.where(tl.abs(x) < 0.5, x * p, tl.exp(x) - 1.0)
""",
    "_trunc": """@triton.jit
def _trunc(x):
    return tl.where(x < 0.0, tl.ceil(x), tl.floor(x))
""",
    "_round": """@triton.jit
def _round(x):
    # Half to even, as torch.round.
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)
""",
    "_pow": """@triton.jit
def _pow(a, b):
    # |a|^b, negated for a negative base and an odd integer exponent, NaN for a fractional one.
    b = tl.zeros_like(a) + b  # a scalar exponent as a tile (masks below combine tile-wise)
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    fb = tl.floor(b)
    integral = fb == b
    odd = integral & ((fb - 2.0 * tl.floor(fb * 0.5)) == 1.0)
    r = tl.where((a < 0.0) & odd, -r, r)
    r = tl.where((a < 0.0) & (fb != b), float("nan"), r)
    return tl.where(b == 0.0, 1.0, r)
""",
    "_pow_scalar": """@triton.jit
def _pow_scalar(x, p, LIBDEVICE: tl.constexpr):
    # x ** p for an exponent known only at run time (a norm's or a loss's p): ATen's pow and norms
    # compute p = 2 as x * x, 1 as x and 0.5 as a square root; libdevice's pow, taken for every
    # other p, costs about 20x more per element.
    if p == 2.0:
        r = x * x
    elif p == 1.0:
        r = x
    elif p == 0.5:
        r = tl.sqrt_rn(x)
    else:
        r = _acc_pow(x, tl.full([], p, tl.float32), LIBDEVICE)
    return r
""",
    "_sinh": """@triton.jit
def _sinh(x):
    e = tl.exp(x)
    big = 0.5 * (e - 1.0 / e)
    x2 = x * x
    small = x * (1.0 + x2 * (0.16666666666666666 + x2 * 0.008333333333333333))
    return tl.where(tl.abs(x) < 0.03, small, big)
""",
    "_add_combine": """@triton.jit
def _add_combine(a, b):
    return a + b
""",
    "_logaddexp_combine": """@triton.jit
def _logaddexp_combine(a, b):
    # log(exp(a) + exp(b)) without overflow; -inf + -inf stays -inf
    m = tl.maximum(a, b)
    safe = tl.where(m == float("-inf"), 0.0, m)
    return tl.where(m == float("-inf"), m, safe + tl.log(tl.exp(a - safe) + tl.exp(b - safe)))
""",
    "_mul_combine": """@triton.jit
def _mul_combine(a, b):
    return a * b
""",
    "_acc_remainder": """@triton.jit
def _acc_remainder(x, y, LIBDEVICE: tl.constexpr):
    # torch.remainder on CUDA: fmod, moved into the divisor's sign
    m = _acc_fmod(x, y, LIBDEVICE)
    return tl.where((m != 0.0) & ((y < 0.0) != (m < 0.0)), m + y, m)
""",
    **{f"_acc_{op}": _libm_helper(op) for op in _LIBM},
}
# Helpers that call libdevice: the file imports it, the kernel takes the LIBDEVICE constexpr.
LIBDEVICE_HELPERS = frozenset(h for h in HELPERS if h.startswith("_acc_"))


@dataclass(frozen=True)
class Operand:
    code: str
    kind: str  # "f" | "i" | "b"
    tensor: bool  # a Triton tensor (False: a python literal or a scalar kernel argument)


def _f(a: Operand) -> str:
    """The operand as float32."""
    if a.kind == "f":
        return a.code
    if a.kind == "b":
        return f"tl.where({a.code}, 1.0, 0.0)" if a.tensor else f"(1.0 if {a.code} else 0.0)"
    return f"{a.code}.to(tl.float32)" if a.tensor else f"({a.code} * 1.0)"


def _t(a: Operand) -> str:
    """A float operand usable as a tl.* function argument (python literals become tensors)."""
    code = _f(a)
    return code if a.tensor else f"tl.full([], {code}, tl.float32)"


def cast(a: Operand, kind: str) -> str:
    if a.kind == kind:
        return a.code
    if kind == "f":
        return _f(a)
    if kind == "b":
        return f"({a.code} != 0)"
    if a.kind == "b":
        return f"tl.where({a.code}, 1, 0).to(tl.int64)" if a.tensor else f"(1 if {a.code} else 0)"
    return f"{_t(a)}.to(tl.int64)"  # float -> int truncates toward zero, as torch


def pointwise(op: str, args: list[Operand], kind: str) -> tuple[str, tuple[str, ...]]:
    """(Triton expression, helper functions it calls) for one op on its operands."""
    if op == "cast":
        return cast(args[0], kind), ()
    if op == "identity":
        return args[0].code, ()
    if op == "where":
        c, a, b = args
        cond = c.code if c.kind == "b" else f"({c.code} != 0)"
        if not (c.tensor or a.tensor or b.tensor):
            return f"({cast(a, kind)} if {cond} else {cast(b, kind)})", ()
        return f"tl.where({cond}, {cast(a, kind)}, {cast(b, kind)})", ()
    if len(args) == 2:
        return _binary(op, args[0], args[1], kind)
    return _unary(op, args[0], kind)


def _binary(op: str, a: Operand, b: Operand, kind: str) -> tuple[str, tuple[str, ...]]:
    compare = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
    if op in compare:
        if a.kind == "f" or b.kind == "f":
            return f"({_f(a)} {compare[op]} {_f(b)})", ()
        return f"({a.code} {compare[op]} {b.code})", ()
    if op in ("and", "or", "xor"):
        sym = {"and": "&", "or": "|", "xor": "^"}[op]
        return f"({a.code} {sym} {b.code})", ()
    if kind == "f":
        x, y = _f(a), _f(b)
        simple = {"add": "+", "sub": "-", "mul": "*"}
        if op in simple:
            return f"({x} {simple[op]} {y})", ()
        if op == "div":
            return _div(a, b), ()
        if op == "maximum":
            return f"tl.where(({x} > {y}) | ({x} != {x}), {x}, {y})", ()
        if op == "minimum":
            return f"tl.where(({x} < {y}) | ({x} != {x}), {x}, {y})", ()
        if op == "pow" and a.tensor and not b.tensor:
            # An exponent read at run time (a module's `p`): the common ones as ATen computes them
            _, helpers = libm(op, _t(a), _t(b))
            return f"_pow_scalar({x}, {y}, {LIBDEVICE_FLAG})", ("_pow_scalar", *helpers)
        if op in ("pow", "fmod"):
            return libm(op, _t(a), _t(b))
        if op == "remainder":
            _, helpers = libm("fmod", _t(a), _t(b))
            return f"_acc_remainder({_t(a)}, {_t(b)}, {LIBDEVICE_FLAG})", ("_acc_remainder", *helpers)
        raise Unsupported(f"pointwise op {op} is not supported by the open author")
    x, y = cast(a, "i"), cast(b, "i")
    simple_i = {"add": "+", "sub": "-", "mul": "*"}
    if op in simple_i:
        return f"({x} {simple_i[op]} {y})", ()
    if op == "div":  # prims.div on integers truncates
        return f"({x} // {y})", ()
    if op == "maximum":
        return f"tl.where({x} > {y}, {x}, {y})", ()
    if op == "minimum":
        return f"tl.where({x} < {y}, {x}, {y})", ()
    if op == "remainder":
        return f"(({x} % {y}) + tl.where((({x} % {y}) != 0) & ((({x} % {y}) < 0) != ({y} < 0)), {y}, 0))", ()
    if op == "fmod":
        return f"({x} % {y})", ()
    raise Unsupported(f"integer op {op} is not supported by the open author")


def _unary(op: str, a: Operand, kind: str) -> tuple[str, tuple[str, ...]]:
    if kind != "f" and op in ("neg", "abs", "sign"):
        x = a.code
        if op == "neg":
            return f"(-{x})", ()
        if op == "abs":
            return f"tl.where({x} < 0, -{x}, {x})", ()
        return f"tl.where({x} > 0, 1, tl.where({x} < 0, -1, 0))", ()
    if op == "not":
        return (f"({a.code} == 0)" if a.kind != "i" else f"(~{a.code})"), ()
    x = _t(a)
    if op in _LIBM:
        return libm(op, x)
    plain = {
        "sqrt": "tl.sqrt_rn({x})",
        "floor": "tl.floor({x})",
        "ceil": "tl.ceil({x})",
        "abs": "tl.abs({x})",
        "neg": "(-{x})",
        "reciprocal": "tl.div_rn(1.0, {x})",
        "relu": "tl.where({x} < 0.0, 0.0, {x})",
        "square": "({x} * {x})",
        "sign": "tl.where({x} > 0.0, 1.0, tl.where({x} < 0.0, -1.0, {x}))",
        "signbit": "({x} < 0.0)",
        "isfinite": "(tl.abs({x}) < float('inf'))",
    }
    if op in plain:
        return plain[op].format(x=x), ()
    if op == "sigmoid":  # ATen: 1 / (1 + exp(-x)), expf and an IEEE division
        e, needs = libm("exp", f"(-{x})")
        return f"tl.div_rn(1.0, 1.0 + {e})", needs
    helpers = {"trunc": "_trunc", "round": "_round"}
    if op in helpers:
        return f"{helpers[op]}({x})", (helpers[op],)
    raise Unsupported(f"pointwise op {op} is not supported by the open author")


def libm(op: str, *operands: str) -> tuple[str, tuple[str, ...]]:
    """The call of `op`'s libdevice helper on float32 tensor operands, and the helpers it needs."""
    return f"_acc_{op}({', '.join(operands)}, {LIBDEVICE_FLAG})", (f"_acc_{op}", *_LIBM[op][2])


def _div(a: Operand, b: Operand) -> str:
    """a / b as ATen's CUDA kernel computes it: an IEEE division, or, for a scalar divisor (eager
    holds it as a CPU scalar), a product with its reciprocal (computed in double, rounded once)."""
    x = _f(a)
    if a.tensor and not b.tensor:
        value = _number(b)
        if value is not None and value != 0.0:
            with np.errstate(over="ignore"):
                inverse = float(np.float32(1.0 / value))
            return f"({x} * {_float_literal(inverse)})"
        if value is None:
            return f"({x} * tl.div_rn(1.0, {_t(b)}))"
    return f"tl.div_rn({_t(a)}, {_t(b)})"


def _number(a: Operand) -> float | None:
    """The value of a python number literal, else None (a scalar argument, a tensor)."""
    if a.tensor or a.kind == "b":
        return None
    try:
        return float(a.code)
    except ValueError:
        return None


def _float_literal(value: float) -> str:
    if value != value:
        return "float('nan')"
    if value in (float("inf"), float("-inf")):
        return "float('inf')" if value > 0 else "float('-inf')"
    return repr(value)
