"""Module swaps (`ModuleBinder`, a strategy of the swap engine): bind a candidate as the forward of
every module of the model that computes its family.

The modules are found numerically (`find_module_groups`, never by class name alone), optionally
restricted to one module class or one set of live parameter shapes. Parity: for each module the
original forward and the bound kernel run on random inputs of the live shapes with the live
weights (the first shape once more with every bound float attribute perturbed) and must agree
within `family.tolerance(dtype)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gpuyantra.binding import ModuleGroup, find_module_groups, format_param_shapes
from gpuyantra.ops import OpFamily
from gpuyantra.ops.base import as_tuple
from gpuyantra.ops.open.spec import CaseKey
from gpuyantra.swap.core import BindRequest, SwapCore
from gpuyantra.swap.guards import _CLASS_FORWARD, MODULE_FORWARDS, BindingKind, _bind, _LiveSwap, _set_forward
from gpuyantra.swap.parity import attributes_set, compare_outputs, param_dtype_device, perturbed_scalars
from gpuyantra.swap.records import Shape, SwapRecord, SwapRejected


class ModuleBinder:
    """Binds a candidate as the `forward` of modules (the swap engine's `Binder` for module families)."""

    kind: BindingKind = MODULE_FORWARDS

    def __init__(self, core: SwapCore) -> None:
        self.core = core
        self._groups_cache: dict[str, list[ModuleGroup]] = {}

    def state(self) -> dict[str, str | None]:
        """Module name -> id of the swap bound there (None: original). For atomicity checks."""
        return {name: self.core._owner.get(name) for group in self._all_groups() for name in group.names}

    def groups(self, op: str) -> list[ModuleGroup]:
        if op not in self._groups_cache:
            self._groups_cache[op] = find_module_groups(self.core.model, [op])
        return self._groups_cache[op]

    def _all_groups(self) -> list[ModuleGroup]:
        out: list[ModuleGroup] = []
        for op in list(self._groups_cache):
            out.extend(self._groups_cache[op])
        return out

    def targets(self, request: BindRequest) -> list[Any]:
        """The module groups that compute the family, within the request's class and parameter shapes."""
        groups = self.groups(request.family.name)
        if request.module_class:
            groups = [g for g in groups if request.module_class in (g.module_class, g.qualified_class)]
        if request.param_shapes:
            wanted = request.param_shapes.items()
            groups = [g for g in groups if all(g.param_shapes.get(k, "?") == v for k, v in wanted)]
        return groups

    def restore(self, live: _LiveSwap) -> None:
        core = self.core
        for name, module in live.modules.items():
            _set_forward(module, core._originals.pop(name, _CLASS_FORWARD))
            core._owner.pop(name, None)

    def suspendable(self, live: _LiveSwap) -> list[tuple[BindingKind, Any, Any]]:
        core, swap_id = self.core, live.record.swap_id
        return [
            (MODULE_FORWARDS, module, core._originals.get(name, _CLASS_FORWARD))
            for name, module in live.modules.items()
            if core._owner.get(name) == swap_id
        ]

    def bind(self, request: BindRequest, targets: list[Any]) -> SwapRecord:
        """Bind every module of the groups `targets`, check parity, commit or restore."""
        core, groups, family, candidate = self.core, targets, request.family, request.candidate
        module_class, wanted_shapes, reapply_record = request.module_class, request.param_shapes, request.reapply_record
        record = SwapRecord(
            swap_id=request.swap_id,
            op=family.name,
            model=core.model_id,
            file=str(request.kept),
            digest=candidate.digest,
            requested_module_class=module_class,
            requested_param_shapes=wanted_shapes,
            rows_gate=request.rows_gate,
            adapter=candidate.adapter,
            origin=request.origin,
            source_path=request.source_path,
        )
        if reapply_record is not None:
            record.created_at = reapply_record.created_at
        if not groups:
            where = f" of class {module_class}" if module_class else ""
            where += f" with parameters {format_param_shapes(wanted_shapes)}" if wanted_shapes else ""
            reason = f"no module{where} of the served model computes {family.name}"
            core._finish_failed(record, reason, kept_file=reapply_record is None)
            raise SwapRejected(reason, record)
        record.module_classes = [g.module_class for g in groups]
        record.module_class = ",".join(dict.fromkeys(g.module_class for g in groups))
        record.qualified_class = ",".join(dict.fromkeys(g.qualified_class for g in groups))
        modules = [(name, core._modules[name]) for g in groups for name in g.names]
        record.module_names = [n for n, _ in modules]
        record.modules = len(modules)
        missing = [
            (n, b["module_attr"]) for n, m in modules for b in candidate.adapter if not hasattr(m, b["module_attr"])
        ]
        if missing:
            name, attr = missing[0]
            reason = (
                f"ADAPTER reads module attribute {attr!r}, which {type(core._modules[name]).__name__} "
                f"({name or 'root'}) does not have"
            )
            core._finish_failed(record, reason, kept_file=reapply_record is None)
            raise SwapRejected(reason, record)

        live = _LiveSwap(record, family, candidate, core)

        def check() -> dict[str, Any]:
            rows_by_group = {g.key: self._parity_rows(g, request.live_shapes, family) for g in groups}
            return self._bind_and_check(live, modules, groups, rows_by_group)

        return core._bind_check_commit(record, live, MODULE_FORWARDS, modules, check, reapply_record)

    def _parity_rows(self, group: ModuleGroup, live_shapes, family: OpFamily | None = None) -> list[Shape]:
        """Leading dims ("rows") of the inputs to check: the live shapes' minus their last dim. An
        open target is checked at whole case keys (every input's shape): each live call it was
        built from (prefill, decode at each served batch), then the live shapes given."""
        if isinstance(live_shapes, Mapping):
            chosen = (
                live_shapes.get(group.key)
                or live_shapes.get(group.qualified_class)
                or live_shapes.get(group.module_class)
                or []
            )
        elif live_shapes is not None:
            chosen = live_shapes
        elif self.core.shapes_provider is not None:
            chosen = self.core.shapes_provider(group.key)
        else:
            chosen = []
        target = getattr(family, "open_target", None)
        if target is not None:
            keys: list[Shape] = []
            for key in [*target.call_keys(), *chosen]:
                key = tuple(int(d) for d in key)
                if target._valid_key(key) and key not in keys:
                    keys.append(key)
            calls = len(target.call_keys())
            return [CaseKey(k) for k in keys[: max(calls, self.core.max_parity_shapes)]] or list(self.core.default_rows)
        rows: list[Shape] = []
        for s in chosen:
            t = tuple(int(d) for d in s)
            if len(t) >= 2 and all(d > 0 for d in t) and t[:-1] not in rows:
                rows.append(t[:-1])
        return rows[: self.core.max_parity_shapes] or list(self.core.default_rows)

    def _bind_and_check(self, live: _LiveSwap, targets, groups, rows_by_group) -> dict[str, Any]:
        family = live.family
        dtype, device = param_dtype_device(self.core.model)
        atol, rtol = family.tolerance(dtype)
        group_of = {name: g for g in groups for name in g.names}
        max_abs = 0.0
        max_rel = 0.0
        checked = perturbed = 0
        used_shapes: set[Shape] = set()
        with torch.no_grad():
            for index, (name, module) in enumerate(targets):
                # The reference is the module's original forward, even when another swap holds it now.
                original = (
                    self.core._originals.get(name, _CLASS_FORWARD)
                    if name in self.core._owner
                    else module.__dict__.get("forward", _CLASS_FORWARD)
                )
                _set_forward(module, original)
                wants = []
                for k, rows in enumerate(rows_by_group[group_of[name].key]):
                    gen = torch.Generator().manual_seed(self.core.seed + 7919 * k + index)
                    acts = family.activations_for_module(module, rows, dtype, device, gen)
                    # The first rows run once more with every bound float attribute moved off its
                    # live value on the module itself: a kernel with a baked-in eps fails here.
                    for scalars in ({}, perturbed_scalars(module, live.candidate.adapter, gen))[: 2 if k == 0 else 1]:
                        with attributes_set(module, scalars):
                            wants.append((acts, scalars, as_tuple(family.module_call(module, *acts))))
                _bind(module, live, original)
                for acts, scalars, want in wants:
                    shape = tuple(acts[0].shape)
                    with attributes_set(module, scalars):
                        got = as_tuple(family.module_call(module, *acts))
                    perturbed += bool(scalars)
                    abs_err, rel_err = compare_outputs(name, got, want, shape, atol, rtol, dtype)
                    max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
                    checked += 1
                    used_shapes.add(shape)
        return {
            "max_abs_err": max_abs,
            "max_rel_err": max_rel,
            "checked": checked,
            "shapes": sorted([list(s) for s in used_shapes]),
            "dtype": str(dtype).replace("torch.", ""),
            "atol": atol,
            "rtol": rtol,
            "modules": len(targets),
            "perturbed_scalar_checks": perturbed,
        }
