"""Guarded forwards: what a swap binds, and the live state the guards consult.

A module swap binds `family.replacement_forward(module, entry, ADAPTER)` as `module.forward`; a
function swap replaces a module global with a wrapper that follows rope's calling convention
(`fn(q, k, cos, sin[, position_ids], unsqueeze_dim=1)`). Both guards serve a call with the
original when the swap has faulted, and while serving (not during parity checks or graph captures)
turn a raising kernel into a fallback to the original plus a queued rollback (`_LiveSwap.note_fault`).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from gpuyantra.candidate import Candidate
from gpuyantra.function_sites import FunctionSite
from gpuyantra.ops import OpFamily
from gpuyantra.swap.records import SwapRecord

_CLASS_FORWARD = object()  # marker: the module had no instance-level forward before any swap


class SwapEvents(Protocol):
    """Where a guard reports a kernel that raised while serving (the swap engine's core; named by
    this protocol only, so the guards import nothing of the engine)."""

    def _queue_fault(self, live: _LiveSwap) -> None: ...

    def _emit(self, kind: str, record: SwapRecord, **info: Any) -> None: ...


class _LiveSwap:
    """A swap whose forwards are bound right now (or being bound)."""

    def __init__(self, record: SwapRecord, family: OpFamily, candidate: Candidate, events: SwapEvents):
        self.record = record
        self.family = family
        self.candidate = candidate
        self.events = events
        self.modules: dict[str, torch.nn.Module] = {}
        self.functions: dict[str, FunctionSite] = {}  # function binding: dotted global -> site
        self.strict = True  # during parity/capture: kernel exceptions propagate (no silent fallback)
        self.faulted = False

    def note_fault(self, exc: BaseException) -> None:
        first = not self.faulted
        self.faulted = True
        self.record.fallbacks += 1
        if first:
            self.record.last_error = f"{type(exc).__name__}: {exc}"[:500]
            self.events._queue_fault(self)
        self.events._emit("fallback", self.record, error=self.record.last_error)


def _set_forward(module: torch.nn.Module, state: Any) -> None:
    """Put back an instance-level forward state captured with `module.__dict__.get('forward', ...)`."""
    if state is _CLASS_FORWARD:
        module.__dict__.pop("forward", None)
    else:
        module.__dict__["forward"] = state


def _forward_state(module: torch.nn.Module) -> Any:
    """The module's instance-level forward (`_CLASS_FORWARD`: none, the class's forward serves)."""
    return module.__dict__.get("forward", _CLASS_FORWARD)


def _site_state(site: FunctionSite) -> Any:
    return site.current()


def _set_site(site: FunctionSite, state: Any) -> None:
    site.set(state)


@dataclass(frozen=True)
class BindingKind:
    """Where a swap binds: module forwards or module globals. `name` is the `_LiveSwap` attribute
    holding the bound objects; `get`/`put` read and put back an object's current state."""

    name: str
    get: Callable[[Any], Any]
    put: Callable[[Any, Any], None]


MODULE_FORWARDS = BindingKind("modules", _forward_state, _set_forward)
FUNCTION_GLOBALS = BindingKind("functions", _site_state, _set_site)


def _original_callable(module: torch.nn.Module, original: Any) -> Callable[..., Any]:
    if original is _CLASS_FORWARD:
        return types.MethodType(type(module).forward, module)
    return original


def serves_kernel(gate: dict[str, list[int]] | None, rows: int) -> bool:
    """Whether a call of `rows` rows goes to the kernel under a swap's rows gate
    (`gpuyantra.verifier.verdict.rows_gate`): the kernel where it was faster at the timed row count
    nearest `rows` (by ratio), the original where it was not; a tie goes to the original."""
    if not gate or not gate.get("original"):
        return True
    timed = [(r, True) for r in gate.get("kernel") or []] + [(r, False) for r in gate["original"]]
    distance = {r: abs(math.log(max(rows, 1) / r)) for r, _ in timed}
    nearest = min(distance.values())
    return all(wins for r, wins in timed if distance[r] == nearest)


def _call_rows(args: tuple[Any, ...]) -> int:
    """Rows of a call: the leading dims of its first tensor argument (1 when there is none)."""
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return int(first.numel() // first.shape[-1]) if first is not None and first.dim() > 0 and first.shape[-1] else 1


def _bind(module: torch.nn.Module, live: _LiveSwap, original: Any) -> None:
    """Bind the candidate as `module.forward`, guarded: a raising kernel falls back to `original`;
    calls whose row count the swap's rows gate gives to the original go there."""
    kernel_forward = live.family.replacement_forward(module, live.candidate.entry, live.candidate.adapter)
    fallback = _original_callable(module, original)
    record = live.record
    gate = record.rows_gate

    def forward(self, *args, **kwargs):
        if live.faulted:
            record.fallbacks += 1
            return fallback(*args, **kwargs)
        if gate and not serves_kernel(gate, _call_rows(args)):
            if not live.strict:
                record.original_calls += 1
            return fallback(*args, **kwargs)
        try:
            out = kernel_forward(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any kernel failure: serve with the original instead
            if live.strict:
                raise
            live.note_fault(exc)
            return fallback(*args, **kwargs)
        if not live.strict:  # parity checks and graph captures are not served calls
            record.calls += 1
        return out

    forward.__name__ = f"gpuyantra_swapped_forward_{record.swap_id.replace('-', '_')}"
    forward.gpuyantra_swap_id = record.swap_id  # type: ignore[attr-defined]
    module.forward = types.MethodType(forward, module)


def swapped_id(module: torch.nn.Module) -> str | None:
    """The swap id whose forward is bound on `module` now (None: not swapped)."""
    fwd = module.__dict__.get("forward")
    return getattr(getattr(fwd, "__func__", None), "gpuyantra_swap_id", None)


def _function_wrapper(site: FunctionSite, live: _LiveSwap, original: Callable[..., Any]) -> Callable[..., Any]:
    """The guarded replacement of a rope-style function: the kernel where the call is in the regime
    the function was verified for, the original otherwise (and on a kernel exception while serving)."""
    import inspect

    entry = live.candidate.entry
    record = live.record
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    def eligible(q, k, cos, sin, position_ids, unsqueeze_dim) -> int | None:
        """The unsqueeze dim normalized to 1 ([B, H, S, D]) or 2 ([B, S, H, D]); None: use the original."""
        if not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
            return None
        if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
            return None
        if position_ids is not None and not site.ignores_position_ids:
            return None
        try:
            ud = int(unsqueeze_dim) % 4
        except (TypeError, ValueError):
            return None
        if ud not in (1, 2):
            return None
        if q.dtype != k.dtype or cos.dtype != sin.dtype or not q.is_floating_point():
            return None
        if cos.dtype != q.dtype and not site.mixed_ok:
            return None
        if len({q.device, k.device, cos.device, sin.device}) != 1:
            return None
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, cos, sin)):
            return None
        head_dim, rot = q.shape[-1], cos.shape[-1]
        if k.shape[-1] != head_dim or rot % 2 or rot > head_dim or (rot < head_dim and not site.partial_ok):
            return None
        seq_dim, head_dim_ax = (2, 1) if ud == 1 else (1, 2)
        if q.shape[0] != k.shape[0] or q.shape[seq_dim] != k.shape[seq_dim] or cos.shape[1] != q.shape[seq_dim]:
            return None
        if cos.shape[0] not in (1, q.shape[0]):
            return None
        return ud

    def wrapper(*args, **kwargs):
        if live.faulted:
            record.fallbacks += 1
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs) if signature is not None else None
        except TypeError:
            bound = None
        if bound is None:
            return original(*args, **kwargs)
        bound.apply_defaults()
        values = list(bound.arguments.values())
        if len(values) < 4:
            return original(*args, **kwargs)
        q, k, cos, sin = values[:4]
        ud = eligible(q, k, cos, sin, bound.arguments.get("position_ids"), bound.arguments.get("unsqueeze_dim", 1))
        if ud is None:
            return original(*args, **kwargs)
        try:
            if ud == 1:
                out = entry(q, k, cos, sin)
            else:
                q_embed, k_embed = entry(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
                out = (q_embed.transpose(1, 2), k_embed.transpose(1, 2))
        except Exception as exc:  # noqa: BLE001 - any kernel failure: serve with the original instead
            if live.strict:
                raise
            live.note_fault(exc)
            return original(*args, **kwargs)
        if not live.strict:
            record.calls += 1
        return out

    wrapper.__name__ = getattr(original, "__name__", site.attr)
    wrapper.__qualname__ = wrapper.__name__
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.gpuyantra_swap_id = record.swap_id  # type: ignore[attr-defined]
    wrapper.gpuyantra_original = original  # type: ignore[attr-defined]
    return wrapper


def swapped_function_id(fn: Any) -> str | None:
    """The swap id whose wrapper `fn` is (None: not a swapped function)."""
    return getattr(fn, "gpuyantra_swap_id", None)
