"""The swap engine: hot-swap a verified candidate kernel into a live model, all modules or none.

A swap
1. copies the candidate into the state folder (`<state_dir>/swaps/<swap_id>.py`) and loads it from
   there with `load_candidate` (a real file that stays on disk: Triton re-reads kernel source when it
   specializes for new shapes);
2. finds every module that computes the candidate's op family (`find_module_groups`, a numeric check,
   never a class name alone), optionally restricted to one module class, and checks each module has
   the attributes the candidate's `ADAPTER` reads;
3. for each module: computes the original forward on random inputs of the live shapes with the live
   weights, binds `family.replacement_forward(module, entry, ADAPTER)` (wrapped in a fallback guard)
   with `types.MethodType`, computes the new forward on the same inputs and compares them within
   `family.tolerance(dtype)`;
4. runs the `before_commit` hook (the serving engine re-captures CUDA graphs there and checks parity
   on the graph path);
5. commits: the record becomes active and the manifest is written. If anything in 1-4 fails or
   raises, every module gets back exactly the forward it had before, and the record is kept in the
   history as `rolled_back` with the reason.

The caller is responsible for running `swap`/`rollback` while no forward pass is in flight (the
serving engine does it between forward passes, on its single model thread); this module never
exposes a partly bound set of modules to a concurrent forward because it never runs beside one.

While serving, a swapped module whose kernel raises falls back to the original forward for that
call, marks its swap as faulted (all its modules then use the original forward) and queues the
swap for rollback; `handle_faults()` (called between forward passes) performs that rollback.

A newer swap that binds modules an active swap holds supersedes it on those modules; rolling back
the newer swap restores the original forward (not the superseded kernel).

Manifest: `<state_dir>/swaps/manifest.json` holds every record (history, with status). `reapply()`
re-binds the records still `committed` for this model after re-checking parity, keeping their ids.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

from gpuyantra.binding import ModuleGroup, find_module_groups, format_param_shapes
from gpuyantra.candidate import Candidate, CandidateError, load_candidate
from gpuyantra.ops import OpFamily, UnknownOpError, get_op
from gpuyantra.ops.base import as_tuple

MANIFEST_VERSION = 1
HISTORY_LIMIT = 1000

Shape = tuple[int, ...]


class SwapError(Exception):
    """A swap or rollback that did not happen. `http_status` is what the admin API answers."""

    http_status = 409
    status = "rejected"

    def __init__(self, reason: str, record: SwapRecord | None = None):
        super().__init__(reason)
        self.reason = reason
        self.record = record

    def detail(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "reason": self.reason}
        if self.record is not None:
            out["swap_id"] = self.record.swap_id
            if self.record.parity:
                out["parity"] = self.record.parity
        return out


class CandidateLoadError(SwapError):
    """The candidate cannot be read or imported, or breaks the candidate contract."""

    http_status = 422
    status = "invalid_candidate"


class SwapForbidden(SwapError):
    """The candidate's bytes are not what the verifier accepted (or carry no attestation)."""

    http_status = 403
    status = "forbidden"


class SwapRejected(SwapError):
    """The candidate is valid but fits no module of this model."""

    status = "rejected"


class ParityError(SwapError):
    """Parity failed (or binding/checking raised): every module was restored."""

    status = "rolled_back"


class UnknownSwapError(SwapError):
    http_status = 404
    status = "unknown"


class NotActiveError(SwapError):
    status = "not_active"


@dataclass
class SwapRecord:
    swap_id: str
    op: str
    model: str
    file: str
    digest: str
    status: str = "pending"  # pending | committed | rolled_back | superseded
    module_class: str | None = None
    qualified_class: str | None = None
    module_classes: list[str] = field(default_factory=list)
    requested_module_class: str | None = None
    # The live parameter shapes the swap was restricted to (linear: one projection shape), or None.
    requested_param_shapes: dict[str, list[int] | None] | None = None
    modules: int = 0
    module_names: list[str] = field(default_factory=list)
    adapter: list[dict[str, str]] = field(default_factory=list)
    origin: str = "path"  # path | source | manifest
    source_path: str | None = None
    created_at: float = field(default_factory=time.time)
    committed_at: float | None = None
    rolled_back_at: float | None = None
    reapplied_at: float | None = None
    reason: str | None = None
    parity: dict[str, Any] = field(default_factory=dict)
    calls: int = 0
    fallbacks: int = 0
    last_error: str | None = None
    superseded_by: str | None = None
    binding: str = "module"  # module: forwards bound on modules; function: module globals replaced
    functions: list[str] = field(default_factory=list)  # function binding: the dotted globals replaced

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SwapRecord:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


_CLASS_FORWARD = object()  # marker: the module had no instance-level forward before any swap


class _LiveSwap:
    """A swap whose forwards are bound right now (or being bound)."""

    def __init__(self, record: SwapRecord, family: OpFamily, candidate: Candidate, engine: SwapEngine):
        self.record = record
        self.family = family
        self.candidate = candidate
        self.engine = engine
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
            self.engine._queue_fault(self)
        self.engine._emit("fallback", self.record, error=self.record.last_error)


class SwapEngine:
    def __init__(
        self,
        model: torch.nn.Module,
        state_dir: str | Path,
        *,
        model_id: str = "model",
        shapes_provider: Callable[[str], Sequence[Shape]] | None = None,
        default_rows: Sequence[Sequence[int]] = ((1, 1), (1, 8)),
        max_parity_shapes: int = 4,
        before_commit: Callable[[SwapRecord], Mapping[str, Any] | None] | None = None,
        after_restore: Callable[[], None] | None = None,
        on_event: Callable[..., None] | None = None,
        seed: int = 1234,
        probe_forward: Callable[[], Any] | None = None,
    ):
        self.model = model
        self.model_id = model_id
        self.state_dir = Path(state_dir)
        self.swaps_dir = self.state_dir / "swaps"
        self.swaps_dir.mkdir(parents=True, exist_ok=True)
        self.manifest_path = self.swaps_dir / "manifest.json"
        self.shapes_provider = shapes_provider
        self.default_rows = [tuple(int(d) for d in r) for r in default_rows]
        self.max_parity_shapes = max_parity_shapes
        self.before_commit = before_commit
        self.after_restore = after_restore
        self.on_event = on_event
        self.seed = seed
        self._op_lock = threading.RLock()  # serializes swap / rollback / reapply
        self._state_lock = threading.Lock()  # short: guards the lists snapshots read
        self._history: list[SwapRecord] = []
        self._live: dict[str, _LiveSwap] = {}  # swap_id -> live swap (committed)
        self._owner: dict[str, str] = {}  # module name -> swap_id bound there
        self._originals: dict[str, Any] = {}  # module name -> pre-swap instance forward
        self._faults: deque[_LiveSwap] = deque()
        self._groups_cache: dict[str, list[ModuleGroup]] = {}
        self._staged: list[tuple[torch.nn.Module, Any]] | None = None
        self._modules = dict(model.named_modules())
        # Function-level binding (families with known_functions, e.g. rope's apply_rotary_pos_emb).
        self.probe_forward = probe_forward
        self._sites_cache: dict[str, list[FunctionSite]] = {}
        self._fn_owner: dict[str, str] = {}  # dotted global -> swap_id bound there
        self._fn_originals: dict[str, Any] = {}  # dotted global -> the function before any swap
        self._staged_functions: list[tuple[FunctionSite, Any]] | None = None
        self._load_manifest()

    # ------------------------------------------------------------------ public: queries
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

    def module_state(self) -> dict[str, str | None]:
        """Module name -> id of the swap bound there (None: original). For atomicity checks."""
        return {name: self._owner.get(name) for group in self._all_groups() for name in group.names}

    def groups(self, op: str) -> list[ModuleGroup]:
        if op not in self._groups_cache:
            self._groups_cache[op] = find_module_groups(self.model, [op])
        return self._groups_cache[op]

    def function_sites(self, op: str) -> list[FunctionSite]:
        """Module globals of the model's modeling files that compute `op` (families with known_functions)."""
        if op not in self._sites_cache:
            self._sites_cache[op] = find_function_sites(self.model, [op])
        return self._sites_cache[op]

    def function_state(self) -> dict[str, str | None]:
        """Dotted function global -> id of the swap bound there (None: original)."""
        return {site.dotted: self._fn_owner.get(site.dotted) for sites in self._sites_cache.values() for site in sites}

    def _all_groups(self) -> list[ModuleGroup]:
        out: list[ModuleGroup] = []
        for op in list(self._groups_cache):
            out.extend(self._groups_cache[op])
        return out

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
        _reapply_record: SwapRecord | None = None,
    ) -> SwapRecord:
        """Load, bind, check parity, commit. Raises a `SwapError` subclass when nothing changed.

        `param_shapes` restricts the swap to modules with those live parameter shapes (a profile
        target's `param_shapes`: one linear projection shape, e.g. {"weight": [2048, 1536], ...}).

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
            else:
                swap_id = swap_id or self._new_id()
                kept, origin, source_path = self._keep_file(swap_id, path, source)
                refused = admit(kept.read_bytes()) if admit is not None else None
                if refused:
                    kept.unlink(missing_ok=True)
                    raise SwapForbidden(refused)
            try:
                candidate = load_candidate(kept)
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
            wanted = sorted(p.name for p in family.params)
            bound = sorted(b["kernel_param"] for b in candidate.adapter)
            if bound != wanted:
                if _reapply_record is None:
                    kept.unlink(missing_ok=True)
                raise CandidateLoadError(
                    f"ADAPTER binds kernel parameters {bound}, but {family.name} entry takes {wanted}"
                )

            wanted_shapes = _shapes_dict(param_shapes)
            if _reapply_record is not None:
                wanted_shapes = _reapply_record.requested_param_shapes
            groups = self._select_groups(family, module_class, wanted_shapes)
            if not groups and family.known_functions:
                sites = [s for s in self.function_sites(family.name) if site_matches(s, family, module_class)]
                if sites:
                    return self._swap_functions(
                        family,
                        candidate,
                        sites,
                        swap_id,
                        kept,
                        origin,
                        source_path,
                        module_class,
                        live_shapes,
                        _reapply_record,
                    )
            record = SwapRecord(
                swap_id=swap_id,
                op=family.name,
                model=self.model_id,
                file=str(kept),
                digest=candidate.digest,
                requested_module_class=module_class,
                requested_param_shapes=wanted_shapes,
                adapter=candidate.adapter,
                origin=origin,
                source_path=source_path,
            )
            if _reapply_record is not None:
                record.created_at = _reapply_record.created_at
            if not groups:
                where = f" of class {module_class}" if module_class else ""
                where += f" with parameters {format_param_shapes(wanted_shapes)}" if wanted_shapes else ""
                reason = f"no module{where} of the served model computes {family.name}"
                self._finish_failed(record, reason, kept_file=_reapply_record is None)
                raise SwapRejected(reason, record)
            record.module_classes = [g.module_class for g in groups]
            record.module_class = ",".join(dict.fromkeys(g.module_class for g in groups))
            record.qualified_class = ",".join(dict.fromkeys(g.qualified_class for g in groups))
            targets = [(name, self._modules[name]) for g in groups for name in g.names]
            record.module_names = [n for n, _ in targets]
            record.modules = len(targets)
            missing = [
                (n, b["module_attr"]) for n, m in targets for b in candidate.adapter if not hasattr(m, b["module_attr"])
            ]
            if missing:
                name, attr = missing[0]
                reason = (
                    f"ADAPTER reads module attribute {attr!r}, which {type(self._modules[name]).__name__} "
                    f"({name or 'root'}) does not have"
                )
                self._finish_failed(record, reason, kept_file=_reapply_record is None)
                raise SwapRejected(reason, record)

            live = _LiveSwap(record, family, candidate, self)
            before = {name: module.__dict__.get("forward", _CLASS_FORWARD) for name, module in targets}
            hook_called = False
            try:
                rows_by_group = {g.key: self._parity_rows(g, live_shapes) for g in groups}
                record.parity = self._bind_and_check(live, targets, groups, rows_by_group)
                if self.before_commit is not None:
                    hook_called = True
                    self._staged = [(module, before[name]) for name, module in targets]
                    try:
                        extra = self.before_commit(record)
                    finally:
                        self._staged = None
                    if extra:
                        record.parity.update(dict(extra))
            except Exception as exc:  # noqa: BLE001 - any failure restores every module

                def restore() -> None:
                    for name, module in targets:
                        _set_forward(module, before[name])

                self._fail_parity(record, live, exc, restore, _reapply_record is None, hook_called)

            # Commit: ownership moves to this swap; older swaps lose the modules it took.
            live.strict = False
            now = time.time()
            with self._state_lock:
                for name, module in targets:
                    self._take_over(self._owner, self._originals, name, before[name], swap_id, now, "modules")
                    live.modules[name] = module
                self._mark_committed(record, live, _reapply_record, now)
            self._save_manifest()
            self._emit("committed", record)
            return record

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
                if swap_id not in self._live:
                    record = next((r for r in self._history if r.swap_id == swap_id), None)
                    if record is None:
                        raise UnknownSwapError(f"no swap with id {swap_id!r}")
                    raise NotActiveError(f"swap {swap_id} is not active (status {record.status})", record)
                ids = [swap_id]
            done: list[SwapRecord] = []
            now = time.time()
            with self._state_lock:
                for sid in reversed(ids):
                    live = self._live.pop(sid)
                    for name, module in live.modules.items():
                        _set_forward(module, self._originals.pop(name, _CLASS_FORWARD))
                        self._owner.pop(name, None)
                    for dotted, site in live.functions.items():
                        if self._fn_owner.get(dotted) == sid:
                            site.set(self._fn_originals.pop(dotted))
                            self._fn_owner.pop(dotted, None)
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
        staged_functions = self._staged_functions or []
        if not staged and not staged_functions:
            yield
            return
        current = [(module, module.__dict__.get("forward", _CLASS_FORWARD)) for module, _ in staged]
        current_functions = [(site, site.current()) for site, _ in staged_functions]
        try:
            for module, previous in staged:
                _set_forward(module, previous)
            for site, previous in staged_functions:
                site.set(previous)
            yield
        finally:
            for module, state in current:
                _set_forward(module, state)
            for site, state in current_functions:
                site.set(state)

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

    # ------------------------------------------------------------------ internals
    def _emit(self, kind: str, record: SwapRecord, **info: Any) -> None:
        if self.on_event is not None:
            try:
                self.on_event(kind, record, **info)
            except Exception:  # noqa: BLE001 - metrics must never break a swap
                pass

    def _queue_fault(self, live: _LiveSwap) -> None:
        self._faults.append(live)

    def _safe_after_restore(self) -> None:
        try:
            self.after_restore()  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - the forwards are restored; a failed re-capture is reported by the hook
            pass

    def _new_id(self) -> str:
        with self._state_lock:
            n = len(self._history) + 1
            existing = {r.swap_id for r in self._history}
        while True:
            sid = f"swap-{n:04d}-{secrets.token_hex(2)}"
            if sid not in existing and not (self.swaps_dir / f"{sid}.py").exists():
                return sid

    def _keep_file(self, swap_id: str, path: str | Path | None, source: str | None) -> tuple[Path, str, str | None]:
        if (path is None) == (source is None):
            raise CandidateLoadError("give exactly one of a candidate path or its source")
        kept = self.swaps_dir / f"{swap_id}.py"
        if source is not None:
            kept.write_text(source)
            return kept, "source", None
        assert path is not None  # exactly one of path and source (checked above)
        src = Path(path).expanduser()
        if not src.is_file():
            raise CandidateLoadError(f"candidate file {src} does not exist")
        try:
            shutil.copyfile(src, kept)
        except OSError as exc:
            raise CandidateLoadError(f"cannot copy candidate file {src}: {exc}") from exc
        return kept, "path", str(src.resolve())

    def _select_groups(
        self, family: OpFamily, module_class: str | None, param_shapes: dict[str, list[int] | None] | None = None
    ) -> list[ModuleGroup]:
        groups = self.groups(family.name)
        if module_class:
            groups = [g for g in groups if module_class in (g.module_class, g.qualified_class)]
        if param_shapes:
            groups = [g for g in groups if all(g.param_shapes.get(k, "?") == v for k, v in param_shapes.items())]
        return groups

    def _parity_rows(self, group: ModuleGroup, live_shapes) -> list[Shape]:
        """Leading dims ("rows") of the inputs to check: the live shapes' minus their last dim."""
        if isinstance(live_shapes, Mapping):
            chosen = (
                live_shapes.get(group.key)
                or live_shapes.get(group.qualified_class)
                or live_shapes.get(group.module_class)
                or []
            )
        elif live_shapes is not None:
            chosen = live_shapes
        elif self.shapes_provider is not None:
            chosen = self.shapes_provider(group.key)
        else:
            chosen = []
        rows: list[Shape] = []
        for s in chosen:
            t = tuple(int(d) for d in s)
            if len(t) >= 2 and all(d > 0 for d in t) and t[:-1] not in rows:
                rows.append(t[:-1])
        return rows[: self.max_parity_shapes] or list(self.default_rows)

    def _bind_and_check(self, live: _LiveSwap, targets, groups, rows_by_group) -> dict[str, Any]:
        family = live.family
        dtype, device = _param_dtype_device(self.model)
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
                    self._originals.get(name, _CLASS_FORWARD)
                    if name in self._owner
                    else module.__dict__.get("forward", _CLASS_FORWARD)
                )
                _set_forward(module, original)
                wants = []
                for k, rows in enumerate(rows_by_group[group_of[name].key]):
                    gen = torch.Generator().manual_seed(self.seed + 7919 * k + index)
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

    # -- function-level swaps ------------------------------------------------------------------------
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
        before = {s.dotted: s.current() for s in sites}
        hook_called = False
        try:
            record.parity = self._bind_functions_and_check(live, sites, live_shapes)
            if self.before_commit is not None:
                hook_called = True
                self._staged_functions = [(s, before[s.dotted]) for s in sites]
                try:
                    extra = self.before_commit(record)
                finally:
                    self._staged_functions = None
                if extra:
                    record.parity.update(dict(extra))
        except Exception as exc:  # noqa: BLE001 - any failure restores every function

            def restore() -> None:
                for site in sites:
                    site.set(before[site.dotted])

            self._fail_parity(record, live, exc, restore, reapply_record is None, hook_called)

        live.strict = False
        now = time.time()
        with self._state_lock:
            for site in sites:
                self._take_over(
                    self._fn_owner, self._fn_originals, site.dotted, before[site.dotted], swap_id, now, "functions"
                )
                live.functions[site.dotted] = site
            self._mark_committed(record, live, reapply_record, now)
        self._save_manifest()
        self._emit("committed", record)
        return record

    def _take_over(
        self,
        owners: dict[str, str],
        originals: dict[str, Any],
        key: str,
        original: Any,
        swap_id: str,
        now: float,
        kind: str,
    ) -> None:
        """Give `key` (a module name or a function's dotted path) to `swap_id`; an older swap that
        loses its last binding is superseded. Caller holds _state_lock."""
        previous = owners.get(key)
        if previous is None:
            originals[key] = original
        elif previous != swap_id and previous in self._live:
            old = self._live[previous]
            getattr(old, kind).pop(key, None)
            if not old.modules and not old.functions:
                old.record.status = "superseded"
                old.record.superseded_by = swap_id
                old.record.rolled_back_at = now
                self._live.pop(previous, None)
        owners[key] = swap_id

    def _mark_committed(self, record: SwapRecord, live: Any, reapply_record: SwapRecord | None, now: float) -> None:
        """Record a commit (a re-applied swap keeps its history entry and counters). Caller holds _state_lock."""
        record.status = "committed"
        record.reason = None
        if reapply_record is not None:
            record.committed_at = reapply_record.committed_at or now
            record.reapplied_at = now
            record.calls, record.fallbacks = reapply_record.calls, reapply_record.fallbacks
            self._history = [record if r.swap_id == record.swap_id else r for r in self._history]
        else:
            record.committed_at = now
            self._history.append(record)
        self._live[record.swap_id] = live

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
        dtype, device = _param_dtype_device(self.model)
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

    def _fail_parity(
        self,
        record: SwapRecord,
        live: _LiveSwap,
        exc: BaseException,
        restore: Callable[[], None],
        kept_file: bool,
        hook_called: bool,
    ) -> NoReturn:
        """A swap that failed between binding and commit: put every original back, record why,
        let the engine re-capture (if it was told about the binding), raise ParityError."""
        live.faulted = True
        restore()
        reason = exc.reason if isinstance(exc, SwapError) else f"{type(exc).__name__}: {exc}"
        self._finish_failed(record, reason, kept_file=kept_file, parity_failed=True)
        if hook_called and self.after_restore is not None:
            self._safe_after_restore()
        raise ParityError(reason, record) from exc

    def _finish_failed(self, record: SwapRecord, reason: str, *, kept_file: bool, parity_failed: bool = False) -> None:
        record.status = "rolled_back"
        record.reason = reason
        record.rolled_back_at = time.time()
        if kept_file:
            with self._state_lock:
                self._history.append(record)
            self._save_manifest()
        if parity_failed:
            self._emit("parity_failed", record, reason=reason)

    # -- manifest ---------------------------------------------------------------------------------
    def _load_manifest(self) -> None:
        if not self.manifest_path.exists():
            return
        try:
            data = json.loads(self.manifest_path.read_text())
        except (OSError, json.JSONDecodeError):
            broken = self.manifest_path.with_suffix(f".broken-{int(time.time())}.json")
            shutil.copyfile(self.manifest_path, broken)
            return
        records = [SwapRecord.from_dict(d) for d in data.get("swaps", []) if isinstance(d, dict)]
        with self._state_lock:
            self._history = records

    def _save_manifest(self) -> None:
        with self._state_lock:
            if len(self._history) > HISTORY_LIMIT:
                keep_ids = set(self._live)
                extra = len(self._history) - HISTORY_LIMIT
                pruned = []
                for r in self._history:
                    if extra and r.swap_id not in keep_ids and r.status != "committed":
                        pruned.append(r)
                        extra -= 1
                for r in pruned:
                    self._history.remove(r)
                    Path(r.file).unlink(missing_ok=True)
            data = {
                "version": MANIFEST_VERSION,
                "updated_at": time.time(),
                "swaps": [r.to_dict() for r in self._history],
            }
        tmp = self.manifest_path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.manifest_path)


# ---------------------------------------------------------------------- binding helpers
def _shapes_dict(param_shapes: Mapping[str, Sequence[int] | None] | None) -> dict[str, list[int] | None] | None:
    """A JSON-able copy of requested parameter shapes ({} and None: no restriction)."""
    if not param_shapes:
        return None
    return {str(k): None if v is None else [int(d) for d in v] for k, v in param_shapes.items()}


def _param_dtype_device(model: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype, p.device
    return torch.float32, torch.device("cpu")


def _set_forward(module: torch.nn.Module, state: Any) -> None:
    """Put back an instance-level forward state captured with `module.__dict__.get('forward', ...)`."""
    if state is _CLASS_FORWARD:
        module.__dict__.pop("forward", None)
    else:
        module.__dict__["forward"] = state


def _original_callable(module: torch.nn.Module, original: Any) -> Callable[..., Any]:
    if original is _CLASS_FORWARD:
        return types.MethodType(type(module).forward, module)
    return original


def _bind(module: torch.nn.Module, live: _LiveSwap, original: Any) -> None:
    """Bind the candidate as `module.forward`, guarded: a raising kernel falls back to `original`."""
    kernel_forward = live.family.replacement_forward(module, live.candidate.entry, live.candidate.adapter)
    fallback = _original_callable(module, original)
    record = live.record

    def forward(self, *args, **kwargs):
        if live.faulted:
            record.fallbacks += 1
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


# ---------------------------------------------------------------------- function-level binding
# Families that no module computes (rope: attention modules call the module-level function
# `apply_rotary_pos_emb` of their modeling file) declare `known_functions`. A function site is one
# python module's global of that name, used by the live model's modules and checked numerically
# against the family reference; a swap replaces the global with a guarded wrapper around `entry`.
# The calling convention implemented here is rope's: `fn(q, k, cos, sin[, position_ids], unsqueeze_dim=1)`.


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


def probe_model_forward(model: torch.nn.Module, tokens: int = 8) -> Callable[[], Any] | None:
    """A forward of a causal LM on a fixed probe prompt (no cache), or None for other models."""
    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 2:
        return None
    _, device = _param_dtype_device(model)
    ids = torch.tensor([[(13 * i + 1) % vocab for i in range(tokens)]], device=device)

    def run():
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False)

    return run


def perturbed_scalars(
    module: torch.nn.Module, adapter: Sequence[Mapping[str, str]], generator: torch.Generator
) -> dict[str, float]:
    """A value far from the live one for every float attribute the ADAPTER binds. Small ones (eps)
    move by 0.5 to 2, comparable to the probe rows' mean square, so ignoring them shows in any dtype;
    others scale by 0.5x to 2x (never exactly 1x)."""
    out: dict[str, float] = {}
    for binding in adapter:
        value = getattr(module, binding["module_attr"], None)
        if isinstance(value, float) and not isinstance(value, bool):
            u = float(torch.rand((), generator=generator))
            out[binding["module_attr"]] = (
                value + 0.5 + 1.5 * u
                if abs(value) < 0.01
                else value * (0.5 + 0.4 * u if u < 0.5 else 1.25 + 1.5 * (u - 0.5))
            )
    return out


@contextlib.contextmanager
def attributes_set(module: torch.nn.Module, values: Mapping[str, Any]):
    """Set module attributes for the duration of a check, restoring the live values after."""
    saved = {name: getattr(module, name) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def compare_outputs(
    where: str, got: tuple, want: tuple, shape: tuple, atol: float, rtol: float, dtype: torch.dtype
) -> tuple[float, float]:
    """Parity of a kernel's outputs with the original's: same count, tensors, shapes and dtypes,
    no new non-finite values, within (atol, rtol). Returns (max abs err, max rel err)."""
    if len(got) != len(want):
        raise ParityError(f"{where}: the kernel returned {len(got)} outputs, the original {len(want)}")
    max_abs = max_rel = 0.0
    for g, w in zip(got, want):
        if not isinstance(g, torch.Tensor):
            raise ParityError(f"{where}: the kernel returned {type(g).__name__}, not a tensor")
        if g.shape != w.shape or g.dtype != w.dtype:
            raise ParityError(
                f"{where}: kernel output {tuple(g.shape)} {g.dtype} differs from the original's "
                f"{tuple(w.shape)} {w.dtype} at input shape {list(shape)}"
            )
        gd, wd = g.double(), w.double()
        if not torch.isfinite(gd).all() and torch.isfinite(wd).all():
            raise ParityError(f"{where}: the kernel produced non-finite values at input shape {list(shape)}")
        diff = (gd - wd).abs()
        abs_err = float(diff.max()) if diff.numel() else 0.0
        rel_err = float((diff / wd.abs().clamp_min(atol)).max()) if diff.numel() else 0.0
        max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
        if not torch.allclose(gd, wd, atol=atol, rtol=rtol):
            raise ParityError(
                f"parity failed on {where} at input shape {list(shape)}: max abs err {abs_err:.3g} "
                f"(atol {atol:g}, rtol {rtol:g}, {str(dtype).replace('torch.', '')})"
            )
    return max_abs, max_rel


__all__ = [
    "CandidateLoadError",
    "FunctionSite",
    "NotActiveError",
    "ParityError",
    "SwapEngine",
    "SwapError",
    "SwapRecord",
    "SwapRejected",
    "UnknownSwapError",
    "find_function_sites",
    "function_computes",
    "swapped_function_id",
    "swapped_id",
]
