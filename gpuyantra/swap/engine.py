"""`SwapEngine`: the public face of the swap engine (swap, rollback, faults, re-apply, queries).

The state and the shared bind -> check -> commit skeleton are `gpuyantra.swap.core.SwapCore`'s;
the two kinds of binding are strategies the engine owns (`binders`: module forwards,
`gpuyantra.swap.modules.ModuleBinder`, then module globals, `gpuyantra.swap.functions.FunctionBinder`),
each given the core. A swap goes to the first binder with targets for it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from gpuyantra.binding import ModuleGroup
from gpuyantra.candidate import CandidateError, load_candidate, source_digest
from gpuyantra.function_sites import FunctionSite
from gpuyantra.ops import UnknownOpError, get_op
from gpuyantra.swap.core import Binder, BindRequest, SwapCore
from gpuyantra.swap.functions import FunctionBinder
from gpuyantra.swap.modules import ModuleBinder
from gpuyantra.swap.records import (
    CandidateLoadError,
    NotActiveError,
    SwapError,
    SwapForbidden,
    SwapRecord,
    UnknownSwapError,
    gate_dict,
    shapes_dict,
)


def source_digest_of(data: bytes) -> str:
    """The record's digest of a kept file's bytes (None-safe: bytes that are not UTF-8 match nothing)."""
    try:
        return source_digest(data.decode("utf-8"))
    except UnicodeDecodeError:
        return ""


class SwapEngine(SwapCore):
    # ------------------------------------------------------------------ the binding strategies
    @cached_property
    def module_binder(self) -> ModuleBinder:
        return ModuleBinder(self)

    @cached_property
    def function_binder(self) -> FunctionBinder:
        return FunctionBinder(self)

    @property
    def binders(self) -> tuple[Binder, ...]:
        """In the order a swap tries them: module forwards first, module globals for families bound there."""
        return (self.module_binder, self.function_binder)

    # ------------------------------------------------------------------ public: queries
    def groups(self, op: str) -> list[ModuleGroup]:
        """The model's module groups that compute `op`."""
        return self.module_binder.groups(op)

    def function_sites(self, op: str) -> list[FunctionSite]:
        """Module globals of the model's modeling files that compute `op` (families with known_functions)."""
        return self.function_binder.sites(op)

    def module_state(self) -> dict[str, str | None]:
        return self.module_binder.state()

    def function_state(self) -> dict[str, str | None]:
        return self.function_binder.state()

    def swaps_bound_at(self, modules: Iterable[str] = (), functions: Iterable[str] = ()) -> list[str]:
        """Ids of the swaps bound now at any of these module names or dotted function globals, sorted."""
        with self._state_lock:
            ids = {self._owner.get(n) for n in modules} | {self._fn_owner.get(f) for f in functions}
        return sorted(i for i in ids if i is not None)

    def active(self) -> list[dict[str, Any]]:
        with self._state_lock:
            return [live.record.to_dict() for live in self._live.values()]

    def history(self) -> list[dict[str, Any]]:
        with self._state_lock:
            return [r.to_dict() for r in self._history]

    def get(self, swap_id: str) -> dict[str, Any] | None:
        with self._state_lock:
            for r in self._history:
                if r.swap_id == swap_id:
                    return r.to_dict()
        return None

    def active_ids(self) -> list[str]:
        with self._state_lock:
            return list(self._live)

    # ------------------------------------------------------------------ public: swap
    def swap(
        self,
        path: str | Path | None = None,
        *,
        source: str | None = None,
        module_class: str | None = None,
        live_shapes: Sequence[Sequence[int]] | Mapping[str, Sequence[Sequence[int]]] | None = None,
        swap_id: str | None = None,
        admit: Callable[[bytes], str | None] | None = None,
        param_shapes: Mapping[str, Sequence[int] | None] | None = None,
        rows_gate: Mapping[str, Sequence[int]] | None = None,
        _reapply_record: SwapRecord | None = None,
    ) -> SwapRecord:
        """Load, bind, check parity, commit. Raises a `SwapError` subclass when nothing changed.

        `param_shapes` restricts the swap to modules with those live parameter shapes (a profile
        target's `param_shapes`: one linear projection shape, e.g. {"weight": [2048, 1536], ...}).
        `rows_gate` ({"kernel": rows, "original": rows}, from the verdict's timings) serves each call
        of a module swap with the kernel or the original forward by its row count (`serves_kernel`).

        `admit` sees the exact bytes about to be imported (the kept copy) and returns why they may
        not be, or None; it runs before the candidate's code does.
        """
        with self._op_lock:
            if _reapply_record is not None:
                swap_id = _reapply_record.swap_id
                kept = Path(_reapply_record.file)
                if not kept.exists():
                    raise CandidateLoadError(f"kept candidate file {kept} is missing")
                origin, source_path = "manifest", _reapply_record.source_path
                data = kept.read_bytes()
                if source_digest_of(data) != _reapply_record.digest:
                    raise SwapForbidden(f"kept candidate file {kept} changed since it was swapped in")
            else:
                swap_id = swap_id or self._new_id()
                kept, origin, source_path = self._keep_file(swap_id, path, source)
                data = kept.read_bytes()  # read once: these bytes are admitted, then compiled
                refused = admit(data) if admit is not None else None
                if refused:
                    kept.unlink(missing_ok=True)
                    raise SwapForbidden(refused)
            try:
                candidate = load_candidate(kept, data)
            except CandidateError as exc:
                if _reapply_record is None:
                    kept.unlink(missing_ok=True)
                raise CandidateLoadError(str(exc)) from exc
            try:
                family = get_op(candidate.op)
            except UnknownOpError as exc:
                if _reapply_record is None:
                    kept.unlink(missing_ok=True)
                raise CandidateLoadError(str(exc)) from exc
            wanted = sorted(family.adapter_params)
            bound = sorted(b["kernel_param"] for b in candidate.adapter)
            if bound != wanted:
                if _reapply_record is None:
                    kept.unlink(missing_ok=True)
                raise CandidateLoadError(
                    f"ADAPTER binds kernel parameters {bound}, but {family.name} entry takes {wanted}"
                )

            wanted_shapes = shapes_dict(param_shapes)
            gate = gate_dict(rows_gate)
            if _reapply_record is not None:
                wanted_shapes = _reapply_record.requested_param_shapes
                gate = _reapply_record.rows_gate
            request = BindRequest(
                family=family,
                candidate=candidate,
                swap_id=swap_id,
                kept=kept,
                origin=origin,
                source_path=source_path,
                module_class=module_class,
                live_shapes=live_shapes,
                reapply_record=_reapply_record,
                param_shapes=wanted_shapes,
                rows_gate=gate,
            )
            for binder in self.binders:
                targets = binder.targets(request)
                if targets:
                    return binder.bind(request, targets)
            # Nothing computes the op: the module binder records and explains the refusal.
            return self.module_binder.bind(request, [])

    # ------------------------------------------------------------------ public: rollback
    def rollback(
        self, swap_id: str | None = None, *, all: bool = False, reason: str = "admin rollback", cause: str = "admin"
    ) -> list[SwapRecord]:
        """Restore the original forward of one swap's modules, or of every active swap."""
        with self._op_lock:
            if all:
                ids = list(self._live)
            else:
                if swap_id is None:
                    raise SwapError("give a swap_id or all")
                self._require_active(swap_id)
                ids = [swap_id]
            done: list[SwapRecord] = []
            now = time.time()
            with self._state_lock:
                for sid in reversed(ids):
                    live = self._live.pop(sid)
                    for binder in self.binders:
                        binder.restore(live)
                    live.record.status = "rolled_back"
                    live.record.rolled_back_at = now
                    live.record.reason = reason
                    live.faulted = True  # any stale reference to its forwards now uses the original
                    done.append(live.record)
            if done:
                self._save_manifest()
                if self.after_restore is not None:
                    self._safe_after_restore()
                for record in done:
                    self._emit("rolled_back", record, cause=cause)
            return list(reversed(done))

    @contextlib.contextmanager
    def previous_forwards(self):
        """Inside `before_commit`: temporarily put back the forwards the swap is replacing (what
        served before it), e.g. to compute the reference of a graph-path parity check."""
        staged = self._staged or []
        if not staged:
            yield
            return
        current = [(kind, obj, kind.get(obj)) for kind, obj, _ in staged]
        try:
            for kind, obj, previous in staged:
                kind.put(obj, previous)
            yield
        finally:
            for kind, obj, state in current:
                kind.put(obj, state)

    @contextlib.contextmanager
    def suspension(self, swap_id: str) -> Iterator[Callable[[bool], None]]:
        """Turn one active swap off and on again without rolling it back: yields `use(on)`, which
        puts back what a rollback would (the forwards and functions before any swap) or the swap's
        own again. Leaving the block always turns it back on. For paired speed measurements: the
        caller runs with no traffic and keeps CUDA graphs in step with each `use`."""
        with self._op_lock:
            self._require_active(swap_id)
            live = self._live[swap_id]
            bound = [entry for binder in self.binders for entry in binder.suspendable(live)]
            swapped = [kind.get(obj) for kind, obj, _ in bound]

            def use(on: bool) -> None:
                for (kind, obj, before), mine in zip(bound, swapped):
                    kind.put(obj, mine if on else before)

            try:
                yield use
            finally:
                use(True)

    def _require_active(self, swap_id: str) -> None:
        """Raise UnknownSwapError / NotActiveError unless `swap_id` is bound now."""
        if swap_id in self._live:
            return
        record = next((r for r in self._history if r.swap_id == swap_id), None)
        if record is None:
            raise UnknownSwapError(f"no swap with id {swap_id!r}")
        raise NotActiveError(f"swap {swap_id} is not active (status {record.status})", record)

    def pending_faults(self) -> bool:
        return bool(self._faults)

    def handle_faults(self) -> list[SwapRecord]:
        """Roll back every swap whose kernel raised while serving (call between forward passes)."""
        out: list[SwapRecord] = []
        while self._faults:
            live = self._faults.popleft()
            sid = live.record.swap_id
            if sid in self._live:
                out.extend(
                    self.rollback(
                        sid,
                        reason=f"kernel raised while serving, fell back to the original "
                        f"forward: {live.record.last_error}",
                        cause="fallback",
                    )
                )
        return out

    # ------------------------------------------------------------------ public: restart
    def reapply(self, live_shapes=None) -> list[dict[str, Any]]:
        """Re-bind this model's committed records from the manifest, each after a fresh parity check."""
        results = []
        with self._op_lock:
            pending = [
                r
                for r in self._history
                if r.status == "committed" and r.model == self.model_id and r.swap_id not in self._live
            ]
            pending.sort(key=lambda r: r.committed_at or 0)
            for old in pending:
                try:
                    record = self.swap(
                        module_class=old.requested_module_class, live_shapes=live_shapes, _reapply_record=old
                    )
                    results.append({"swap_id": record.swap_id, "status": "committed", "reapplied": True})
                except SwapError as exc:
                    with self._state_lock:
                        old.status = "rolled_back"
                        old.rolled_back_at = time.time()
                        old.reason = f"re-check on restart failed: {exc.reason}"
                        if exc.record is not None and exc.record.parity:
                            old.parity = exc.record.parity
                    self._save_manifest()
                    self._emit("rolled_back", old, cause="reapply")
                    results.append({"swap_id": old.swap_id, "status": "rolled_back", "reason": old.reason})
        return results
