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
    @property
    def name(self) -> str: ...

    def write(self, request: WriteRequest) -> WrittenCandidate: ...


def get_author(name: str | None = None) -> Author:
    """The configured author: GPUYANTRA_AUTHOR (template by default).

    - `template`: the offline template author.
    - `openai`: an OpenAI-compatible chat-completions server (OpenAI, vLLM, llama.cpp);
      GPUYANTRA_LLM_BASE_URL (required, the API root such as http://127.0.0.1:8000/v1),
      GPUYANTRA_LLM_MODEL and GPUYANTRA_LLM_API_KEY (optional).
    - `gemini`: Gemini through google-genai; GEMINI_API_KEY or GOOGLE_API_KEY (required),
      GPUYANTRA_LLM_MODEL (default gemini-2.5-flash), GPUYANTRA_LLM_BASE_URL (optional).
    Both LLM authors also read GPUYANTRA_LLM_TIMEOUT (seconds per request) and
    GPUYANTRA_LLM_MAX_ATTEMPTS, and fall back to the template author on an unusable reply.
    Missing or invalid settings raise ValueError naming the variable.
    """
    name = (name or os.environ.get("GPUYANTRA_AUTHOR") or "template").strip().lower()
    if name == "template":
        from gpuyantra.authors.template import TemplateAuthor

        return TemplateAuthor()
    if name in ("openai", "gemini"):
        from gpuyantra.authors.llm import author_from_env

        return author_from_env(name)
    raise ValueError(f"unknown author {name!r} (GPUYANTRA_AUTHOR); known: template, openai, gemini")
