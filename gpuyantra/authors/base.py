"""The author interface: a write request in, a candidate file's source out.

Types only, importing no author: the authors import this module, and choosing one
(`gpuyantra.authors.select.get_author`) imports them, so nothing here may import back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Attempt:
    """What the verifier said about an earlier candidate of the same campaign step."""

    strategy: dict[str, Any]
    reward: int
    failures: list[dict[str, str]] = field(default_factory=list)
    kernel_us: float | None = None
    floor_us: float | None = None


@dataclass
class WriteRequest:
    op: str
    module_class: str
    adapter: list[dict[str, str]]
    shapes: list[list[int]] = field(default_factory=list)
    dtype: str = "float32"
    hardware: str = "cpu"
    seed_source: str | None = None  # source of the skill the bandit picked, if any
    seed_strategy: dict[str, Any] | None = None
    history: list[Attempt] = field(default_factory=list)
    iteration: int = 0
    # The target module's live tensor shapes ({"weight": [N, K], "bias": [N] or None}; linear's N).
    param_shapes: dict[str, list[int] | None] = field(default_factory=dict)


@dataclass
class WrittenCandidate:
    source: str
    strategy: dict[str, Any]
    author: str
    notes: str = ""


class Author(Protocol):
    @property
    def name(self) -> str: ...

    def write(self, request: WriteRequest) -> WrittenCandidate: ...
