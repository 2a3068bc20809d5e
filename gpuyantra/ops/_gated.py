"""Shared pieces for the gated-MLP activation families (`silu_mul`, `gelu_tanh_mul`).

The op is the elementwise math between an MLP's projections: `act(gate) * up`. The module it
replaces is the whole MLP (its projections stay its own, so the ADAPTER is empty):

* split projections (Llama, Mistral, Qwen2/3, Qwen2-MoE shared expert, Gemma 1-3, Granite, OLMo2):
  `down_proj(act(gate_proj(x)) * up_proj(x))`
* fused projection (Phi-3): `gate, up = gate_up_proj(x).chunk(2, -1); down_proj(up * act(gate))`

For binding, the probe feeds the MLP its own input x (`module_activations`), runs the module
(`module_call`) and compares with the family reference applied between the module's projections
(`module_reference`). The replacement forward keeps the projections and calls `entry(gate, up)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from gpuyantra.ops.base import OpFamily, Tensor, itemsize, numel, randn


def _has(module: torch.nn.Module, name: str) -> bool:
    return isinstance(getattr(module, name, None), torch.nn.Module)


def _sub(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """The submodule `name` (torch types a module's attributes as Tensor | Module)."""
    return cast(torch.nn.Module, getattr(module, name))


def is_gated_mlp(module: torch.nn.Module) -> bool:
    return _has(module, "down_proj") and (
        (_has(module, "gate_proj") and _has(module, "up_proj")) or _has(module, "gate_up_proj")
    )


def project(module: torch.nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """(gate, up) as the module computes them from its input."""
    if _has(module, "gate_up_proj") and not _has(module, "gate_proj"):
        gate, up = _sub(module, "gate_up_proj")(x).chunk(2, dim=-1)
        return gate, up
    return _sub(module, "gate_proj")(x), _sub(module, "up_proj")(x)


def in_features(module: torch.nn.Module) -> int:
    proj: Any = _sub(module, "gate_proj") if _has(module, "gate_proj") else _sub(module, "gate_up_proj")
    if hasattr(proj, "in_features"):
        return int(proj.in_features)
    return int(proj.weight.shape[-1])


def make_activations(
    rows: Sequence[int], hidden: int, dtype: torch.dtype, device, generator: torch.Generator, scale: float = 1.0
) -> tuple[Tensor, ...]:
    gate = randn((*rows, hidden), dtype, device, generator, 2.0 * scale)
    up = randn((*rows, hidden), dtype, device, generator, scale)
    return gate, up


def module_activations(
    module: torch.nn.Module, rows: Sequence[int], dtype: torch.dtype, device, generator: torch.Generator
) -> tuple[Tensor, ...]:
    return (randn((*rows, in_features(module)), dtype, device, generator),)


def module_call(module: torch.nn.Module, x: Tensor) -> Tensor:
    return module(x)


def make_module_reference(reference: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def module_reference(module: torch.nn.Module, x: Tensor) -> Tensor:
        gate, up = project(module, x)
        return _sub(module, "down_proj")(reference(gate, up))

    return module_reference


def replacement_forward(
    module: torch.nn.Module, entry: Callable[..., Tensor], adapter: Sequence[dict[str, str]]
) -> Callable[..., Any]:
    if _has(module, "gate_up_proj") and not _has(module, "gate_proj"):
        # self: the MLP module (Any: its projections are attributes torch types as Tensor | Module)
        def forward(self: Any, hidden_states: Tensor) -> Tensor:
            gate, up = self.gate_up_proj(hidden_states).chunk(2, dim=-1)
            return self.down_proj(entry(gate, up))
    else:

        def forward(self: Any, hidden_states: Tensor) -> Tensor:
            return self.down_proj(entry(self.gate_proj(hidden_states), self.up_proj(hidden_states)))

    return forward


def bytes_moved(shape: Sequence[int], dtype: torch.dtype) -> int:
    return 3 * numel(shape) * itemsize(dtype)  # read gate, read up, write out


def gated_family(
    name: str,
    reference: Callable[..., Tensor],
    default_module: str,
    known_modules: tuple[str, ...],
    flops_per_element: int,
) -> OpFamily:
    return OpFamily(
        name=name,
        activations=("gate", "up"),
        params=(),
        default_module=default_module,
        reference=reference,
        make_activations=make_activations,
        module_call=module_call,
        replacement_forward=replacement_forward,
        module_activations=module_activations,
        bytes_moved=bytes_moved,
        flops=lambda shape: flops_per_element * numel(shape),
        known_modules=known_modules,
        hidden_of=in_features,
        module_reference=make_module_reference(reference),
        module_filter=is_gated_mlp,
        # The gate gets values past exp's overflow point; up stays N(0, 1) so gate x up stays finite
        # in float16 (a 200 gate times a 500 stream would not be).
        activation_roles=("gate", "bounded"),
    )
