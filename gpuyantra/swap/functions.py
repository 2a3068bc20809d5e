"""Function swaps (`FunctionBinder`, a strategy of the swap engine): replace module globals (rope's
`apply_rotary_pos_emb`) with a guarded kernel wrapper.

Parity: each site's original and the wrapper run on the calls the site really sees (recorded on a
probe forward of the model, `probe_forward` or a fixed prompt for causal LMs) plus synthetic calls
at explicit q shapes; a model-level probe forward through the wrappers is reported, and fails the
swap only when it turns finite logits non-finite.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gpuyantra.function_sites import (
    FUNCTION_PROBE_HIDDEN,
    FUNCTION_PROBE_ROWS,
    FunctionSite,
    find_function_sites,
    site_matches,
)
from gpuyantra.ops.base import as_tuple
from gpuyantra.swap.core import BindRequest, SwapCore
from gpuyantra.swap.guards import FUNCTION_GLOBALS, BindingKind, _function_wrapper, _LiveSwap
from gpuyantra.swap.parity import compare_outputs, param_dtype_device, probe_model_forward
from gpuyantra.swap.records import ParityError, Shape, SwapRecord


class FunctionBinder:
    """Binds a candidate at module globals (the swap engine's `Binder` for families with
    `known_functions`, e.g. rope's `apply_rotary_pos_emb`)."""

    kind: BindingKind = FUNCTION_GLOBALS

    def __init__(self, core: SwapCore) -> None:
        self.core = core
        self._sites_cache: dict[str, list[FunctionSite]] = {}

    def sites(self, op: str) -> list[FunctionSite]:
        """Module globals of the model's modeling files that compute `op` (families with known_functions)."""
        if op not in self._sites_cache:
            self._sites_cache[op] = find_function_sites(self.core.model, [op])
        return self._sites_cache[op]

    def state(self) -> dict[str, str | None]:
        """Dotted function global -> id of the swap bound there (None: original)."""
        owner = self.core._fn_owner
        return {site.dotted: owner.get(site.dotted) for sites in self._sites_cache.values() for site in sites}

    def targets(self, request: BindRequest) -> list[Any]:
        """The sites that compute the family (only for families bound at functions), within the class asked."""
        family = request.family
        if not family.known_functions:
            return []
        return [s for s in self.sites(family.name) if site_matches(s, family, request.module_class)]

    def restore(self, live: _LiveSwap) -> None:
        core, swap_id = self.core, live.record.swap_id
        for dotted, site in live.functions.items():
            if core._fn_owner.get(dotted) == swap_id:
                site.set(core._fn_originals.pop(dotted))
                core._fn_owner.pop(dotted, None)

    def suspendable(self, live: _LiveSwap) -> list[tuple[BindingKind, Any, Any]]:
        core, swap_id = self.core, live.record.swap_id
        return [
            (FUNCTION_GLOBALS, site, core._fn_originals[dotted])
            for dotted, site in live.functions.items()
            if core._fn_owner.get(dotted) == swap_id
        ]

    def bind(self, request: BindRequest, targets: list[Any]) -> SwapRecord:
        """Replace every site of `targets`, check parity, commit or restore."""
        core, sites, family, candidate = self.core, targets, request.family, request.candidate
        reapply_record = request.reapply_record
        record = SwapRecord(
            swap_id=request.swap_id,
            op=family.name,
            model=core.model_id,
            file=str(request.kept),
            digest=candidate.digest,
            requested_module_class=request.module_class,
            adapter=candidate.adapter,
            origin=request.origin,
            source_path=request.source_path,
            binding="function",
        )
        if reapply_record is not None:
            record.created_at = reapply_record.created_at
        record.functions = [s.dotted for s in sites]
        record.module_class = ",".join(dict.fromkeys(s.attr for s in sites))
        record.qualified_class = ",".join(s.dotted for s in sites)
        record.module_classes = [c for s in sites for c in s.caller_classes]
        record.module_names = [n for s in sites for n in s.callers]
        record.modules = len(record.module_names)
        live = _LiveSwap(record, family, candidate, core)
        return core._bind_check_commit(
            record,
            live,
            FUNCTION_GLOBALS,
            [(s.dotted, s) for s in sites],
            lambda: self._bind_functions_and_check(live, sites, request.live_shapes),
            reapply_record,
        )

    def _function_original(self, site: FunctionSite) -> Any:
        """What the site computed before any swap (the parity reference and the fallback)."""
        if site.dotted in self.core._fn_owner:
            return self.core._fn_originals[site.dotted]
        current = site.current()
        return getattr(current, "gpuyantra_original", current)

    def _probe(self) -> Any:
        """The forward a function swap is checked on: the engine's probe, else a fixed prompt (causal LMs)."""
        core = self.core
        return core.probe_forward if core.probe_forward is not None else probe_model_forward(core.model)

    def _capture_function_calls(self, sites: list[FunctionSite], limit: int):
        """Live-shaped calls of each site: its original on a probe forward of the model (inputs and
        outputs of up to `limit` calls with distinct input shapes per site), and the probe's output."""
        captured: dict[str, list[tuple[tuple, dict, Any]]] = {s.dotted: [] for s in sites}
        probe = self._probe()
        if probe is None:
            return captured, None
        states = {s.dotted: s.current() for s in sites}

        def recorder(site, original):
            seen: set = set()

            def record_call(*args, **kwargs):
                out = original(*args, **kwargs)
                key = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else None for a in args)
                if key not in seen and len(captured[site.dotted]) < limit:
                    seen.add(key)
                    captured[site.dotted].append((args, dict(kwargs), out))
                return out

            return record_call

        try:
            for site in sites:
                site.set(recorder(site, self._function_original(site)))
            output = probe()
        except Exception:  # noqa: BLE001 - a model we cannot probe is checked on synthetic inputs only
            output = None
        finally:
            for site in sites:
                site.set(states[site.dotted])
        return captured, output

    def _bind_functions_and_check(self, live: _LiveSwap, sites: list[FunctionSite], live_shapes) -> dict[str, Any]:
        family = live.family
        dtype, device = param_dtype_device(self.core.model)
        captured, probe_before = self._capture_function_calls(sites, max(1, self.core.max_parity_shapes))
        # Explicit q shapes [B, Hq, S, D] (e.g. from a profile) add synthetic calls at those shapes.
        chosen = live_shapes
        if isinstance(live_shapes, Mapping):
            chosen = next((live_shapes[k] for s in sites for k in (s.dotted, s.attr) if k in live_shapes), None)
        synthetic: list[tuple] = []
        for i, shape in enumerate(chosen or []):
            t = tuple(int(d) for d in shape)
            if len(t) == 4 and all(d > 0 for d in t) and t[-1] % 2 == 0:
                gen = torch.Generator().manual_seed(self.core.seed + 7919 * i)
                synthetic.append(family.make_activations(t[:-1], t[-1], dtype, device, gen))
        if not synthetic and not any(captured.values()):
            gen = torch.Generator().manual_seed(self.core.seed)
            synthetic.append(family.make_activations(FUNCTION_PROBE_ROWS, FUNCTION_PROBE_HIDDEN, dtype, device, gen))
        atol, rtol = family.tolerance(dtype)
        max_abs = max_rel = 0.0
        checked = 0
        used_shapes: set[Shape] = set()
        with torch.no_grad():
            for site in sites:
                original = self._function_original(site)
                calls = list(captured[site.dotted])
                for acts in synthetic[: self.core.max_parity_shapes]:
                    calls.append((acts, {}, original(*acts)))
                site.set(_function_wrapper(site, live, original))
                for args, kwargs, want in calls:
                    shape = tuple(args[0].shape) if args and isinstance(args[0], torch.Tensor) else ()
                    got = as_tuple(site.current()(*args, **kwargs))
                    abs_err, rel_err = compare_outputs(site.dotted, got, as_tuple(want), shape, atol, rtol, dtype)
                    max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
                    checked += 1
                    used_shapes.add(shape)
        out = {
            "max_abs_err": max_abs,
            "max_rel_err": max_rel,
            "checked": checked,
            "shapes": sorted([list(s) for s in used_shapes]),
            "dtype": str(dtype).replace("torch.", ""),
            "atol": atol,
            "rtol": rtol,
            "modules": live.record.modules,
            "functions": [s.dotted for s in sites],
            "live_calls": sum(len(v) for v in captured.values()),
        }
        # The whole model on the probe prompt, through the bound wrappers (reported; the per-call
        # check above is the gate, a non-finite output where the original was finite also fails).
        logits_before = getattr(probe_before, "logits", probe_before)
        if isinstance(logits_before, torch.Tensor):
            probe = self._probe()
            after = probe() if probe is not None else None
            logits_after = getattr(after, "logits", after)
            if isinstance(logits_after, torch.Tensor) and logits_after.shape == logits_before.shape:
                diff = (logits_after.double() - logits_before.double()).abs()
                out["probe_max_abs_err"] = float(diff.max()) if diff.numel() else 0.0
                if not torch.isfinite(logits_after).all() and torch.isfinite(logits_before).all():
                    raise ParityError("the model's probe forward produced non-finite logits through the kernel")
        return out
