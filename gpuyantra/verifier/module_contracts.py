"""The module class's part of the contract, kept in the state folder between processes.

Checking a binding against its module class imports the class (for a transformers class, the model
library: seconds of a GPU host's CPU, most of a warm `gpuyantra verify`'s time) and builds tiny
instances. What it finds depends only on the class's code, the family's definition, the ADAPTER's
bindings, torch's version and the verifier's own contract code, so a passing result is kept under a
key made of those, read without importing the class:

- the class's module file and its top-level package's `__init__.py`, found without importing them,
  by size and modification time, and the installed distribution's version when the top-level
  package has one (an upgrade or an edit of the class's file is a new key);
- the files of the contract code and of the family's module, the same way;
- torch's version.

A class whose file cannot be found that way (a namespace package, a module built at import time) is
checked every time. Failing results are never kept: they are cheap to find again, and a missing
package may be installed next.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import torch

from gpuyantra.verifier.baselines import read_state, updating_state

CONTRACTS_FILE = "module_contracts.json"
# Bumped when what a kept contract holds changes.
CONTRACT_FORMAT = 1
# Beyond this many entries the oldest are dropped (a worker checks many classes over weeks).
MAX_ENTRIES = 512


def _stamp(path: Path) -> str | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def _module_file(module_name: str) -> Path | None:
    """Where `module_name`'s source lies, found without importing anything (a top-level name's spec
    comes from the import system's finders, editable installs' included, without running it)."""
    top, *rest = module_name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    path = Path(spec.origin)
    if not rest:
        return path
    base = path.parent.joinpath(*rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _distribution_version(top: str) -> str:
    try:
        return importlib.metadata.version(top)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return ""


def _code_stamps(family_module: str) -> list[str] | None:
    """The verifier's contract code and the family's definition, as files on disk."""
    names = ("gpuyantra.verifier.contract", "gpuyantra.verifier.module_contracts", "gpuyantra.ops.meta", family_module)
    stamps = []
    for name in names:
        file = getattr(importlib.import_module(name), "__file__", None)  # the project's own: cheap
        stamp = _stamp(Path(file)) if file else None
        if stamp is None:
            return None
        stamps.append(stamp)
    return stamps


def contract_key(dotted: str, family_name: str, family_module: str, adapter: list[dict[str, str]]) -> str | None:
    """The key of a module class's contract, or None when its files cannot be found without importing."""
    module_name, _, _ = dotted.rpartition(".")
    if not module_name:
        return None
    top = module_name.split(".")[0]
    module_file = _module_file(module_name)
    top_file = _module_file(top)
    code = _code_stamps(family_module)
    if module_file is None or top_file is None or code is None:
        return None
    parts = [
        dotted,
        family_name,
        json.dumps(adapter, sort_keys=True),
        _stamp(module_file),
        _stamp(top_file),
        f"{top} {_distribution_version(top)}",
        f"torch {torch.__version__}",
        *code,
        f"v{CONTRACT_FORMAT}",
    ]
    if None in parts:
        return None
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()


def kept_param_specs(key: str | None) -> list[dict[str, Any]] | None:
    """The parameter specs a passing check of this key found, or None when none is kept."""
    if key is None:
        return None
    entry = read_state(CONTRACTS_FILE).get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("param_specs"), list):
        return None
    return entry["param_specs"]


def keep_param_specs(key: str | None, dotted: str, param_specs: list[dict[str, Any]]) -> None:
    if key is None:
        return
    with updating_state(CONTRACTS_FILE) as data:
        data[key] = {"module_class": dotted, "param_specs": param_specs, "kept_at": time.time()}
        by_age = sorted(data, key=lambda k: data[k].get("kept_at", 0) if isinstance(data[k], dict) else 0)
        for old in by_age[: max(0, len(data) - MAX_ENTRIES)]:
            del data[old]
