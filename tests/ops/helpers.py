"""Shared helpers for the op-family tests."""

from __future__ import annotations

import torch

from gpuyantra.ops.base import as_tuple, outputs_close


def upcast(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    return value


def assert_matches_reference(family, out, acts, params, dtype=None):
    """`out` equals the float64 reference within the family's tolerance, with the right dtypes."""
    want = family.reference(*[upcast(a) for a in acts], **{k: upcast(v) for k, v in params.items()})
    native = family.reference(*acts, **params)  # what eager returns: fixes the expected dtypes
    dtype = dtype or acts[0].dtype
    atol, rtol = family.tolerance(dtype)
    assert len(as_tuple(out)) == family.n_outputs
    for got, exp in zip(as_tuple(out), as_tuple(native)):
        assert got.dtype == exp.dtype, (got.dtype, exp.dtype)
        assert got.shape == exp.shape
    if not outputs_close(out, want, atol, rtol):
        errs = [(g.double() - w).abs().max().item() for g, w in zip(as_tuple(out), as_tuple(want))]
        raise AssertionError(f"{family.name}: max abs err {errs} over tolerance atol={atol} rtol={rtol}")
