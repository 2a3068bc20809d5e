"""Function swaps: replace module globals (rope's `apply_rotary_pos_emb`) with a guarded kernel wrapper.

Parity: each site's original and the wrapper run on the calls the site really sees (recorded on a
probe forward of the model, `probe_forward` or a fixed prompt for causal LMs) plus synthetic calls
at explicit q shapes; a model-level probe forward through the wrappers is reported, and fails the
swap only when it turns finite logits non-finite.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gpuyantra.candidate import Candidate
from gpuyantra.function_sites import FUNCTION_PROBE_HIDDEN, FUNCTION_PROBE_ROWS, FunctionSite, find_function_sites
from gpuyantra.ops import OpFamily
from gpuyantra.ops.base import as_tuple
from gpuyantra.swap.core import SwapCore
from gpuyantra.swap.guards import FUNCTION_GLOBALS, _function_wrapper, _LiveSwap
from gpuyantra.swap.parity import compare_outputs, param_dtype_device, probe_model_forward
from gpuyantra.swap.records import ParityError, Shape, SwapRecord


class FunctionSwaps(SwapCore):
    def function_sites(self, op: str) -> list[FunctionSite]:
        """Module globals of the model's modeling files that compute `op` (families with known_functions)."""
        if op not in self._sites_cache:
            self._sites_cache[op] = find_function_sites(self.model, [op])
        return self._sites_cache[op]

    def function_state(self) -> dict[str, str | None]:
        """Dotted function global -> id of the swap bound there (None: original)."""
        return {site.dotted: self._fn_owner.get(site.dotted) for sites in self._sites_cache.values() for site in sites}

    def _swap_functions(
        self,
        family: OpFamily,
        candidate: Candidate,
        sites: list[FunctionSite],
        swap_id: str,
        kept: Path,
        origin: str,
        source_path: str | None,
        module_class: str | None,
        live_shapes,
        reapply_record: SwapRecord | None,
    ) -> SwapRecord:
        """`swap` for a family bound at module globals: replace every site, check parity, commit or restore."""
        record = SwapRecord(
            swap_id=swap_id,
            op=family.name,
            model=self.model_id,
            file=str(kept),
            digest=candidate.digest,
            requested_module_class=module_class,
            adapter=candidate.adapter,
            origin=origin,
            source_path=source_path,
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
        live = _LiveSwap(record, family, candidate, self)
        return self._bind_check_commit(
            record,
            live,
            FUNCTION_GLOBALS,
            [(s.dotted, s) for s in sites],
            lambda: self._bind_functions_and_check(live, sites, live_shapes),
            reapply_record,
        )

    def _function_original(self, site: FunctionSite) -> Any:
        """What the site computed before any swap (the parity reference and the fallback)."""
        if site.dotted in self._fn_owner:
            return self._fn_originals[site.dotted]
        current = site.current()
        return getattr(current, "gpuyantra_original", current)

    def _capture_function_calls(self, sites: list[FunctionSite], limit: int):
        """Live-shaped calls of each site: its original on a probe forward of the model (inputs and
        outputs of up to `limit` calls with distinct input shapes per site), and the probe's output."""
        captured: dict[str, list[tuple[tuple, dict, Any]]] = {s.dotted: [] for s in sites}
        probe = self.probe_forward if self.probe_forward is not None else probe_model_forward(self.model)
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
        dtype, device = param_dtype_device(self.model)
        captured, probe_before = self._capture_function_calls(sites, max(1, self.max_parity_shapes))
        # Explicit q shapes [B, Hq, S, D] (e.g. from a profile) add synthetic calls at those shapes.
        chosen = live_shapes
        if isinstance(live_shapes, Mapping):
            chosen = next((live_shapes[k] for s in sites for k in (s.dotted, s.attr) if k in live_shapes), None)
        synthetic: list[tuple] = []
        for i, shape in enumerate(chosen or []):
            t = tuple(int(d) for d in shape)
            if len(t) == 4 and all(d > 0 for d in t) and t[-1] % 2 == 0:
                gen = torch.Generator().manual_seed(self.seed + 7919 * i)
                synthetic.append(family.make_activations(t[:-1], t[-1], dtype, device, gen))
        if not synthetic and not any(captured.values()):
            gen = torch.Generator().manual_seed(self.seed)
            synthetic.append(family.make_activations(FUNCTION_PROBE_ROWS, FUNCTION_PROBE_HIDDEN, dtype, device, gen))
        atol, rtol = family.tolerance(dtype)
        max_abs = max_rel = 0.0
        checked = 0
        used_shapes: set[Shape] = set()
        with torch.no_grad():
            for site in sites:
                original = self._function_original(site)
                calls = list(captured[site.dotted])
                for acts in synthetic[: self.max_parity_shapes]:
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
            probe = self.probe_forward if self.probe_forward is not None else probe_model_forward(self.model)
            after = probe() if probe is not None else None
            logits_after = getattr(after, "logits", after)
            if isinstance(logits_after, torch.Tensor) and logits_after.shape == logits_before.shape:
                diff = (logits_after.double() - logits_before.double()).abs()
                out["probe_max_abs_err"] = float(diff.max()) if diff.numel() else 0.0
                if not torch.isfinite(logits_after).all() and torch.isfinite(logits_before).all():
                    raise ParityError("the model's probe forward produced non-finite logits through the kernel")
        return out
