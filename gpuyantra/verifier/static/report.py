"""What the static layer hands on: the failures it found, and the contract literals (OP, ADAPTER)
and entry's signature, read from the AST without running anything, for the contract layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuyantra.verifier.verdict import Failure

LAYER = "static"


@dataclass
class EntryInfo:
    lineno: int
    positional: list[str]
    kwonly: list[str]
    kwonly_required: list[str]
    vararg: bool
    kwarg: bool
    is_async: bool
    definitions: int


@dataclass
class StaticReport:
    failures: list[Failure] = field(default_factory=list)
    op: str | None = None
    op_error: str | None = None
    adapter: Any = None
    adapter_error: str | None = None
    entry: EntryInfo | None = None
    kernels: list[str] = field(default_factory=list)
    # Library primitives the candidate calls (dotted paths, e.g. torch.nn.functional.conv2d).
    library_calls: list[str] = field(default_factory=list)
    parsed: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures
