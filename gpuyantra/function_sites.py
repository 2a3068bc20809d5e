"""Function-site discovery: module globals of the model's modeling files that compute an op family.

Families that no module computes (rope: attention modules call the module-level function
`apply_rotary_pos_emb` of their modeling file) declare `known_functions`. A function site is one
python module's global of that name, used by the live model's modules and checked numerically
against the family reference (`function_computes`, rope's calling convention
`fn(q, k, cos, sin[, position_ids], unsqueeze_dim=1)`). The profiler ranks the sites as targets;
the swap engine (`gpuyantra.swap.functions`) replaces them with guarded wrappers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpuyantra.ops import OpFamily
from gpuyantra.ops.base import as_tuple


@dataclass
class FunctionSite:
    """One module global (`<python module>.<attr>`) that computes a family, and who calls it."""

    op: str
    py_module: str
    attr: str
    callers: list[str] = field(default_factory=list)  # model module names whose class forward calls it
    caller_classes: list[str] = field(default_factory=list)
    partial_ok: bool = False  # R < D (Phi-3 partial rotary) matches the reference too
    mixed_ok: bool = False  # 16-bit q/k with float32 cos/sin (OLMo2) matches the reference too
    ignores_position_ids: bool = True

    @property
    def dotted(self) -> str:
        return f"{self.py_module}.{self.attr}"

    @property
    def count(self) -> int:
        return len(self.callers)

    def current(self) -> Any:
        import sys

        return getattr(sys.modules[self.py_module], self.attr)

    def set(self, fn: Any) -> None:
        import sys

        setattr(sys.modules[self.py_module], self.attr, fn)


FUNCTION_PROBE_ROWS = (2, 4, 3)  # (B, Hq, S)
FUNCTION_PROBE_HIDDEN = 16
# (family, id(fn)) -> (fn, verdict); fn is kept so that its id is never reused by another object.
_function_verdicts: dict[tuple[str, int], tuple[Any, tuple[bool, bool, bool, bool] | None]] = {}


def _function_call_matches(fn, family: OpFamily, acts, atol: float, rtol: float, **kwargs) -> bool | None:
    """True/False: fn(*acts) equals the reference (dtypes included); None: fn raised."""
    from gpuyantra.ops.base import outputs_close

    try:
        with torch.no_grad():
            got = fn(*acts, **kwargs)
            want = family.reference(*acts)
    except Exception:  # noqa: BLE001
        return None
    got_t, want_t = as_tuple(got), as_tuple(want)
    if len(got_t) != len(want_t) or any(
        not isinstance(g, torch.Tensor) or g.dtype != w.dtype or g.shape != w.shape for g, w in zip(got_t, want_t)
    ):
        return False
    return outputs_close(got, want, atol=atol, rtol=rtol)


def function_computes(fn: Any, family: OpFamily) -> tuple[bool, bool, bool, bool] | None:
    """(matches, partial_ok, mixed_ok, ignores_position_ids) of a free function, or None when its
    math is not the family's (float64 on random inputs, then bfloat16 dtype handling)."""
    import inspect

    key = (family.name, id(fn))
    if key in _function_verdicts:
        return _function_verdicts[key][1]
    from gpuyantra.binding import FP64_TOLERANCE

    verdict = None
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    gen = torch.Generator().manual_seed(4321)
    acts = family.make_activations(FUNCTION_PROBE_ROWS, FUNCTION_PROBE_HIDDEN, torch.float64, "cpu", gen)
    if _function_call_matches(fn, family, acts, *FP64_TOLERANCE):
        atol, rtol = family.tolerance(torch.bfloat16)
        low = tuple(a.to(torch.bfloat16) for a in acts)
        if _function_call_matches(fn, family, low, 2 * atol, 2 * rtol) is not False:
            q, k, cos, sin = acts
            rot = FUNCTION_PROBE_HIDDEN // 2
            partial = bool(
                _function_call_matches(
                    fn, family, (q, k, cos[..., :rot].contiguous(), sin[..., :rot].contiguous()), *FP64_TOLERANCE
                )
            )
            mixed = bool(
                _function_call_matches(fn, family, (low[0], low[1], cos.float(), sin.float()), 2 * atol, 2 * rtol)
            )
            ignores = True
            if "position_ids" in params:
                pos = torch.arange(FUNCTION_PROBE_ROWS[-1])[None].expand(FUNCTION_PROBE_ROWS[0], -1) + 3
                ignores = bool(_function_call_matches(fn, family, acts, *FP64_TOLERANCE, position_ids=pos))
            verdict = (True, partial, mixed, ignores)
    _function_verdicts[key] = (fn, verdict)
    return verdict


def _forward_names(cls: type) -> set[str]:
    import inspect

    fwd: Any = getattr(cls, "forward", None)
    try:
        fwd = inspect.unwrap(fwd)
    except Exception:  # noqa: BLE001
        pass
    code = getattr(fwd, "__code__", None)
    return set(code.co_names) if code is not None else set()


def find_function_sites(model: torch.nn.Module, ops: Sequence[str] | None = None) -> list[FunctionSite]:
    """Module globals named like a family's `known_functions` in the python modules of the model's
    classes, called by a class's forward and numerically equal to the family's reference."""
    import sys

    from gpuyantra.ops import all_ops

    sites: dict[tuple[str, str, str], FunctionSite] = {}
    families = [f for f in all_ops() if f.known_functions and (ops is None or f.name in ops)]
    for family in families:
        attrs = sorted({dotted.rsplit(".", 1)[-1] for dotted in family.known_functions})
        for name, module in model.named_modules():
            cls = type(module)
            py_module = sys.modules.get(cls.__module__)
            if py_module is None:
                continue
            names = _forward_names(cls)
            for attr in attrs:
                if attr not in names:
                    continue
                fn = getattr(py_module, attr, None)
                if fn is None or not callable(fn):
                    continue
                original = getattr(fn, "gpuyantra_original", fn)  # a site swapped now: judge what it replaced
                verdict = function_computes(original, family)
                if verdict is None:
                    continue
                site = sites.setdefault(
                    (family.name, cls.__module__, attr),
                    FunctionSite(
                        op=family.name,
                        py_module=cls.__module__,
                        attr=attr,
                        partial_ok=verdict[1],
                        mixed_ok=verdict[2],
                        ignores_position_ids=verdict[3],
                    ),
                )
                site.callers.append(name)
                if cls.__name__ not in site.caller_classes:
                    site.caller_classes.append(cls.__name__)
    return list(sites.values())


def site_matches(site: FunctionSite, family: OpFamily, module_class: str | None) -> bool:
    """Whether a swap's `module_class` filter selects this function site."""
    if not module_class:
        return True
    default = family.default_module
    return module_class in (
        site.attr,
        site.dotted,
        site.py_module,
        default,
        default.rsplit(".", 1)[-1],
        *site.caller_classes,
    )
