"""The swap engine's state and the steps every swap shares: keep the candidate file, then
bind -> check -> before_commit -> commit (or restore everything), and the manifest.

`SwapCore._bind_check_commit` is that skeleton, written once for both kinds of binding. The kinds
are strategies (`Binder`: `gpuyantra.swap.modules.ModuleBinder` binds module forwards,
`gpuyantra.swap.functions.FunctionBinder` module globals), each given the core it binds into; the
core imports neither, and `gpuyantra.swap.guards` imports nothing of the core.
"""

from __future__ import annotations

import secrets
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

import torch

from gpuyantra.candidate import Candidate
from gpuyantra.ops import OpFamily
from gpuyantra.swap.guards import FUNCTION_GLOBALS, BindingKind, _LiveSwap
from gpuyantra.swap.records import (
    CandidateLoadError,
    ParityError,
    Shape,
    SwapError,
    SwapRecord,
    manifest_data,
    prune_history,
    read_manifest,
    write_manifest,
)


@dataclass(frozen=True)
class BindRequest:
    """One swap as a binder sees it: the candidate loaded, its kept file and where it came from,
    and what the caller restricted it to."""

    family: OpFamily
    candidate: Candidate
    swap_id: str
    kept: Path
    origin: str  # "source", "path" or "manifest" (re-applied)
    source_path: str | None
    module_class: str | None
    live_shapes: Any  # shapes to check at: a list, or a mapping by group key / class / function
    reapply_record: SwapRecord | None = None  # the manifest's record when re-applying
    param_shapes: dict[str, list[int] | None] | None = None
    rows_gate: dict[str, list[int]] | None = None


class Binder(Protocol):
    """One kind of binding (a strategy of the swap engine)."""

    kind: BindingKind

    def targets(self, request: BindRequest) -> list[Any]:
        """What this binder would bind for the request (empty: none of its kind computes the op)."""
        ...

    def bind(self, request: BindRequest, targets: list[Any]) -> SwapRecord:
        """Bind every target, check parity, commit; on any failure restore all, raise a SwapError."""
        ...

    def state(self) -> dict[str, str | None]:
        """Bound key (module name, dotted global) -> id of the swap bound there (None: original)."""
        ...

    def restore(self, live: _LiveSwap) -> None:
        """Put back what `live` replaced where it is still bound (a rollback; caller holds the state lock)."""
        ...

    def suspendable(self, live: _LiveSwap) -> list[tuple[BindingKind, Any, Any]]:
        """(kind, bound object, the state a rollback would put back) for each object `live` holds."""
        ...


class SwapCore:
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
        self._modules = dict(model.named_modules())
        # Function-level binding (families with known_functions, e.g. rope's apply_rotary_pos_emb).
        self.probe_forward = probe_forward
        self._fn_owner: dict[str, str] = {}  # dotted global -> swap_id bound there
        self._fn_originals: dict[str, Any] = {}  # dotted global -> the function before any swap
        # Inside before_commit: (kind, bound object, the state it replaced) of the swap being committed.
        self._staged: list[tuple[BindingKind, Any, Any]] | None = None
        self._load_manifest()

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
            try:
                kept.write_bytes(source.encode())  # the client's text as UTF-8, whatever the locale
            except UnicodeEncodeError as exc:
                raise CandidateLoadError(f"the source is not valid text: {exc}") from exc
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

    # -- bind -> check -> commit ------------------------------------------------------------------
    def _bind_check_commit(
        self,
        record: SwapRecord,
        live: _LiveSwap,
        kind: BindingKind,
        items: Sequence[tuple[str, Any]],
        check: Callable[[], dict[str, Any]],
        reapply_record: SwapRecord | None,
    ) -> SwapRecord:
        """Bind and check parity (`check`, which binds every item), run `before_commit` with the
        replaced states staged, then commit: ownership of every item moves to this swap. If anything
        fails or raises, every item gets back exactly the state it had before (ParityError)."""
        before = {key: kind.get(obj) for key, obj in items}
        hook_called = False
        try:
            record.parity = check()
            if self.before_commit is not None:
                hook_called = True
                self._staged = [(kind, obj, before[key]) for key, obj in items]
                try:
                    extra = self.before_commit(record)
                finally:
                    self._staged = None
                if extra:
                    record.parity.update(dict(extra))
        except Exception as exc:  # noqa: BLE001 - any failure restores every module / function

            def restore() -> None:
                for key, obj in items:
                    kind.put(obj, before[key])

            self._fail_parity(record, live, exc, restore, reapply_record is None, hook_called)

        # Commit: ownership moves to this swap; older swaps lose what it took.
        live.strict = False
        now = time.time()
        owners, originals = (
            (self._fn_owner, self._fn_originals) if kind is FUNCTION_GLOBALS else (self._owner, self._originals)
        )
        with self._state_lock:
            for key, obj in items:
                self._take_over(owners, originals, key, before[key], record.swap_id, now, kind.name)
                getattr(live, kind.name)[key] = obj
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
            record.original_calls = reapply_record.original_calls
            self._history = [record if r.swap_id == record.swap_id else r for r in self._history]
        else:
            record.committed_at = now
            self._history.append(record)
        self._live[record.swap_id] = live

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
        records = read_manifest(self.manifest_path)
        if records is None:
            return
        with self._state_lock:
            self._history = records

    def _save_manifest(self) -> None:
        with self._state_lock:
            prune_history(self._history, self._live)
            data = manifest_data(self._history)
        write_manifest(self.manifest_path, data)
