"""Swap records, the errors a swap or rollback raises, and the manifest that keeps them on disk.

Manifest: `<state_dir>/swaps/manifest.json` holds every record (history, with status); an unreadable
one is kept aside as `manifest.broken-<time>.json` and the history starts empty.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Container, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuyantra.files import write_whole

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
    # Row counts served by the kernel and by the original forward ({"kernel": [...], "original": [...]},
    # from the verdict's timings; None: the kernel serves every call), and calls the gate gave the original.
    rows_gate: dict[str, list[int]] | None = None
    original_calls: int = 0
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


def shapes_dict(param_shapes: Mapping[str, Sequence[int] | None] | None) -> dict[str, list[int] | None] | None:
    """A JSON-able copy of requested parameter shapes ({} and None: no restriction)."""
    if not param_shapes:
        return None
    return {str(k): None if v is None else [int(d) for d in v] for k, v in param_shapes.items()}


def gate_dict(gate: Mapping[str, Sequence[int]] | None) -> dict[str, list[int]] | None:
    """A JSON-able rows gate ({"kernel": rows, "original": rows}); None when it sends no row count to the original."""
    if not gate or not gate.get("original"):
        return None
    return {side: sorted({int(r) for r in gate.get(side) or []}) for side in ("kernel", "original")}


# ---------------------------------------------------------------------- manifest
def read_manifest(path: Path) -> list[SwapRecord] | None:
    """The records of the manifest at `path`; None when there is none or it cannot be read."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        broken = path.with_suffix(f".broken-{int(time.time())}.json")
        shutil.copyfile(path, broken)
        return None
    return [SwapRecord.from_dict(d) for d in data.get("swaps", []) if isinstance(d, dict)]


def prune_history(history: list[SwapRecord], keep_ids: Container[str]) -> None:
    """Past HISTORY_LIMIT records, drop the oldest that are neither live (`keep_ids`) nor committed,
    with their kept candidate files (in place)."""
    if len(history) > HISTORY_LIMIT:
        extra = len(history) - HISTORY_LIMIT
        pruned = []
        for r in history:
            if extra and r.swap_id not in keep_ids and r.status != "committed":
                pruned.append(r)
                extra -= 1
        for r in pruned:
            history.remove(r)
            Path(r.file).unlink(missing_ok=True)


def manifest_data(history: list[SwapRecord]) -> dict[str, Any]:
    return {
        "version": MANIFEST_VERSION,
        "updated_at": time.time(),
        "swaps": [r.to_dict() for r in history],
    }


def write_manifest(path: Path, data: Mapping[str, Any]) -> None:
    """Replace the manifest atomically (`write_whole`)."""
    write_whole(path, json.dumps(data, indent=1))
