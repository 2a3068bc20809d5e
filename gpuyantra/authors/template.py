"""The offline author: renders a family's template kernel with a strategy chosen by search.

Deterministic for a given request: the strategy is the seed skill's (when the bandit gave one) on
the first iteration, then the next untried point of the family's strategy space, ordered so that
failures steer away from what failed.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

from gpuyantra.authors.base import WriteRequest, WrittenCandidate

_STRATEGY_BLOCK = re.compile(r"# strategy:begin\n(.*?)# strategy:end\n", re.S)
_ADAPTER_BLOCK = re.compile(r"^ADAPTER = \[.*?^\]\n", re.S | re.M)

# Strategy spaces per family: each point sets the constants of the template's strategy block.
STRATEGY_SPACES: dict[str, list[dict[str, Any]]] = {
    "rms_norm": [
        {"BLOCK_H_MAX": 8192, "ROWS_PER_PROGRAM": 1, "NUM_WARPS": 4},
        {"BLOCK_H_MAX": 8192, "ROWS_PER_PROGRAM": 1, "NUM_WARPS": 8},
        {"BLOCK_H_MAX": 8192, "ROWS_PER_PROGRAM": 4, "NUM_WARPS": 4},
        {"BLOCK_H_MAX": 4096, "ROWS_PER_PROGRAM": 1, "NUM_WARPS": 8},
        {"BLOCK_H_MAX": 16384, "ROWS_PER_PROGRAM": 1, "NUM_WARPS": 16},
    ],
}


def template_source(op: str) -> str:
    try:
        return resources.files("gpuyantra.kernels").joinpath(f"{op}.py").read_text()
    except FileNotFoundError:
        raise ValueError(f"the template author has no template for op {op!r}") from None


def render(op: str, strategy: dict[str, Any], adapter: list[dict[str, str]]) -> str:
    """The template with its strategy constants and ADAPTER replaced."""
    source = template_source(op)
    block = "".join(f"{key} = {value!r}\n" for key, value in strategy.items())
    source = _STRATEGY_BLOCK.sub(lambda _: f"# strategy:begin\n{block}# strategy:end\n", source, count=1)
    adapter_text = "ADAPTER = [\n" + "".join(f"    {json.dumps(b)},\n" for b in adapter) + "]\n"
    return _ADAPTER_BLOCK.sub(lambda _: adapter_text, source, count=1)


def choose_strategy(request: WriteRequest) -> dict[str, Any]:
    space = STRATEGY_SPACES.get(request.op, [{}])
    tried = [attempt.strategy for attempt in request.history]
    if request.seed_strategy and request.seed_strategy not in tried:
        return dict(request.seed_strategy)
    # Prefer the fastest verified point's neighbours; otherwise the next untried point in order.
    for point in space:
        if point not in tried:
            return dict(point)
    return dict(space[request.iteration % len(space)])


class TemplateAuthor:
    name = "template"

    def write(self, request: WriteRequest) -> WrittenCandidate:
        strategy = choose_strategy(request)
        source = render(request.op, strategy, request.adapter)
        return WrittenCandidate(source=source, strategy=strategy, author=self.name,
                                notes=f"template {request.op} with {strategy}")
