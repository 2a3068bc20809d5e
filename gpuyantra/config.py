"""Settings read from the environment, in one place, with the defaults of a single machine."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

CONTROL_TASK_QUEUE = "gpuyantra-control"
GPU_TASK_QUEUE = "gpuyantra-gpu"
CPU_TASK_QUEUE = "gpuyantra-cpu"


# Verification is timed, so it runs on the hardware it is judged for: every GPU worker polls its
# kind's queue and its own device's queue besides the shared GPU queue (where work that only needs
# to reach a server, and campaigns started before routing, still go). docs/usage.md, "Adding a machine".
def gpu_kind_queue(kind: str) -> str:
    """`gpuyantra-gpu-nvidia-h100-80gb`: polled by every GPU worker of that hardware kind."""
    return f"{GPU_TASK_QUEUE}-{kind}"


def gpu_device_queue(kind: str, device_key: str) -> str:
    """`gpuyantra-gpu-nvidia-h100-80gb@GPU-5c1f...`: polled by the one worker of that device."""
    return f"{gpu_kind_queue(kind)}@{device_key}"


def default_state_dir() -> Path:
    """`$XDG_DATA_HOME/gpuyantra` (`~/.local/share/gpuyantra`): the same folder from any working
    directory, so `skills list` run elsewhere finds the library the workers wrote."""
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "gpuyantra"


def state_dir() -> Path:
    """Folder for everything gpuyantra persists: Temporal SQLite, Qdrant folder, candidates, manifests,
    keys. Resolved one way everywhere: `--state-dir` (every command that touches state sets the
    variable from it), else `$GPUYANTRA_STATE_DIR`, else `default_state_dir()`."""
    path = Path(os.environ.get("GPUYANTRA_STATE_DIR") or default_state_dir()).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def temporal_address() -> str:
    return os.environ.get("TEMPORAL_ADDRESS", "localhost:7233")


def admin_token() -> str | None:
    return os.environ.get("GPUYANTRA_ADMIN_TOKEN") or None


def qdrant_url() -> str | None:
    return os.environ.get("GPUYANTRA_QDRANT_URL") or None


def qdrant_path() -> Path:
    return Path(os.environ.get("GPUYANTRA_QDRANT_PATH", str(state_dir() / "qdrant"))).resolve()


def candidates_dir() -> Path:
    path = state_dir() / "candidates"
    path.mkdir(parents=True, exist_ok=True)
    return path


# Custom search attributes a campaign sets as it learns them, so `temporal workflow list --query
# 'GpuyantraModel="tiny-qwen2"'` finds it. `gpuyantra up`/`demo` register them on the dev servers
# they start (`--search-attribute Name=Type`); a campaign sets only those its server has registered.
SEARCH_ATTRIBUTES = {
    "GpuyantraModel": "Keyword",
    "GpuyantraOps": "KeywordList",
    "GpuyantraHardware": "Keyword",
    "GpuyantraDeployed": "Int",
    "GpuyantraBestSpeedup": "Double",
}


def indexed_value_type(kind: str) -> str:
    """The API's name of a SEARCH_ATTRIBUTES type: "KeywordList" -> "INDEXED_VALUE_TYPE_KEYWORD_LIST"."""
    return "INDEXED_VALUE_TYPE_" + re.sub(r"(?<!^)(?=[A-Z])", "_", kind).upper()


def search_attribute_args() -> list[str]:
    """`temporal server start-dev` arguments that register SEARCH_ATTRIBUTES."""
    return [arg for name, kind in SEARCH_ATTRIBUTES.items() for arg in ("--search-attribute", f"{name}={kind}")]


def reports_dir() -> Path:
    """Where `optimize --wait` and `report` write campaign reports (HTML) and results (JSON)."""
    path = state_dir() / "reports"
    path.mkdir(parents=True, exist_ok=True)
    return path


def temporal_namespace() -> str:
    return os.environ.get("TEMPORAL_NAMESPACE") or "default"


def server_url() -> str:
    """The serving process the CLI talks to when no --server is given."""
    return os.environ.get("GPUYANTRA_SERVER_URL") or "http://127.0.0.1:8000"


def admin_token_file() -> Path:
    """Where `up` and `demo` keep the admin token they made (owner-only)."""
    return state_dir() / "admin-token"


def find_admin_token(flag: str | None = None) -> str | None:
    """The admin token as `up` resolves it, without making one: the flag, else
    `$GPUYANTRA_ADMIN_TOKEN`, else the one kept in `<state>/admin-token`, else None."""
    return flag or admin_token() or _kept_admin_token()


def _kept_admin_token() -> str | None:
    kept = admin_token_file()
    try:
        return (kept.read_text().strip() or None) if kept.is_file() else None
    except OSError:
        return None


# How long a thread may hold the interpreter lock while another waits for it. A worker's
# verifications (static layer, job preparation, reading and judging outputs) and its Temporal event
# loop share one lock; at Python's 5 ms, threads whose demand fills the lock hold the loop off for
# tens of milliseconds per wake-up. Six workflows of a 1 s activity, six threads filling the lock in
# the worker, client apart (2-core machine, docs/perf/2026-12-04-cpu-round-trips.md): 0.58-1.01 s
# of round trips beyond the activity at 5 ms, 0.18-0.31 s at 1 ms; alike when the lock is idle part
# of the time.
SWITCH_INTERVAL_ENV = "GPUYANTRA_SWITCH_INTERVAL_MS"
DEFAULT_SWITCH_INTERVAL_MS = 1.0


def switch_interval_s() -> float:
    """A worker's interpreter switch interval in seconds (`GPUYANTRA_SWITCH_INTERVAL_MS`); a
    ValueError naming the variable when it is not a positive number."""
    raw = os.environ.get(SWITCH_INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_SWITCH_INTERVAL_MS / 1000
    try:
        milliseconds = float(raw)
    except ValueError:
        raise ValueError(f"{SWITCH_INTERVAL_ENV}={raw!r} is not a number of milliseconds") from None
    if not (math.isfinite(milliseconds) and milliseconds > 0):
        raise ValueError(f"{SWITCH_INTERVAL_ENV}={raw!r} must be a positive number of milliseconds")
    return milliseconds / 1000
