"""Find which modules of a model compute an op family, by checking their forward numerically.

A class is bound to a family only when an instance's forward equals the family's reference on
random inputs with freshly randomized parameters (never weight = 1, bias = 0); class names are
only a hint for which attributes to read. So a Gemma `(1 + weight)` norm never receives `rms_norm`.

The probe runs twice on a private copy of the module (the live module is never touched):
1. float64, tight tolerance: the math must be the family's (catches `1 + weight`, another
   activation function, a missing bias...).
2. bfloat16, the family's bf16 tolerance: output dtype and rounding order must agree with the
   reference's dtype handling (catches e.g. a norm that returns float32 for bf16 input). A module
   whose bf16 forward cannot run on the CPU is judged on the float64 check alone.

Families whose module is not `module(*activations)` (gated MLPs: the module takes x, the op takes
(gate, up)) supply `module_activations` / `module_reference` hooks on their `OpFamily`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gpuyantra.ops import OpFamily, all_ops
from gpuyantra.ops.base import as_tuple, outputs_close

PROBE_ROWS = (3,)
FP64_TOLERANCE = (1e-8, 1e-6)  # (atol, rtol)


@dataclass
class ModuleGroup:
    """All instances of one module class in a model that compute one op family."""

    op: str
    module_class: str
    qualified_class: str
    names: list[str] = field(default_factory=list)
    adapter: list[dict[str, str]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.names)


def randomize_parameters(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Give every floating parameter and buffer fresh random values away from 0 and 1."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                values = torch.randn(tensor.shape, generator=generator) * 0.5 + 0.3
                tensor.copy_(values.to(tensor.dtype))


def probe_copy(module: torch.nn.Module, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """A CPU copy of `module` whose floating parameters/buffers are new (uninitialized) `dtype`
    tensors: the live weights are never copied (no GPU allocation, no copy of a large checkpoint
    in its own dtype); the caller randomizes them."""
    memo: dict[int, object] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if tensor.is_floating_point():
            fresh = torch.empty(tensor.shape, dtype=dtype, device="meta")
            memo[id(tensor)] = (
                torch.nn.Parameter(fresh, requires_grad=False) if isinstance(tensor, torch.nn.Parameter) else fresh
            )
    try:
        probe = copy.deepcopy(module, memo)
    except Exception:  # noqa: BLE001 - exotic modules: fall back to a plain copy
        return copy.deepcopy(module).to(device="cpu", dtype=dtype)

    def materialize(t: torch.Tensor) -> torch.Tensor:
        if t.is_meta:
            return torch.empty(t.shape, dtype=t.dtype, device="cpu")
        return t.to("cpu")

    probe = probe._apply(materialize)
    # Instance-level forwards are bindings of the live modules (swaps, fused projections) whose
    # closures still compute with the live tensors: the probe checks the classes' own math.
    for sub in probe.modules():
        sub.__dict__.pop("forward", None)
    return probe


def _agrees(
    module: torch.nn.Module,
    family: OpFamily,
    adapter: list[dict[str, str]],
    dtype: torch.dtype,
    seed: int,
    atol: float,
    rtol: float,
) -> bool | None:
    """True/False: module and reference agree at `dtype`; None: the probe could not run."""
    generator = torch.Generator().manual_seed(seed + 1)
    try:
        activations = family.activations_for_module(module, PROBE_ROWS, dtype, "cpu", generator)
        with torch.no_grad():
            got = family.module_call(module, *activations)
            want = family.expected_module_output(module, activations, adapter)
    except Exception:  # noqa: BLE001 - a module that cannot run the family's inputs is no match
        return None
    got_t, want_t = as_tuple(got), as_tuple(want)
    if len(got_t) != len(want_t) or any(
        not isinstance(g, torch.Tensor) or not isinstance(w, torch.Tensor) or g.dtype != w.dtype
        for g, w in zip(got_t, want_t)
    ):
        return False
    return outputs_close(got, want, atol=atol, rtol=rtol)


def computes_family(module: torch.nn.Module, family: OpFamily, seed: int = 0) -> list[dict[str, str]] | None:
    """The ADAPTER under which `module` computes `family`, or None when its math differs."""
    if not family.may_compute(module):
        return None
    try:
        adapter = family.default_adapter(module)
    except LookupError:
        return None
    try:
        probe = probe_copy(module, torch.float64)
    except Exception:  # noqa: BLE001 - a module that cannot be copied cannot be probed
        return None
    randomize_parameters(probe, torch.Generator().manual_seed(seed))
    probe.eval()
    atol, rtol = FP64_TOLERANCE
    if not _agrees(probe, family, adapter, torch.float64, seed, atol, rtol):
        return None
    # Dtype handling: same probe weights rounded to bf16; a CPU-unsupported forward (None) passes.
    low = probe.to(torch.bfloat16)
    atol, rtol = family.tolerance(torch.bfloat16)
    if _agrees(low, family, adapter, torch.bfloat16, seed, 2 * atol, 2 * rtol) is False:
        return None
    return adapter


def find_module_groups(model: torch.nn.Module, ops: Sequence[str] | None = None) -> list[ModuleGroup]:
    """Group the model's modules by (family, class) for every family their computation matches."""
    families = [f for f in all_ops() if ops is None or f.name in ops]
    verdict_cache: dict[tuple[str, type], list[dict[str, str]] | None] = {}
    groups: dict[tuple[str, type], ModuleGroup] = {}
    for name, module in model.named_modules():
        cls = type(module)
        for family in families:
            key = (family.name, cls)
            if key not in verdict_cache:
                verdict_cache[key] = computes_family(module, family)
            adapter = verdict_cache[key]
            if adapter is None:
                continue
            group = groups.setdefault(
                key,
                ModuleGroup(
                    op=family.name,
                    module_class=cls.__name__,
                    qualified_class=f"{cls.__module__}.{cls.__qualname__}",
                    adapter=adapter,
                ),
            )
            group.names.append(name)
    return list(groups.values())
