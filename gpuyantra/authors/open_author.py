"""The open author: candidates for open targets (`open.*` ops), written from the traced module.

Each write renders the target's computation (gpuyantra.authors.opengen) with one point of its
strategy space. The search is small and deterministic: the default point first (or the seed's, when
the skill library offers one), then the untried points nearest the best-rewarded attempt so far
(reward, then measured kernel time); "strategies exhausted" once every point was tried. A target
the open author cannot write raises Unsupported (a ValueError) with the reason.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from gpuyantra.authors.base import Attempt, WriteRequest, WrittenCandidate
from gpuyantra.authors.opengen import OpenSpec, Unsupported, distance, normalize, strategy_space, write_open_source
from gpuyantra.authors.opengen.library_conv import leading_convolution, write_library_conv_source

CONVERGED_REWARD = 3
TRACE_ELEMENTS = 1 << 20  # example inputs for tracing are shrunk to about this many elements (pooled dims
# must keep a few windows: an 11-wide pool over 2048x2048 planes traced at 2^16 elements had none)
_SPECS: OrderedDict[str, OpenSpec] = OrderedDict()  # op -> spec (the same object keeps the analysis cached)


class OpenAuthor:
    name = "open"

    def converged(self, request: WriteRequest) -> bool:
        """A kernel already beat eager and torch.compile: nothing left to search for."""
        return any(a.reward >= CONVERGED_REWARD for a in request.history)

    def write(self, request: WriteRequest) -> WrittenCandidate:
        spec = spec_for(request.op)
        space = library_space(spec)
        strategy, reason = next_strategy(space, request.history, request.seed_strategy)
        if strategy.get("LIBRARY_CONV") == 1:
            source = write_library_conv_source(spec, strategy)
        else:
            source = write_open_source(spec, strategy)
        return WrittenCandidate(
            source=source,
            strategy=strategy,
            author=self.name,
            notes=f"{reason}; open target {request.op} with {strategy}",
        )


def library_space(spec: OpenSpec) -> list[dict[str, Any]]:
    """The strategies to try: for a forward that starts with a convolution, the library convolution
    with a Triton epilogue first (its points), then everything in Triton; else the target's points."""
    lead = leading_convolution(spec)
    if lead is None:
        return strategy_space(spec)
    try:
        library = [{**p, "LIBRARY_CONV": 1} for p in strategy_space(lead.tail)]
    except Unsupported:
        library = []  # an epilogue the author cannot write: the whole forward in Triton
    try:
        triton = [{**p, "LIBRARY_CONV": 0} for p in strategy_space(spec)]
    except Unsupported:
        if not library:
            raise
        triton = []
    return library + triton


def next_strategy(
    space: Sequence[dict[str, Any]], history: Sequence[Attempt], seed: dict[str, Any] | None = None
) -> tuple[dict[str, Any], str]:
    """(strategy, why) for the next write; ValueError("strategies exhausted") when none is left."""
    tried = [normalize(a.strategy) for a in history]
    candidates = [normalize(p) for p in space]
    if seed:
        seeded = normalize(seed)
        if seeded not in candidates:
            candidates.insert(0, seeded)
    untried = [p for i, p in enumerate(candidates) if p not in tried and p not in candidates[:i]]
    if not untried:
        raise ValueError("strategies exhausted")
    best = _best(history)
    if best is None:
        precise = _more_precise_point(tried, history[-1]) if history else None
        if precise is not None:
            return precise, "the last attempt's values were outside tolerance: IEEE float32 products"
        return untried[0], "first untried point" if history else "default point"
    best_point = normalize(best.strategy)
    chosen = min(untried, key=lambda p: distance(p, best_point))  # min keeps space order on ties
    return chosen, f"nearest untried point to the best attempt (reward {best.reward})"


def _more_precise_point(tried: Sequence[dict[str, Any]], last: Attempt) -> dict[str, Any] | None:
    """The last point with IEEE float32 products, where its values missed the tolerance with
    products on tensor cores (tf32x3 drops the low parts' product: a long-K product followed by a
    normalization put a few of millions of elements just past it) and it was not tried yet."""
    point = normalize(last.strategy)
    if point.get("MM_F32_TC") != 1:
        return None
    missed = any("outside atol" in str(f.get("message", "")) for f in last.failures)
    precise = {**point, "MM_F32_TC": 0}
    return precise if missed and precise not in tried else None


def _best(history: Sequence[Attempt]) -> Attempt | None:
    passing = [a for a in history if a.reward >= 1]
    if not passing:
        return None
    return max(passing, key=lambda a: (a.reward, -(a.kernel_us if a.kernel_us is not None else float("inf"))))


def spec_for(op: str) -> OpenSpec:
    """The OpenSpec of a registered open target (gpuyantra.ops.open), remembered per op."""
    hit = _SPECS.get(op)
    if hit is not None:
        _SPECS.move_to_end(op)
        return hit
    from gpuyantra.ops.open import open_spec_for  # written alongside; imported when first needed

    spec = spec_from_target(open_spec_for(op))
    _SPECS[op] = spec
    while len(_SPECS) > 16:
        _SPECS.popitem(last=False)
    return spec


def spec_from_target(target: Any) -> OpenSpec:
    """An OpenSpec from an open target: its fields, with example inputs drawn at reduced shapes
    (tracing needs only shapes and dtypes) where every variable dim of every input is at least 2,
    so that it is traced as a size and not as a broadcast dim; its variable dims and live calls,
    which the written kernel must serve (else Unsupported)."""
    if isinstance(target, OpenSpec):
        return target
    examples = getattr(target, "example_inputs", ())
    if callable(examples):
        examples = examples(_trace_shapes(target))
    variable = getattr(target, "variable_dims", None)
    return OpenSpec(
        op=str(target.op),
        module=target.module,
        input_names=tuple(target.input_names),
        example_inputs=tuple(examples),
        tensor_params=tuple(tuple(p) for p in target.tensor_params),
        float_params=tuple(tuple(p) for p in target.float_params),
        updated_buffers=tuple(getattr(target, "updated_buffers", ())),
        variable_dims=tuple(tuple(int(d) for d in dims) for dims in variable) if variable is not None else None,
        calls=tuple(getattr(target, "calls", ())),
        arguments=tuple((p.kernel_param, p.argument, p.value) for p in getattr(target, "arguments", ())),
    )


def _trace_shapes(target: Any) -> list[tuple[int, ...]] | None:
    """Every input's shape to trace at: every variable dim of every input at least 2 (later
    inputs' dims too: a position input of batch 1 traced at 1 is baked at 1)."""
    trace_shapes = getattr(target, "trace_shapes", None)
    if callable(trace_shapes):
        return [tuple(int(s) for s in shape) for shape in trace_shapes(TRACE_ELEMENTS)]
    shapes_for = getattr(target, "shapes_for", None)
    inputs = getattr(target, "inputs", None)
    variable = getattr(target, "variable_dims", None)
    if shapes_for is None or not inputs or variable is None:
        return None
    from gpuyantra.ops.open.spec import trace_sizes

    first = trace_sizes(inputs[0].shape, tuple(variable[0]) if variable else (), TRACE_ELEMENTS)
    return [tuple(int(s) for s in shape) for shape in shapes_for(tuple(first))]
