"""Binding a problem's Model by computation: to a registered op family whose reference it computes
(three probes, float64 and at its own dtype), else to an open target whose reference is the Model."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from gpuyantra.binding import same_outputs
from gpuyantra.kernelbench.problems import SEED
from gpuyantra.kernelbench.results import ProblemResult
from gpuyantra.ops import OpFamily, all_ops
from gpuyantra.ops.base import adapter_kwargs

# Binding probes (float64 copies of model and inputs) run on at most this many elements of input 0.
PROBE_ELEMENTS = 1 << 20
FP64_TOLERANCE = (1e-8, 1e-6)  # (atol, rtol) for the float64 binding probes


def _double(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64)
    return value


def _agrees(
    model: torch.nn.Module,
    family: OpFamily,
    adapter: list[dict[str, str]],
    inputs: Sequence[Any],
    atol: float,
    rtol: float,
) -> bool:
    try:
        with torch.no_grad():
            got = model(*inputs)
            want = family.reference(*inputs, **adapter_kwargs(model, adapter))
    except Exception:  # noqa: BLE001 - the family's math does not run on these inputs: no match
        return False
    return same_outputs(got, want, atol=atol, rtol=rtol)


def family_matches(
    model: torch.nn.Module,
    family: OpFamily,
    adapter: list[dict[str, str]],
    inputs: Sequence[torch.Tensor],
    seed: int = SEED,
) -> bool:
    """True when `model(*inputs)` computes `family`'s reference with the adapter's attributes."""
    from gpuyantra.binding import randomize_parameters

    # (a) float64, the model's own parameters, the problem's inputs.
    try:
        own = copy.deepcopy(model).to(torch.float64)
    except Exception:  # noqa: BLE001 - a model that cannot be copied cannot be probed
        return False
    inputs64 = [_double(x) for x in inputs]
    if not _agrees(own, family, adapter, inputs64, *FP64_TOLERANCE):
        return False
    # (b) float64, randomized parameters (away from 0 and 1), a second input draw scaled differently.
    randomize_parameters(own, torch.Generator().manual_seed(seed + 1))
    generator = torch.Generator().manual_seed(seed + 2)
    redraw = [
        torch.randn(x.shape, generator=generator, dtype=torch.float64).mul_(3.0).add_(0.25).to(x.device)
        for x in inputs64
    ]
    if not _agrees(own, family, adapter, redraw, *FP64_TOLERANCE):
        return False
    # (c) the model as it is, at its dtype: output dtype and rounding must match the family's.
    dtype = inputs[0].dtype
    atol, rtol = family.tolerance(dtype)
    return _agrees(model, family, adapter, inputs, 2 * atol, 2 * rtol)


def probe_inputs(model: torch.nn.Module, inputs: Sequence[Any], max_elements: int = PROBE_ELEMENTS) -> list[Any]:
    """The problem's inputs cut to their first rows when large (every input whose dim 0 is input 0's
    is cut alike), if the Model still runs on them; else the inputs as they are."""
    from gpuyantra.ops.open import leading_rows

    small = leading_rows(inputs, max_elements)
    if small is inputs:
        return list(inputs)
    try:
        with torch.no_grad():
            model(*small)
    except Exception:  # noqa: BLE001 - dim 0 is not free: bind on the full inputs
        return list(inputs)
    return list(small)


def bind_open_target(
    model: torch.nn.Module, inputs: Sequence[Any], file: Path, module: ModuleType, result: ProblemResult
) -> tuple[OpFamily, list[dict[str, str]]] | None:
    """An open target whose reference is the problem's own Model, registered (and saved) for the
    verifier; None (with the reason in `result`) when the Model cannot be one."""
    from gpuyantra.ops.open import OpenTargetError, build_open_target, register_open

    try:
        target = build_open_target(
            model, inputs, name_hint=file.stem, source_file=str(file.resolve()), source_module=module.__name__
        )
        family = register_open(target)
    except OpenTargetError as exc:
        result.status, result.reason = "unsupported", f"unsupported: {exc}"
        return None
    return family, target.adapter


def bind_family(
    model: torch.nn.Module, inputs: Sequence[Any], families: Sequence[OpFamily] | None = None
) -> tuple[OpFamily, list[dict[str, str]]] | None:
    """The first registered family the model computes (and its ADAPTER), or None."""
    if not inputs or not all(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs):
        return None
    for family in families if families is not None else all_ops():
        if len(family.activations) != len(inputs):
            continue
        try:
            adapter = family.default_adapter(model)
        except LookupError:
            continue
        if family_matches(model, family, adapter, inputs):
            return family, adapter
    return None
