"""Sibling projections computed as one GEMM: q/k/v of an attention module, gate/up of a gated MLP.

Why: at decode the small projections are latency-bound, not bandwidth-bound (on an H200 under
CUDA graphs the k and v GEMVs of Qwen2.5-1.5B take ~5 µs each for 0.8 MB of weights), so one GEMM
over the concatenated weights is cheaper than three. The modeling code keeps calling
`q_proj(x)`, `k_proj(x)`, `v_proj(x)`: the first sibling's forward computes the fused product and
hands the others their slices when they are called with the very same input tensor (anything else
runs their own `F.linear`, so a foreign caller never gets a stale result).

Weights stay where users and the swap engine expect them: each sibling's `weight`/`bias` becomes a
view into the fused tensor (same values, no second copy), so in-place weight updates reach the
fused GEMM, and `unfuse()` restores independent parameters and the original forwards.

The fused GEMM is itself an `nn.Linear` registered beside the siblings (`fused_q_proj_k_proj_v_proj`,
`fused_gate_proj_up_proj`) and called by the first sibling: the swap engine, the profiler and the
shape recorder see it as the 2048x1536 (q/k/v) or 17920x1536 (gate/up) projection it is, so a
`linear` kernel swapped into it replaces the fused GEMM. The siblings' own forwards are marked
`gpuyantra_delegates` (their work is the fused module's): the `linear` family never binds them, so a
swap cannot silently undo the fusion. Its parameters share the siblings' storage (no copy).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


@dataclass
class _Fused:
    parent: torch.nn.Module
    names: tuple[str, ...]
    weight: torch.Tensor
    bias: torch.Tensor | None
    splits: list[int]
    stash: dict[str, Any] = field(default_factory=dict)
    module: torch.nn.Linear | None = None  # the fused GEMM as a module (registered on `parent` as `attr`)
    attr: str = ""


def _siblings(parent: torch.nn.Module, names: tuple[str, ...]) -> list[torch.nn.Linear] | None:
    found = [getattr(parent, n, None) for n in names]
    mods = [m for m in found if type(m) is torch.nn.Linear]  # exact class: subclasses may do more
    if len(mods) != len(found):
        return None
    first = mods[0].weight
    if any(
        m.weight.shape[1] != first.shape[1] or m.weight.dtype != first.dtype or m.weight.device != first.device
        for m in mods
    ):
        return None
    if len({m.bias is None for m in mods}) != 1:
        return None
    if any(m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__ for m in mods):
        return None  # hooked, swapped or fused already
    return mods


def _fuse_one(parent: torch.nn.Module, names: tuple[str, ...], mods: list[torch.nn.Linear]) -> _Fused:
    with torch.no_grad():
        weight = torch.cat([m.weight for m in mods])
        bias = torch.cat([m.bias for m in mods]) if mods[0].bias is not None else None
    splits = [m.weight.shape[0] for m in mods]
    fused = _Fused(parent, names, weight, bias, splits)
    fused.module, fused.attr = _fused_linear(weight, bias, mods[0].weight.requires_grad), "fused_" + "_".join(names)
    parent.add_module(fused.attr, fused.module)
    offset = 0
    for m, rows in zip(mods, splits):
        m.weight = torch.nn.Parameter(weight[offset : offset + rows], requires_grad=m.weight.requires_grad)
        if bias is not None:
            m.bias = torch.nn.Parameter(bias[offset : offset + rows], requires_grad=m.bias.requires_grad)
        offset += rows
    lead, rest = mods[0], list(zip(names[1:], mods[1:]))

    def lead_forward(self, x):
        out = fused.module(x)  # a module call: a kernel swapped into the fused GEMM runs here
        parts = out.split(fused.splits, dim=-1)
        fused.stash = {"input": x, **{name: part for (name, _), part in zip(rest, parts[1:])}}
        return parts[0]

    def make_follower(name: str):
        def follower_forward(self, x):
            if fused.stash.get("input") is x and name in fused.stash:
                return fused.stash.pop(name)
            return F.linear(x, self.weight, self.bias)

        follower_forward.gpuyantra_delegates = True  # type: ignore[attr-defined]
        return follower_forward

    lead_forward.gpuyantra_delegates = True  # type: ignore[attr-defined]

    # Instance-level forward overrides are the point here (mypy forbids assigning to a method).
    lead.forward = types.MethodType(lead_forward, lead)  # type: ignore[method-assign]
    for name, m in rest:
        m.forward = types.MethodType(make_follower(name), m)  # type: ignore[method-assign]
    return fused


def _fused_linear(weight: torch.Tensor, bias: torch.Tensor | None, requires_grad: bool) -> torch.nn.Linear:
    """An nn.Linear over the fused tensors (its parameters share their storage)."""
    module = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    module.weight = torch.nn.Parameter(weight, requires_grad=requires_grad)
    if bias is not None:
        module.bias = torch.nn.Parameter(bias, requires_grad=requires_grad)
    return module


def fuse(model: torch.nn.Module) -> int:
    """Fuse every q/k/v and gate/up sibling group of plain `nn.Linear`s (idempotent); returns the
    number of groups fused in `model` now."""
    done: list[_Fused] = model.__dict__.setdefault("_gpuyantra_fused", [])
    for parent in list(model.modules()):
        for names in GROUPS:
            mods = _siblings(parent, names)
            if mods is not None:
                done.append(_fuse_one(parent, names, mods))
    return len(done)


def unfuse(model: torch.nn.Module) -> None:
    """Independent parameters (copies of the current values) and the class forwards back."""
    for group in model.__dict__.pop("_gpuyantra_fused", []):
        for name in group.names:
            m = getattr(group.parent, name)
            m.weight = torch.nn.Parameter(m.weight.detach().clone(), requires_grad=m.weight.requires_grad)
            if m.bias is not None:
                m.bias = torch.nn.Parameter(m.bias.detach().clone(), requires_grad=m.bias.requires_grad)
            m.__dict__.pop("forward", None)
        if group.attr and hasattr(group.parent, group.attr):
            delattr(group.parent, group.attr)
        group.stash.clear()
