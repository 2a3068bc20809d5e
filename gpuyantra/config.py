"""Settings read from the environment, in one place, with the defaults of a single machine."""

from __future__ import annotations

import os
import re
from pathlib import Path

CONTROL_TASK_QUEUE = "gpuyantra-control"
GPU_TASK_QUEUE = "gpuyantra-gpu"
CPU_TASK_QUEUE = "gpuyantra-cpu"


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
