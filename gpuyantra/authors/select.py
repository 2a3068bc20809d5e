"""Choosing the configured author. Kept apart from `base` (the interface types every author
imports) so the choice can import the authors without an import cycle; the authors are imported only
when chosen, so `from gpuyantra.authors import WriteRequest` stays light (no HTTP client, no torch)."""

from __future__ import annotations

import os

from gpuyantra.authors.base import Author

AUTHORS = ("template", "openai", "gemini")


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
    raise ValueError(f"unknown author {name!r} (GPUYANTRA_AUTHOR); known: {', '.join(AUTHORS)}")
