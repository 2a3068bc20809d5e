"""The judge's comparison of one output against its allowance in one kernel (CUDA).

`judge.violation_counts` on the device in tensor ops is about sixteen launches per output; a
verification's plan has a few hundred outputs, and the verifications a worker judges at once share
its one process (the GIL, the driver's launch path). Measured on an H200, six at once: each one's
judging took 2.0 s of wall time for 0.38 s of its thread's CPU and 0.005 s of waiting for the
device, against 0.11 s alone; the host's launches, not the GPU, bound it. Here the same counts come
from one kernel and one zeroed buffer per output.

The arithmetic is the tensor ops', in float64, without contracting a multiply and an add into one
rounding (`enable_fp_fusion=False`), so both paths count the same elements. Only whether an output
has violations is decided here; the message of a failing one comes from the tensor ops
(`judge.compare_judged`). Outputs this kernel does not take (`fused_applies`) use the tensor ops.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

BLOCK = 2048
# Elements are indexed in int64; the counts are int32, so an output has fewer elements than this.
MAX_ELEMENTS = 2**31 - 1
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TOLERANCES: dict[tuple[float, float, torch.device], torch.Tensor] = {}
_WARMED: set[tuple[torch.dtype, bool, torch.device]] = set()  # variants launched once in this process
_WARM_LOCK = threading.Lock()


@triton.jit(do_not_specialize=["n", "extra_div"])
def _violations(
    GOT,  # the output, any real dtype, contiguous
    WANT,  # float64 reference, contiguous, same elements
    JUDGED,  # bool: where the output dtype can hold the reference
    EXTRA,  # float64 allowance on top of the tolerance, one value per `extra_div` elements
    TOL,  # float64 [atol, rtol]
    COUNTS,  # int32 [NaN/Inf where judged, out of tolerance]
    n,
    extra_div,
    HAS_EXTRA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    got = tl.load(GOT + offs, mask=inside, other=0).to(tl.float64)
    want = tl.load(WANT + offs, mask=inside, other=0.0)
    judged = tl.load(JUDGED + offs, mask=inside, other=0) != 0
    atol = tl.load(TOL)
    rtol = tl.load(TOL + 1)
    allowed = tl.abs(want) * rtol + atol
    if HAS_EXTRA:
        allowed = allowed + tl.load(EXTRA + offs // extra_div, mask=inside, other=0.0)
    err = tl.where(judged, tl.abs(got - want), 0.0)
    wrong = inside & ~(err <= allowed)
    nonfinite = inside & judged & ~(tl.abs(got) < float("inf"))
    tl.atomic_add(COUNTS, tl.sum(nonfinite.to(tl.int32), axis=0))
    tl.atomic_add(COUNTS + 1, tl.sum(wrong.to(tl.int32), axis=0))


def extra_divisor(extra: torch.Tensor, shape: torch.Size) -> int | None:
    """How many consecutive elements of `shape` share one element of `extra` when it broadcasts
    over trailing dimensions only (same shape: 1; per row [..., 1]: the row's length); None for any
    other layout."""
    if extra.dim() > len(shape) or not extra.is_contiguous():
        return None
    padded = (1,) * (len(shape) - extra.dim()) + tuple(extra.shape)
    split = len(shape)
    while split > 0 and padded[split - 1] == 1:
        split -= 1
    if tuple(padded[:split]) != tuple(shape[:split]):
        return None
    return math.prod(shape[split:])


def fused_applies(got: torch.Tensor, allowance: Any) -> bool:
    """Whether this output's comparison can run here (a CUDA output of a real dtype, contiguous,
    laid out as its reference; its extra allowance float64 and broadcast over trailing dimensions;
    Triton compiling kernels, not interpreting them)."""
    want, judged, extra = allowance.want, allowance.representable, allowance.extra
    if os.environ.get("TRITON_INTERPRET") == "1":  # kernels interpreted on the host: the tensor ops are faster
        return False
    if getattr(allowance, "nan_where", None) is not None:  # NaN positions to match: the tensor ops judge them
        return False
    if not (got.is_cuda and want.is_cuda and got.device == want.device):
        return False
    if got.is_complex() or (got.is_floating_point() and got.dtype not in _FLOATS):
        return False
    if want.dtype != torch.float64 or judged.dtype != torch.bool or got.shape != want.shape:
        return False
    if not (got.is_contiguous() and want.is_contiguous() and judged.is_contiguous() and judged.shape == want.shape):
        return False
    if got.numel() > MAX_ELEMENTS:
        return False
    if extra is None:
        return True
    return extra.dtype == torch.float64 and extra.device == want.device and extra_divisor(extra, want.shape) is not None


def violation_counts_fused(got: torch.Tensor, allowance: Any, tol: tuple[float, float]) -> torch.Tensor:
    """(NaN/Inf where judged, values out of tolerance) as an int32 device tensor of two, not read back."""
    counts = torch.zeros(2, dtype=torch.int32, device=got.device)
    if got.numel():
        extra = allowance.extra
        _warm_variant(got.dtype, extra is not None, got.device)
        divisor = (extra_divisor(extra, allowance.want.shape) or 1) if extra is not None else 1  # fused_applies: set
        _launch(got, allowance.want, allowance.representable, extra, _tolerance(tol, got.device), counts, divisor)
    return counts


def _launch(
    got: torch.Tensor,
    want: torch.Tensor,
    judged: torch.Tensor,
    extra: torch.Tensor | None,
    tol: torch.Tensor,
    counts: torch.Tensor,
    extra_div: int,
) -> None:
    n = got.numel()
    _violations[(triton.cdiv(n, BLOCK),)](
        got,
        want,
        judged,
        extra if extra is not None else want,
        tol,
        counts,
        n,
        extra_div,
        HAS_EXTRA=extra is not None,
        BLOCK=BLOCK,
        num_warps=8,
        enable_fp_fusion=False,
    )


def warm(dtypes: Sequence[torch.dtype], device: torch.device) -> None:
    """Load (or compile) the kernel's variants for these output dtypes now.

    A process's first launch hashes Triton's own library for its cache key (about a second on a GPU
    host) and each variant is loaded from the cache on its first launch: a new `gpuyantra verify`
    process paid that in its first judging, while its sandbox child waited for it. A verification
    warms them while its child starts; judgings that come first wait for the warm-up (one lock)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    for dtype in dtypes:
        for has_extra in (False, True):
            _warm_variant(dtype, has_extra, device)


def _warm_variant(dtype: torch.dtype, has_extra: bool, device: torch.device) -> None:
    key = (dtype, has_extra, device)
    if key in _WARMED:
        return
    with _WARM_LOCK:
        if key in _WARMED:
            return
        got = torch.zeros(BLOCK, dtype=dtype, device=device)
        want = torch.zeros(BLOCK, dtype=torch.float64, device=device)
        judged = torch.ones(BLOCK, dtype=torch.bool, device=device)
        counts = torch.zeros(2, dtype=torch.int32, device=device)
        _launch(got, want, judged, want if has_extra else None, _tolerance((0.0, 0.0), device), counts, 1)
        _WARMED.add(key)


def _tolerance(tol: tuple[float, float], device: torch.device) -> torch.Tensor:
    """The (atol, rtol) pair as a float64 device tensor, kept: a kernel's float arguments are float32."""
    key = (float(tol[0]), float(tol[1]), device)
    if key not in _TOLERANCES:
        _TOLERANCES[key] = torch.tensor([key[0], key[1]], dtype=torch.float64, device=device)
    return _TOLERANCES[key]
