"""Find which modules of a model compute an op family, by checking their forward numerically.

A class is bound to a family only when an instance's forward equals the family's reference on
random inputs with freshly randomized parameters (never weight = 1, bias = 0); class names are
only a hint for which attributes to read. So a Gemma `(1 + weight)` norm never receives `rms_norm`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Sequence

import torch

from gpuyantra.ops import OpFamily, adapter_kwargs, all_ops


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


def computes_family(module: torch.nn.Module, family: OpFamily, seed: int = 0) -> list[dict[str, str]] | None:
    """The ADAPTER under which `module` computes `family`, or None when its math differs."""
    try:
        adapter = family.default_adapter(module)
    except LookupError:
        return None
    probe = copy.deepcopy(module).to(device="cpu", dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    randomize_parameters(probe, generator)
    try:
        activations = family.activations_for_module(probe, (3,), torch.float64, "cpu", generator)
        with torch.no_grad():
            got = family.module_call(probe, *activations)
            want = family.reference(*activations, **adapter_kwargs(probe, adapter))
    except Exception:  # noqa: BLE001 - a module that cannot even run the family's inputs is no match
        return None
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return None
    return adapter if torch.allclose(got.double(), want.double(), rtol=1e-6, atol=1e-8) else None


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
            group = groups.setdefault(key, ModuleGroup(
                op=family.name, module_class=cls.__name__,
                qualified_class=f"{cls.__module__}.{cls.__qualname__}", adapter=adapter,
            ))
            group.names.append(name)
    return list(groups.values())
