"""The author interface: a write request in, a candidate file's source out."""

from __future__ import annotations

import os
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


@dataclass
class WrittenCandidate:
    source: str
    strategy: dict[str, Any]
    author: str
    notes: str = ""


class Author(Protocol):
    name: str

    def write(self, request: WriteRequest) -> WrittenCandidate: ...


def get_author(name: str | None = None) -> Author:
    """The configured author: GPUYANTRA_AUTHOR (template by default)."""
    name = name or os.environ.get("GPUYANTRA_AUTHOR", "template")
    if name == "template":
        from gpuyantra.authors.template import TemplateAuthor

        return TemplateAuthor()
    raise ValueError(f"unknown author {name!r}; known: template")
