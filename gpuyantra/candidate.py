"""Load a candidate kernel file (docs/CONTRACTS.md section 1) from a real `.py` file on disk.

The module is compiled from the exact bytes that were read (and hashed, checked or attested), decoded
as strict UTF-8, never from the path again: Python's own import would honour a coding declaration
(`# -*- coding: raw_unicode_escape -*-` turns `\\u000a` into a newline) and could read a file changed
since. `@triton.jit` reads its kernels' source with `inspect`: the file's path stays the module's
`__file__` and `linecache` is pinned to the same text, so Triton sees what the checker saw.
"""

from __future__ import annotations

import ast
import codecs
import hashlib
import importlib.abc
import importlib.util
import io
import linecache
import re
import sys
import tokenize
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


# C0 control characters Python's tokenizer treats specially or that no honest source holds: NUL, form
# feed (resets indentation), vertical tab, a carriage return that does not end a line (a line break to
# the tokenizer, none to a line-based reader), escape sequences. Tab, LF and CRLF are allowed.
_SPECIAL_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]|\r(?!\n)")


def encoding_problem(data: bytes) -> str | None:
    """Why Python could read `data` differently from strict UTF-8 (None: it cannot): a byte-order
    mark, a coding declaration of another encoding (any spelling Python accepts), an invalid one, or
    control characters the tokenizer treats specially."""
    if data.startswith(codecs.BOM_UTF8):
        return "the file starts with a byte-order mark: save it as plain UTF-8"
    try:
        declared, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        return f"invalid coding declaration: {exc}"
    if codecs.lookup(declared).name != "utf-8":
        return f"coding declaration {declared!r}: Python would decode the file differently from the checker (UTF-8)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8: {exc}"
    special = _SPECIAL_CONTROL.search(text)
    if special is not None:
        line = text.count("\n", 0, special.start()) + 1
        return f"line {line}: control character {special.group()[0]!r} that Python's tokenizer treats specially"
    return None


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
        # an index of nn.Sequential / nn.ModuleList ("layers.0.weight") is a path part too
        and all(part.isidentifier() or part.isdigit() for part in b["module_attr"].split("."))
        for b in adapter
    ):
        raise CandidateError(
            "ADAPTER must be a list of {'kernel_param': identifier, 'module_attr': dotted attribute path} entries"
        )
    return [dict(b) for b in adapter]


class _TextLoader(importlib.abc.Loader):
    """Runs a module from the text it was given (never re-reading the path, never a bytecode cache)."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.text = text

    def exec_module(self, module: ModuleType) -> None:
        # A str source: compile ignores any coding declaration; `dont_inherit` keeps our future flags out.
        code = compile(self.text, str(self.path), "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102 - the checked candidate, in the process meant to run it

    def get_source(self, fullname: str) -> str:
        return self.text


def _pin_source(path: Path, text: str) -> None:
    """`inspect.getsource` (Triton's kernel source) reads `text`: a linecache entry without an mtime
    is never checked against the file again."""
    pieces = text.replace("\r\n", "\n").split("\n")  # as a text file reads: CRLF and LF end lines
    lines = [piece + "\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    linecache.cache[str(path)] = (len(text), None, lines, str(path))


def import_file(path: Path, module_name: str, text: str | None = None) -> ModuleType:
    """Import a real `.py` file as `module_name`, compiled from `text` (default: the file read once,
    strict UTF-8). It is registered in sys.modules before it runs so triton's inspect-based source
    lookup resolves while `@triton.jit` decorators run; a file that fails to import is unregistered
    again."""
    if text is None:
        text = read_source(path)
    _pin_source(path, text)
    spec = importlib.util.spec_from_file_location(module_name, path, loader=_TextLoader(path, text))
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


def load_candidate(path: str | Path, data: bytes | None = None) -> Candidate:
    """Import the file as a uniquely named module and check OP, ADAPTER and entry exist. `data`: the
    file's bytes as already read (hashed, attested); the module is compiled from them, never from
    whatever the path holds later. Bytes Python would read differently from UTF-8 are refused."""
    path = Path(path).resolve()
    if data is None:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CandidateError(f"cannot read candidate file {path}: {exc}") from exc
    problem = encoding_problem(data)
    if problem:
        raise CandidateError(f"{path.name}: {problem}")
    source = data.decode("utf-8")
    digest = source_digest(source)
    try:
        module = import_file(path, f"gpuyantra_candidate_{path.stem}_{digest}", source)
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
