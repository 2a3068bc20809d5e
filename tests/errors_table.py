"""Read the tables of docs/errors.md, so tests check every documented row against the code."""

from __future__ import annotations

from pathlib import Path

ERRORS_MD = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


def rows(section: str) -> list[list[str]]:
    """The body rows of the first table under the heading `## <section>` (or `### <section>`), up to
    the next heading, each cell unwrapped from its code span."""
    lines = ERRORS_MD.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if _heading(line) and line.lstrip("#").strip().startswith(section))
    table = [line for line in _until_next_section(lines[start + 1 :]) if line.startswith("|")]
    return [[_cell(c) for c in line.strip("|").split(" | ")] for line in table[2:]]  # header, rule


def matches(documented: str, actual: str) -> bool:
    """Exact, except that a documented message ending in `...` is exact up to there."""
    return actual.startswith(documented[:-3]) if documented.endswith("...") else actual == documented


def _until_next_section(lines: list[str]) -> list[str]:
    end = next((i for i, line in enumerate(lines) if _heading(line)), len(lines))
    return lines[:end]


def _heading(line: str) -> bool:
    return line.startswith(("## ", "### "))


def _cell(text: str) -> str:
    text = text.strip()
    for fence in ("`` ", "`"):  # a double-backtick span holds messages that contain backticks
        closing = fence[::-1]
        if text.startswith(fence) and text.endswith(closing):
            return text[len(fence) : -len(closing)]
    return text
