"""Parity checks of a bound kernel against the forward it replaces: inputs, perturbed scalars, comparison."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from gpuyantra.swap.records import ParityError


def param_dtype_device(model: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype, p.device
    return torch.float32, torch.device("cpu")


def probe_model_forward(model: torch.nn.Module, tokens: int = 8) -> Callable[[], Any] | None:
    """A forward of a causal LM on a fixed probe prompt (no cache), or None for other models."""
    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 2:
        return None
    _, device = param_dtype_device(model)
    ids = torch.tensor([[(13 * i + 1) % vocab for i in range(tokens)]], device=device)

    def run():
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False)

    return run


def perturbed_scalars(
    module: torch.nn.Module, adapter: Sequence[Mapping[str, str]], generator: torch.Generator
) -> dict[str, float]:
    """A value far from the live one for every float attribute the ADAPTER binds. Small ones (eps)
    move by 0.5 to 2, comparable to the probe rows' mean square, so ignoring them shows in any dtype;
    others scale by 0.5x to 2x (never exactly 1x)."""
    out: dict[str, float] = {}
    for binding in adapter:
        value = getattr(module, binding["module_attr"], None)
        if isinstance(value, float) and not isinstance(value, bool):
            u = float(torch.rand((), generator=generator))
            out[binding["module_attr"]] = (
                value + 0.5 + 1.5 * u
                if abs(value) < 0.01
                else value * (0.5 + 0.4 * u if u < 0.5 else 1.25 + 1.5 * (u - 0.5))
            )
    return out


@contextlib.contextmanager
def attributes_set(module: torch.nn.Module, values: Mapping[str, Any]):
    """Set module attributes for the duration of a check, restoring the live values after."""
    saved = {name: getattr(module, name) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def compare_outputs(
    where: str, got: tuple, want: tuple, shape: tuple, atol: float, rtol: float, dtype: torch.dtype
) -> tuple[float, float]:
    """Parity of a kernel's outputs with the original's: same count, tensors, shapes and dtypes,
    no new non-finite values, within (atol, rtol). Returns (max abs err, max rel err)."""
    if len(got) != len(want):
        raise ParityError(f"{where}: the kernel returned {len(got)} outputs, the original {len(want)}")
    max_abs = max_rel = 0.0
    for g, w in zip(got, want):
        if not isinstance(g, torch.Tensor):
            raise ParityError(f"{where}: the kernel returned {type(g).__name__}, not a tensor")
        if g.shape != w.shape or g.dtype != w.dtype:
            raise ParityError(
                f"{where}: kernel output {tuple(g.shape)} {g.dtype} differs from the original's "
                f"{tuple(w.shape)} {w.dtype} at input shape {list(shape)}"
            )
        gd, wd = g.double(), w.double()
        if not torch.isfinite(gd).all() and torch.isfinite(wd).all():
            raise ParityError(f"{where}: the kernel produced non-finite values at input shape {list(shape)}")
        diff = (gd - wd).abs()
        abs_err = float(diff.max()) if diff.numel() else 0.0
        rel_err = float((diff / wd.abs().clamp_min(atol)).max()) if diff.numel() else 0.0
        max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
        if not torch.allclose(gd, wd, atol=atol, rtol=rtol):
            raise ParityError(
                f"parity failed on {where} at input shape {list(shape)}: max abs err {abs_err:.3g} "
                f"(atol {atol:g}, rtol {rtol:g}, {str(dtype).replace('torch.', '')})"
            )
    return max_abs, max_rel
