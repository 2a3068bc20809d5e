"""Load a candidate kernel file (docs/CONTRACTS.md section 1) from a real `.py` file on disk.

Never `exec` a string: `@triton.jit` reads its own source with `inspect`, so the module must come
from a file that stays on disk for as long as the kernel may be re-specialized.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any


class CandidateError(ValueError):
    """The candidate file cannot be read or does not follow the contract."""


@dataclass(frozen=True)
class Candidate:
    path: Path
    op: str
    adapter: list[dict[str, str]]
    entry: Callable[..., Any]
    module: ModuleType
    digest: str


def read_source(path: str | Path) -> str:
    """The file's text, decoded as UTF-8 with no newline translation: `text.encode()` gives back
    exactly the bytes on disk, so a digest of the text is a digest of the file."""
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CandidateError(f"cannot read candidate file {path}: {exc}") from exc


def read_op(source: str) -> str | None:
    """The string literal assigned to OP at module level, read without running anything."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "OP" for t in stmt.targets)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            return stmt.value.value
    return None


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def validate_adapter(adapter: Any) -> list[dict[str, str]]:
    if not isinstance(adapter, list) or not all(
        isinstance(b, dict)
        and set(b) == {"kernel_param", "module_attr"}
        and isinstance(b["kernel_param"], str)
        and b["kernel_param"].isidentifier()
        and isinstance(b["module_attr"], str)
        and all(part.isidentifier() for part in b["module_attr"].split("."))
        for b in adapter
    ):
        raise CandidateError(
            "ADAPTER must be a list of {'kernel_param': identifier, 'module_attr': dotted attribute path} entries"
        )
    return [dict(b) for b in adapter]


def import_file(path: Path, module_name: str) -> ModuleType:
    """Import a real `.py` file as `module_name`. It is registered in sys.modules before it runs so
    triton's inspect-based source lookup resolves while `@triton.jit` decorators run; a file that
    fails to import is unregistered again."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def load_candidate(path: str | Path) -> Candidate:
    """Import the file as a uniquely named module and check OP, ADAPTER and entry exist."""
    path = Path(path).resolve()
    source = read_source(path)
    digest = source_digest(source)
    try:
        module = import_file(path, f"gpuyantra_candidate_{path.stem}_{digest}")
    except ImportError as exc:
        raise CandidateError(f"cannot import candidate file {path}") from exc
    except Exception as exc:
        raise CandidateError(f"importing {path.name} failed: {type(exc).__name__}: {exc}") from exc
    op = getattr(module, "OP", None)
    entry = getattr(module, "entry", None)
    if not isinstance(op, str):
        raise CandidateError(f"{path.name} defines no string OP")
    if not callable(entry):
        raise CandidateError(f"{path.name} defines no callable entry")
    adapter = validate_adapter(getattr(module, "ADAPTER", None))
    return Candidate(path=path, op=op, adapter=adapter, entry=entry, module=module, digest=digest)
