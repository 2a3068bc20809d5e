"""The offline author: renders a family's template kernel with a strategy chosen by search.

A strategy sets the constants of a template's `# strategy:begin/end` block (rows per program,
chunked loops over H, persistent grids, num_warps / num_stages, block sizes, cache hints...). The
search is deterministic for a given request (op, shapes, dtype, hardware, seed, history):

1. First write: the seed skill's strategy (from `seed_strategy`, else parsed from `seed_source`),
   else a heuristic start from the shapes (rows per program for small H, chunked loops for wide
   rows, interpreter-friendly tiles on CPU).
2. Every later write reads the verifier's feedback in `history`:
   * a failed attempt (static/contract/sandbox/correctness, or reward < 0) bans the knob values
     that distinguished it from the best passing strategy (resource failures ban that value and
     every larger one of the size knobs);
   * among passing attempts with a measured `kernel_us`, the fastest is the incumbent; the next
     write is its untried neighbour (one knob one step away), knobs ordered by the regime the
     measurement shows (launch-bound: >= 10x the floor; else bandwidth-bound), by the direction
     that last helped (when it gained >= 2%), and with moves already seen to slow a point down
     (>3%) last;
   * it stops proposing new points (re-writes the best, notes start with "converged") once the best
     is within 5% of the roofline floor (`floor_us`), when four measured steps in a row brought
     less than 1%, or when the space around the best is exhausted.
3. Points that behave identically for the request's shapes (e.g. MAX_PROGRAMS above the number of
   tiles, CHUNK when rows fit in registers) count as one, so no attempt is wasted on a twin.

The author is split by concern: template_render.py (templates and rendering), template_space.py
(knobs, curated points, canonical forms), template_start.py (step 1) and template_search.py (steps 2
and 3); this module is the author itself and re-exports the names its importers use.
"""

from __future__ import annotations

from typing import Any

from gpuyantra.authors.base import WriteRequest, WrittenCandidate
from gpuyantra.authors.template_render import default_strategy, normalize, parse_strategy, render, template_source
from gpuyantra.authors.template_search import Plan, choose_strategy, plan_strategy
from gpuyantra.authors.template_space import KNOBS, STRATEGY_SPACES, canonical, linear_split, strategy_space
from gpuyantra.authors.template_start import initial_strategy
from gpuyantra.ops.open import is_open

__all__ = [
    "KNOBS",
    "STRATEGY_SPACES",
    "Plan",
    "TemplateAuthor",
    "canonical",
    "choose_strategy",
    "default_strategy",
    "initial_strategy",
    "linear_split",
    "normalize",
    "parse_strategy",
    "plan_strategy",
    "render",
    "strategy_space",
    "template_source",
]


def _open_author() -> Any:
    from gpuyantra.authors.open_author import OpenAuthor

    return OpenAuthor()


class TemplateAuthor:
    """Registered families: their tuned templates. Open targets (`open.*`): the open author, which
    derives the computation from the target's reference and writes Triton for it."""

    name = "template"

    def plan(self, request: WriteRequest) -> Plan:
        return plan_strategy(request)

    def converged(self, request: WriteRequest) -> bool:
        """True when the search would only re-write its best point (the campaign may stop)."""
        if is_open(request.op):
            return _open_author().converged(request)
        return plan_strategy(request).converged

    def write(self, request: WriteRequest) -> WrittenCandidate:
        if is_open(request.op):
            return _open_author().write(request)
        plan = plan_strategy(request)
        source = render(request.op, plan.strategy, request.adapter)
        return WrittenCandidate(
            source=source,
            strategy=plan.strategy,
            author=self.name,
            notes=f"{plan.reason}; template {request.op} with {plan.strategy}",
        )
