"""The offline template author's rendering: a family's template kernel (gpuyantra/kernels/) with
its `# strategy:begin/end` constants and its ADAPTER replaced.

Kept apart from the search (template_search.py): benchmarks and tests render a template with a
strategy of their own, and the search modules read the template defaults from here.
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from importlib import resources
from typing import Any

_STRATEGY_BLOCK = re.compile(r"# strategy:begin\n(.*?)# strategy:end\n", re.S)
_ADAPTER_BLOCK = re.compile(r"^ADAPTER = \[(?:\]|.*?^\])\n", re.S | re.M)


@cache
def template_source(op: str) -> str:
    try:
        return resources.files("gpuyantra.kernels").joinpath(f"{op}.py").read_text()
    except FileNotFoundError:
        raise ValueError(f"the template author has no template for op {op!r}") from None


def parse_strategy(source: str) -> dict[str, Any]:
    """The constants of a candidate's `# strategy:begin/end` block ({} when it has none)."""
    match = _STRATEGY_BLOCK.search(source)
    if not match:
        return {}
    strategy: dict[str, Any] = {}
    for line in match.group(1).splitlines():
        code = line.split("#", 1)[0].strip()
        if "=" not in code:
            continue
        name, _, value = code.partition("=")
        try:
            strategy[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            continue
    return strategy


def default_strategy(op: str) -> dict[str, Any]:
    """The template's own strategy constants (what an empty strategy renders to)."""
    return dict(_default_strategy(op))


@cache
def _default_strategy(op: str) -> dict[str, Any]:
    return parse_strategy(template_source(op))


def normalize(op: str, strategy: dict[str, Any] | None) -> dict[str, Any]:
    """`strategy` restricted to the template's knobs, every missing knob at the template default."""
    defaults = default_strategy(op)
    merged = dict(defaults)
    for key, value in (strategy or {}).items():
        if key in defaults and isinstance(value, type(defaults[key])):
            merged[key] = value
    return merged


def render(op: str, strategy: dict[str, Any], adapter: list[dict[str, str]]) -> str:
    """The template with its strategy constants and ADAPTER replaced."""
    source = template_source(op)
    full = normalize(op, strategy)
    comments = _knob_comments(source)
    block = "".join(
        f"{key} = {value!r}" + (f"  # {comments[key]}" if key in comments else "") + "\n" for key, value in full.items()
    )
    source = _STRATEGY_BLOCK.sub(lambda _: f"# strategy:begin\n{block}# strategy:end\n", source, count=1)
    adapter_text = "ADAPTER = [\n" + "".join(f"    {json.dumps(b)},\n" for b in adapter) + "]\n"
    return _ADAPTER_BLOCK.sub(lambda _: adapter_text, source, count=1)


def _knob_comments(source: str) -> dict[str, str]:
    match = _STRATEGY_BLOCK.search(source)
    comments: dict[str, str] = {}
    for line in match.group(1).splitlines() if match else []:
        if "#" in line and "=" in line.split("#", 1)[0]:
            comments[line.split("=", 1)[0].strip()] = line.split("#", 1)[1].strip()
    return comments
