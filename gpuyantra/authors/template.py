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
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from gpuyantra.authors.base import Attempt, WriteRequest, WrittenCandidate
from gpuyantra.ops.open import is_open

_STRATEGY_BLOCK = re.compile(r"# strategy:begin\n(.*?)# strategy:end\n", re.S)
_ADAPTER_BLOCK = re.compile(r"^ADAPTER = \[(?:\]|.*?^\])\n", re.S | re.M)

# --- the knobs of each template, every value list ordered so that neighbours are one step apart ---
ROW_KNOBS: dict[str, list[Any]] = {
    "BLOCK_H_MAX": [2048, 4096, 8192, 16384],
    "CHUNK": [1024, 2048, 4096, 8192],
    "ROWS_PER_PROGRAM": [1, 2, 4, 8, 16, 32],
    "NUM_WARPS": [0, 1, 2, 4, 8, 16, 32],
    "NUM_STAGES": [1, 2, 3, 4],
    "MAX_PROGRAMS": [0, 8448, 4224, 2112, 1056, 528, 264, 132],  # 0 = one program per tile
    "X_EVICTION": ["", "evict_first"],
}
GATED_KNOBS: dict[str, list[Any]] = {
    "BLOCK_SIZE": [256, 512, 1024, 2048, 4096, 8192, 16384],
    "NUM_WARPS": [0, 1, 2, 4, 8, 16],
    "FLAT": [True, False],
    "X_EVICTION": ["", "evict_first"],
}
ROPE_KNOBS: dict[str, list[Any]] = {
    "HEAD_BLOCK": [0, 1, 2, 4, 8, 16, 32],
    "TOKENS_PER_PROGRAM": [1, 2, 4, 8],  # token mode: tokens per tile (cos/sin shared by all their heads)
    "NUM_WARPS": [0, 1, 2, 4, 8],
    "MAX_PROGRAMS": [0, 8448, 4224, 2112, 1056, 528, 264, 132],
    "FLAT_ROWS": [0, 16, 32, 64],  # 0: a program per token; N: stream N head vectors per program
}
# linear: a GEMV for decode rows (tile over N, loop or split over K) and a tiled tl.dot matmul.
LINEAR_KNOBS: dict[str, list[Any]] = {
    "GEMV_MAX_ROWS": [1, 2, 4, 8, 16, 32],
    "GEMV_ROWS": [0, 1, 2, 4, 8, 16],  # 0: every row in one program
    "BLOCK_N": [4, 8, 16, 32, 64, 128, 256],
    "BLOCK_K": [32, 64, 128, 256, 512, 1024],
    "SPLIT_K": [0, 1, 2, 3, 4, 6, 8, 12, 16],  # 0: auto (TARGET_PROGRAMS)
    "TARGET_PROGRAMS": [132, 264, 528, 1056],
    "GEMV_WARPS": [1, 2, 4, 8, 16],
    "W_EVICTION": ["", "evict_first"],
    "DEFER_REDUCE": [False, True],
    "BLOCK_M": [16, 32, 64, 128],
    "MM_BLOCK_N": [16, 32, 64, 128, 256],
    "MM_BLOCK_K": [32, 64, 128, 256],
    "MM_SPLIT_K": [1, 2, 3, 4, 6, 8],
    "GROUP_M": [1, 4, 8, 16],
    "MM_WARPS": [2, 4, 8],
}
ROW_FAMILIES = ("rms_norm", "gemma_rms_norm", "layer_norm", "add_rms_norm", "softmax")
GATED_FAMILIES = ("silu_mul", "gelu_tanh_mul")
LAYER_NORM_KNOBS: dict[str, list[Any]] = {**ROW_KNOBS, "SHIFTED_STATS": [False, True], "RELOAD_AFFINE": [False, True]}
KNOBS: dict[str, dict[str, list[Any]]] = {
    **{op: ROW_KNOBS for op in ROW_FAMILIES},
    "layer_norm": LAYER_NORM_KNOBS,
    **{op: GATED_KNOBS for op in GATED_FAMILIES},
    "rope": ROPE_KNOBS,
    "linear": {**LINEAR_KNOBS, "NUM_STAGES": [1, 2, 3, 4, 5]},
}
# Knobs whose larger values need more registers / shared memory (banned upwards on resource errors).
SIZE_KNOBS = (
    "BLOCK_H_MAX",
    "CHUNK",
    "ROWS_PER_PROGRAM",
    "BLOCK_SIZE",
    "HEAD_BLOCK",
    "TOKENS_PER_PROGRAM",
    "NUM_STAGES",
    "GEMV_ROWS",
    "BLOCK_N",
    "BLOCK_K",
    "BLOCK_M",
    "MM_BLOCK_N",
    "MM_BLOCK_K",
)
# Knob order when the measurement is far from a floor that is large (bandwidth-bound) ...
BANDWIDTH_PRIORITY: tuple[str, ...] = (
    "SPLIT_K",
    "BLOCK_N",
    "BLOCK_K",
    "DEFER_REDUCE",
    "GEMV_WARPS",
    "W_EVICTION",
    "ROWS_PER_PROGRAM",
    "TOKENS_PER_PROGRAM",
    "SHIFTED_STATS",
    "RELOAD_AFFINE",
    "FLAT_ROWS",
    "MAX_PROGRAMS",
    "NUM_WARPS",
    "BLOCK_SIZE",
    "X_EVICTION",
    "HEAD_BLOCK",
    "CHUNK",
    "BLOCK_H_MAX",
    "NUM_STAGES",
    "FLAT",
)
# ... and when the floor is tiny and the time is launch overhead (fewer, leaner programs first).
LAUNCH_PRIORITY: tuple[str, ...] = (
    "GEMV_WARPS",
    "BLOCK_N",
    "SPLIT_K",
    "BLOCK_K",
    "DEFER_REDUCE",
    "NUM_WARPS",
    "ROWS_PER_PROGRAM",
    "BLOCK_SIZE",
    "HEAD_BLOCK",
    "MAX_PROGRAMS",
    "FLAT",
    "FLAT_ROWS",
    "TOKENS_PER_PROGRAM",
    "X_EVICTION",
    "SHIFTED_STATS",
    "RELOAD_AFFINE",
    "BLOCK_H_MAX",
    "CHUNK",
    "NUM_STAGES",
)

CONVERGED_GAP = 1.05  # stop once kernel_us <= 1.05 * floor_us
PLATEAU_STEPS = 4  # stop after this many measured steps in a row without a 1% gain
PLATEAU_GAIN = 0.01
LAUNCH_BOUND_GAP = 10.0  # measured >= 10x the floor: the time is launch overhead, not bytes
LAUNCH_BOUND_US = 8.0  # without a floor: a time under this is launch overhead
HARD_FAILURE_LAYERS = ("static", "contract", "sandbox", "correctness")
_RESOURCE_WORDS = ("out of resource", "outofresources", "shared memory", "registers", "too many resources")


# --------------------------------------------------------------------------- templates and rendering


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


# --------------------------------------------------------------------------- shapes and canonical forms


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _rows_hidden(op: str, shape: Sequence[int]) -> tuple[int, int, int]:
    """(rows or tokens, hidden, heads) for one request shape (the first activation's shape)."""
    shape = [int(s) for s in shape] or [1]
    if op == "rope":
        if len(shape) >= 4:
            return shape[0] * shape[2], shape[-1], shape[1]
        return (shape[0] if len(shape) > 1 else 1), shape[-1], 4
    rows = 1
    for dim in shape[:-1]:
        rows *= dim
    return rows, shape[-1], 1


def _shapes(request: WriteRequest) -> list[list[int]]:
    return [list(s) for s in request.shapes if s] or [[1, 4096]]


def _itemsize(dtype: str) -> int:
    name = str(dtype).replace("torch.", "")
    return {"float32": 4, "float": 4, "float64": 8, "double": 8}.get(name, 2)


def auto_warps(op: str, strategy: dict[str, Any], shape: Sequence[int]) -> int:
    """num_warps the template picks by itself for NUM_WARPS = 0 (mirrors each template's entry)."""
    rows, hidden, heads = _rows_hidden(op, shape)
    if op in ROW_FAMILIES:
        block = _pow2(hidden)
        elems = block * strategy["ROWS_PER_PROGRAM"] if block <= strategy["BLOCK_H_MAX"] else strategy["CHUNK"]
        return max(1, min(16, elems // 512))
    if op in GATED_FAMILIES:
        return max(1, min(16, strategy["BLOCK_SIZE"] // 256))
    if op == "rope":
        if strategy.get("FLAT_ROWS"):
            return max(1, min(8, strategy["FLAT_ROWS"] * _pow2(hidden // 2) // 128))
        kv_heads = heads // 4 if heads % 4 == 0 else heads  # the families' grouped-query k
        hbq, hbk = _pow2(heads), _pow2(kv_heads)
        if strategy["HEAD_BLOCK"]:
            hbq, hbk = min(hbq, strategy["HEAD_BLOCK"]), min(hbk, strategy["HEAD_BLOCK"])
        tokens = min(strategy.get("TOKENS_PER_PROGRAM", 1), _pow2(rows))
        if hbq >= heads and hbk >= kv_heads:  # one tile per tensor
            return max(1, min(8, tokens * hbq * _pow2(hidden // 2) // 512))
        return max(1, min(8, tokens * hbq * _pow2(hidden // 2) // 128))
    return 4


def _out_features(request: WriteRequest) -> int | None:
    """N of a linear target (its live weight's rows), when the request carries it."""
    weight = (request.param_shapes or {}).get("weight")
    return int(weight[0]) if weight else None


def linear_split(strategy: dict[str, Any], n: int, k: int) -> int:
    """The number of K slices the linear template's GEMV launches (mirrors its `_launch_gemv`)."""
    n_blocks = -(-n // strategy["BLOCK_N"])
    k_blocks = -(-k // strategy["BLOCK_K"])
    split = strategy["SPLIT_K"] or max(1, min(k_blocks // 4, strategy["TARGET_PROGRAMS"] // max(1, n_blocks), 64))
    k_per_split = -(-k_blocks // min(split, k_blocks)) * strategy["BLOCK_K"]
    return -(-k // k_per_split)


_MATMUL_KNOBS = ("BLOCK_M", "MM_BLOCK_N", "MM_BLOCK_K", "MM_SPLIT_K", "GROUP_M", "MM_WARPS", "NUM_STAGES")
_GEMV_KNOBS = ("GEMV_ROWS", "BLOCK_N", "BLOCK_K", "SPLIT_K", "TARGET_PROGRAMS", "GEMV_WARPS", "W_EVICTION")


def _linear_canonical(s: dict[str, Any], rows: int, k: int, n: int) -> dict[str, Any]:
    """Only the kernel that runs at `rows` matters; the GEMV by its effective rows and split."""
    gemv = rows <= s["GEMV_MAX_ROWS"]
    s["GEMV_ROWS"] = min(s["GEMV_ROWS"] or s["GEMV_MAX_ROWS"], _pow2(rows))
    s["GEMV_MAX_ROWS"] = "gemv" if gemv else "matmul"
    if not gemv:
        for knob in (*_GEMV_KNOBS, "DEFER_REDUCE"):
            s[knob] = None
        k_blocks = -(-k // s["MM_BLOCK_K"])
        s["MM_SPLIT_K"] = -(-k // (-(-k_blocks // min(s["MM_SPLIT_K"], k_blocks)) * s["MM_BLOCK_K"]))
        return s
    s["SPLIT_K"], s["TARGET_PROGRAMS"] = linear_split(s, n, k), None
    for knob in _MATMUL_KNOBS:
        s[knob] = None
    return s


def canonical(
    op: str, strategy: dict[str, Any], shapes: Sequence[Sequence[int]], out_features: int | None = None
) -> str:
    """A key equal for strategies that launch the same kernels with the same settings on `shapes`
    (`out_features`: a linear's N, which is not part of its activation shape; default N = K)."""
    per_shape = []
    for shape in shapes:
        s = dict(strategy)
        rows, hidden, heads = _rows_hidden(op, shape)
        if op == "linear":
            s = _linear_canonical(s, rows, hidden, out_features or hidden)
        elif op in ROW_FAMILIES:
            chunked = _pow2(hidden) > s["BLOCK_H_MAX"]
            if chunked:
                programs = rows
            else:
                # The templates shrink the row tile to the rows there are.
                s["ROWS_PER_PROGRAM"] = min(s["ROWS_PER_PROGRAM"], _pow2(rows))
                programs = -(-rows // s["ROWS_PER_PROGRAM"])
            if not s["NUM_WARPS"]:
                s["NUM_WARPS"] = auto_warps(op, s, shape)
            s["BLOCK_H_MAX"] = "chunked" if chunked else "rows"
            if chunked and "RELOAD_AFFINE" in s:
                s["RELOAD_AFFINE"] = None  # the chunked kernel reads weight/bias per slice anyway
            s["CHUNK" if not chunked else "ROWS_PER_PROGRAM"] = None
            if s["MAX_PROGRAMS"] >= programs:
                s["MAX_PROGRAMS"] = 0
            if not s["MAX_PROGRAMS"] and not chunked:
                s["NUM_STAGES"] = 1  # the tile loop runs once per program: nothing to pipeline
        elif op in GATED_FAMILIES:
            if not s["NUM_WARPS"]:
                s["NUM_WARPS"] = auto_warps(op, s, shape)
        elif op == "rope":
            if not s["NUM_WARPS"]:
                s["NUM_WARPS"] = auto_warps(op, s, shape)
            tokens = min(s.get("TOKENS_PER_PROGRAM", 1), _pow2(rows))
            s["TOKENS_PER_PROGRAM"] = None if s.get("FLAT_ROWS") else tokens
            if s["HEAD_BLOCK"] >= _pow2(heads) or s.get("FLAT_ROWS"):
                s["HEAD_BLOCK"] = 0
            if s["MAX_PROGRAMS"] >= -(-rows // tokens) or s.get("FLAT_ROWS"):
                s["MAX_PROGRAMS"] = 0
        per_shape.append(s)
    return json.dumps(per_shape, sort_keys=True, default=str)


# --------------------------------------------------------------------------- the search


@dataclass
class Plan:
    strategy: dict[str, Any]
    reason: str
    converged: bool = False


def _linear_initial(strategy: dict[str, Any], max_rows: int, k: int, n: int, itemsize: int, cpu: bool) -> None:
    """First linear point. CPU: interpreter-friendly tiles (few, wide programs). GPU, from an H200
    sweep of Qwen2.5-1.5B's decode projections (bf16, CUDA-graph replay, weights from HBM):
    * 1-4 rows, GEMV with per-lane sums (DEFER_REDUCE) over 512-wide K steps: 4 output features per
      program for N < 8192 (q/k/v 4.7 us, o_proj 4.1 us vs cuBLAS 5.9 / 6.5), 16 for gate/up and
      lm_head (18.3 / 117 us vs 17.4 / 113), and for a long K (down_proj) 8 features and 4 K slices
      (11.1 vs 12.2 us);
    * 5-16 rows, a 16-row tl.dot tile over 16 (N < 8192) or 32-64 output features, K 128 per step
      (batch 8: q/k/v 5.8, o 5.2, gate/up 16.3, lm_head 112 us, cuBLAS 5.8 / 5.2 / 17.7 / 116), 4 K
      slices for a long K;
    * prefill, 64- or 128-row tiles."""
    if cpu:
        strategy.update(BLOCK_N=256, BLOCK_K=512, SPLIT_K=1, BLOCK_M=64, MM_BLOCK_N=128, MM_BLOCK_K=64)
        return
    long_k = k >= 4 * n
    strategy.update(GEMV_MAX_ROWS=4, DEFER_REDUCE=True, GEMV_WARPS=4, BLOCK_K=512 if itemsize <= 2 else 256)
    if long_k:  # down_proj: few outputs, long K
        strategy.update(BLOCK_N=8, SPLIT_K=4)
    else:
        strategy.update(BLOCK_N=16 if n >= 8192 else 4, SPLIT_K=1)
    if max_rows <= 16:  # batched decode: one 16-row tensor-core tile streams the weights
        wide = n >= 8192
        strategy.update(
            BLOCK_M=16,
            MM_BLOCK_N=32 if wide else 16,
            MM_BLOCK_K=128,
            MM_WARPS=4,
            NUM_STAGES=3 if wide else 5,
            MM_SPLIT_K=4 if long_k else 1,
        )
    else:
        big = max_rows >= 512
        strategy.update(
            BLOCK_M=128 if big else 64, MM_BLOCK_N=128, MM_BLOCK_K=64, MM_WARPS=8 if big else 4, NUM_STAGES=4
        )


def initial_strategy(request: WriteRequest) -> dict[str, Any]:
    """A sensible first point from the shapes, dtype and hardware (no feedback yet)."""
    op = request.op
    strategy = default_strategy(op)
    shapes = _shapes(request)
    dims = [_rows_hidden(op, s) for s in shapes]
    max_rows = max(d[0] for d in dims)
    hidden = max(d[1] for d in dims)
    cpu = str(request.hardware).lower().startswith("cpu")
    if op == "linear":
        n = _out_features(request) or hidden
        _linear_initial(strategy, max_rows, hidden, n, _itemsize(request.dtype), cpu)
        return strategy
    if op in ROW_FAMILIES:
        block = _pow2(hidden)
        if block > strategy["BLOCK_H_MAX"]:
            # Wide rows: chunked loop; smaller slices for 4-byte types keep registers in check.
            strategy["CHUNK"] = 2048 if _itemsize(request.dtype) >= 4 else 4096
        if cpu:
            # The interpreter runs programs one after another: fewer, taller tiles verify faster.
            strategy["ROWS_PER_PROGRAM"] = max(1, min(32, 16384 // block, _pow2(max_rows)))
        elif max_rows >= 64:
            # Small H (head-dim norms, small models): several rows per program amortize the
            # weight load and the per-program cost; 4096-wide and up keep one row per program.
            strategy["ROWS_PER_PROGRAM"] = max(1, min(16, 2048 // block))
    elif op in GATED_FAMILIES:
        if cpu:
            strategy["BLOCK_SIZE"] = 16384
    return strategy


def is_hard_failure(attempt: Attempt) -> bool:
    return attempt.reward < 0 or any(f.get("layer") in HARD_FAILURE_LAYERS for f in attempt.failures)


def is_resource_failure(attempt: Attempt) -> bool:
    text = " ".join(f"{f.get('rule', '')} {f.get('message', '')}" for f in attempt.failures).lower()
    return any(word in text for word in _RESOURCE_WORDS)


def _seed(request: WriteRequest) -> dict[str, Any] | None:
    if request.seed_strategy:
        return dict(request.seed_strategy)
    if request.seed_source:
        parsed = parse_strategy(request.seed_source)
        return parsed or None
    return None


def _banned(op: str, failed: list[dict[str, Any]], resource: list[bool], base: dict[str, Any]) -> set[tuple[str, Any]]:
    knobs = KNOBS.get(op, {})
    banned: set[tuple[str, Any]] = set()
    defaults = default_strategy(op)
    for strategy, is_resource in zip(failed, resource):
        diff = {k: v for k, v in strategy.items() if base.get(k) != v}
        if not diff:  # the base itself failed: blame what it changed from the template defaults
            diff = {k: v for k, v in strategy.items() if defaults.get(k) != v}
        for key, value in diff.items():
            banned.add((key, value))
            if is_resource and key in SIZE_KNOBS and key in knobs and value in knobs[key]:
                for bigger in knobs[key][knobs[key].index(value) :]:
                    banned.add((key, bigger))
    return banned


def _allowed(strategy: dict[str, Any], banned: set[tuple[str, Any]]) -> bool:
    return not any((k, v) in banned for k, v in strategy.items())


def _neighbours(
    op: str, point: dict[str, Any], shapes: Sequence[Sequence[int]], order: Iterable[str], first: tuple[str, int] | None
) -> list[tuple[str, dict[str, Any]]]:
    """One-knob, one-step moves from `point`, in the given knob order (`first` = (knob, direction)
    that last improved goes first). NUM_WARPS = 0 (auto) moves to half / double the auto value."""
    knobs = KNOBS.get(op, {})
    moves: list[tuple[str, dict[str, Any]]] = []
    names = [k for k in order if k in knobs] + [k for k in knobs if k not in order]
    for name in names:
        values = knobs[name]
        current = point.get(name)
        steps: list[Any] = []
        if name == "NUM_WARPS" and current == 0:
            auto = max(auto_warps(op, point, s) for s in shapes)
            steps = [v for v in (auto // 2, auto * 2) if v in values and v != 0]
        elif current in values:
            i = values.index(current)
            steps = [values[j] for j in (i + 1, i - 1) if 0 <= j < len(values)]
        else:
            steps = list(values[:1])
        for value in steps:
            candidate = dict(point)
            candidate[name] = value
            moves.append((f"{name} {current!r} -> {value!r}", candidate))
    if first is not None:
        knob, direction = first
        moves.sort(
            key=lambda m: 0
            if m[1].get(knob) is not None and _direction(op, knob, point.get(knob), m[1][knob]) == direction
            else 1
        )
    return moves


def _direction(op: str, knob: str, old: Any, new: Any) -> int:
    values = KNOBS.get(op, {}).get(knob, [])
    if old in values and new in values:
        return 1 if values.index(new) > values.index(old) else -1
    return 0


def plan_strategy(request: WriteRequest) -> Plan:
    op = request.op
    shapes = _shapes(request)
    out_features = _out_features(request)
    key = lambda s: canonical(op, s, shapes, out_features)  # noqa: E731
    history = list(request.history)
    attempts = [(normalize(op, a.strategy), a) for a in history]
    tried = {key(s) for s, _ in attempts}

    if not attempts:
        seed = _seed(request)
        if seed is not None:
            return Plan(normalize(op, seed), "seed skill's strategy")
        return Plan(initial_strategy(request), "initial heuristic from the shapes")

    passed = [(s, a) for s, a in attempts if not is_hard_failure(a)]
    failed = [(s, a) for s, a in attempts if is_hard_failure(a)]
    measured = [
        (i, s, a)
        for i, (s, a) in enumerate(attempts)
        if not is_hard_failure(a) and a.kernel_us is not None and a.kernel_us > 0
    ]

    # The incumbent: fastest measured passing point; else the last passing one; else the start.
    if measured:
        best_i, best, best_attempt = min(measured, key=lambda m: (m[2].kernel_us, -m[2].reward, m[0]))
    elif passed:
        best_i, (best, best_attempt) = len(attempts) - 1, passed[-1]
    else:
        best_i, best, best_attempt = (
            -1,
            normalize(op, _seed(request)) if _seed(request) else initial_strategy(request),
            None,
        )
    banned = _banned(op, [s for s, _ in failed], [is_resource_failure(a) for _, a in failed], best)

    # Stop rules (measured feedback only).
    if best_attempt is not None and best_attempt.kernel_us:
        floor = best_attempt.floor_us
        if floor and best_attempt.kernel_us <= CONVERGED_GAP * floor:
            return Plan(
                best,
                f"converged: best {best_attempt.kernel_us:.2f} us is within 5% of the {floor:.2f} us floor",
                converged=True,
            )
        if _plateau(measured):
            return Plan(
                best,
                f"converged: no 1% gain in the last {PLATEAU_STEPS} measured steps "
                f"(best {best_attempt.kernel_us:.2f} us)",
                converged=True,
            )

    # Knob order from the regime the incumbent's measurement shows, and the direction that helped.
    order = BANDWIDTH_PRIORITY
    regime = "unmeasured"
    if best_attempt is not None and best_attempt.kernel_us:
        floor = best_attempt.floor_us or 0.0
        launch_bound = (
            (best_attempt.kernel_us >= LAUNCH_BOUND_GAP * floor)
            if floor
            else (best_attempt.kernel_us < LAUNCH_BOUND_US)
        )
        order = LAUNCH_PRIORITY if launch_bound else BANDWIDTH_PRIORITY
        gap = f", {best_attempt.kernel_us / floor:.2f}x the floor" if floor else ""
        regime = f"{'launch' if launch_bound else 'bandwidth'}-bound, best {best_attempt.kernel_us:.2f} us{gap}"
    first = _improving_move(op, measured, best_i)
    bad = _bad_moves(measured)
    moves = _neighbours(op, best, shapes, order, first)
    # Moves that already made some point >3% slower go last (e.g. more rows per program after the
    # persistent grid changed): the measurement says that knob, that way, hurts here.
    moves.sort(key=lambda m: _move_key(best, m[1]) in bad)

    for label, candidate in moves:
        if key(candidate) in tried or not _allowed(candidate, banned):
            continue
        return Plan(candidate, f"neighbour of the best ({regime}): {label}")
    # Neighbourhood exhausted: the next untried, allowed point of the family's curated list.
    for candidate in strategy_space(op, request):
        if key(candidate) not in tried and _allowed(candidate, banned):
            return Plan(candidate, f"next point of the strategy space ({regime})")
    if best_attempt is not None:
        return Plan(best, "converged: every point near the best was tried", converged=True)
    return Plan(default_strategy(op), "every point failed; back to the template defaults", converged=True)


def _measured_us(attempt: Attempt) -> float:
    """kernel_us of an attempt in `measured` (which holds only attempts with one)."""
    if attempt.kernel_us is None:
        raise ValueError("an attempt without kernel_us among the measured ones")
    return attempt.kernel_us


def _plateau(measured: list[tuple[int, dict[str, Any], Attempt]]) -> bool:
    if len(measured) <= PLATEAU_STEPS:
        return False
    times = [_measured_us(a) for _, _, a in measured]
    best_before = min(times[:-PLATEAU_STEPS])
    return min(times[-PLATEAU_STEPS:]) > best_before * (1.0 - PLATEAU_GAIN)


BAD_MOVE_SLOWDOWN = 1.03
MOMENTUM_GAIN = 0.02  # keep walking a knob's direction only after a gain of at least 2%


def _move_key(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, Any, Any] | None:
    diff = [k for k in after if after[k] != before.get(k)]
    return (diff[0], before.get(diff[0]), after[diff[0]]) if len(diff) == 1 else None


def _bad_moves(measured: list[tuple[int, dict[str, Any], Attempt]]) -> set[tuple[str, Any, Any]]:
    """(knob, from, to) single-knob moves seen to make a measured point >3% slower."""
    bad: set[tuple[str, Any, Any]] = set()
    for _, a, ta in measured:
        for _, b, tb in measured:
            key = _move_key(a, b)
            if key is not None and _measured_us(tb) > BAD_MOVE_SLOWDOWN * _measured_us(ta):
                bad.add(key)
    return bad


def _improving_move(
    op: str, measured: list[tuple[int, dict[str, Any], Attempt]], best_i: int
) -> tuple[str, int] | None:
    """(knob, direction) of the single-knob change that produced the incumbent, if it was one."""
    earlier = [(s, a) for i, s, a in measured if i < best_i]
    current = [s for i, s, _ in measured if i == best_i]
    if not earlier or not current:
        return None
    previous, prev_attempt = min(earlier, key=lambda m: _measured_us(m[1]))
    best_us = [_measured_us(a) for i, _, a in measured if i == best_i][0]
    if best_us > _measured_us(prev_attempt) * (1.0 - MOMENTUM_GAIN):
        return None  # a marginal gain: explore other knobs before walking further this way
    diff = [k for k in current[0] if current[0][k] != previous.get(k)]
    if len(diff) != 1:
        return None
    knob = diff[0]
    return knob, _direction(op, knob, previous[knob], current[0][knob])


def strategy_space(op: str, request: WriteRequest | None = None) -> list[dict[str, Any]]:
    """The curated, ordered list of points tried once the neighbourhood of the best is exhausted.
    For linear the order depends on the decode shape (`request`): split-K points first where few
    output features meet a long K."""
    points = STRATEGY_SPACES.get(op, [{}])
    if op == "linear" and request is not None:
        rows, k, _ = _rows_hidden(op, _shapes(request)[0])
        n = _out_features(request) or k
        long_k = k >= 4 * n
        points = sorted(points, key=lambda p: 0 if (p.get("SPLIT_K", 1) != 1) == long_k else 1)
    return [normalize(op, p) for p in points]


def choose_strategy(request: WriteRequest) -> dict[str, Any]:
    return plan_strategy(request).strategy


def _space(knobs_points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(p) for p in knobs_points]


_ROW_POINTS: list[dict[str, Any]] = [
    {},
    {"ROWS_PER_PROGRAM": 2},
    {"ROWS_PER_PROGRAM": 4},
    {"ROWS_PER_PROGRAM": 8, "NUM_WARPS": 8},
    {"ROWS_PER_PROGRAM": 16, "NUM_WARPS": 8},
    {"NUM_WARPS": 8},
    {"NUM_WARPS": 16},
    {"NUM_WARPS": 4},  # H 4096: ~64 registers, 8 programs (8 rows in flight) per SM
    {"ROWS_PER_PROGRAM": 2, "NUM_WARPS": 8},
    {"ROWS_PER_PROGRAM": 4, "NUM_WARPS": 8},
    {"MAX_PROGRAMS": 1056, "ROWS_PER_PROGRAM": 2},  # persistent: 8 programs per SM (132-SM H100/H200)
    {"MAX_PROGRAMS": 528, "ROWS_PER_PROGRAM": 4},
    {"MAX_PROGRAMS": 1056, "NUM_STAGES": 2},
    {"MAX_PROGRAMS": 2112, "ROWS_PER_PROGRAM": 2, "NUM_STAGES": 2},
    {"X_EVICTION": "evict_first"},
    {"ROWS_PER_PROGRAM": 2, "X_EVICTION": "evict_first"},
    {"BLOCK_H_MAX": 16384, "NUM_WARPS": 16},
    {"BLOCK_H_MAX": 4096, "CHUNK": 2048},
    {"BLOCK_H_MAX": 4096, "CHUNK": 4096, "NUM_WARPS": 8, "NUM_STAGES": 2},
    {"BLOCK_H_MAX": 2048, "CHUNK": 2048, "NUM_WARPS": 4},
    {"BLOCK_H_MAX": 2048, "CHUNK": 1024, "NUM_WARPS": 4, "MAX_PROGRAMS": 2112},
]
# layer_norm's lean single-pass point: one paired reduction, weight/bias re-read per tile.
_LEAN_LN: dict[str, Any] = {"SHIFTED_STATS": True, "RELOAD_AFFINE": True}
_LAYER_NORM_POINTS: list[dict[str, Any]] = (
    _ROW_POINTS[:3]
    + [
        _LEAN_LN,
        {**_LEAN_LN, "ROWS_PER_PROGRAM": 2},
        {**_LEAN_LN, "NUM_WARPS": 4},
        {**_LEAN_LN, "ROWS_PER_PROGRAM": 2, "NUM_WARPS": 8},
        {**_LEAN_LN, "MAX_PROGRAMS": 1056},
        {"RELOAD_AFFINE": True},
        {"SHIFTED_STATS": True},
        {"SHIFTED_STATS": True, "MAX_PROGRAMS": 2112},
        {"SHIFTED_STATS": True, "BLOCK_H_MAX": 2048, "CHUNK": 2048},
        {"SHIFTED_STATS": True, "ROWS_PER_PROGRAM": 2},
    ]
    + _ROW_POINTS[3:]
)
# linear decode points (GEMV); prefill shapes move the matmul knobs through the neighbourhood.
_SMALL_TILE = {"BLOCK_M": 16, "MM_BLOCK_K": 128, "MM_WARPS": 4}  # batched decode on tensor cores
_LINEAR_POINTS: list[dict[str, Any]] = [
    {},
    {"BLOCK_N": 4, "BLOCK_K": 512},
    {"BLOCK_N": 8, "BLOCK_K": 512},
    {"BLOCK_N": 16, "BLOCK_K": 512},
    {"BLOCK_N": 8, "BLOCK_K": 512, "SPLIT_K": 4},
    {"BLOCK_N": 4, "BLOCK_K": 256, "SPLIT_K": 4},
    {"BLOCK_N": 16, "BLOCK_K": 512, "SPLIT_K": 4},
    {"BLOCK_N": 32, "BLOCK_K": 256},
    {"BLOCK_N": 4, "BLOCK_K": 512, "GEMV_WARPS": 8},
    {"BLOCK_N": 16, "BLOCK_K": 256, "DEFER_REDUCE": False},
    {"BLOCK_N": 64, "BLOCK_K": 256, "W_EVICTION": "evict_first"},
    {"BLOCK_N": 8, "BLOCK_K": 256, "SPLIT_K": 0},
    {**_SMALL_TILE, "MM_BLOCK_N": 16, "NUM_STAGES": 5},
    {**_SMALL_TILE, "MM_BLOCK_N": 32, "NUM_STAGES": 3},
    {**_SMALL_TILE, "MM_BLOCK_N": 16, "NUM_STAGES": 5, "MM_SPLIT_K": 4},
    {**_SMALL_TILE, "MM_BLOCK_N": 64, "MM_BLOCK_K": 256, "NUM_STAGES": 3},
    {"GEMV_MAX_ROWS": 16, "BLOCK_N": 4, "BLOCK_K": 256},  # batches up to 16 in the GEMV instead
]
# Strategy spaces per family: ordered points (partial: missing knobs keep the template default).
STRATEGY_SPACES: dict[str, list[dict[str, Any]]] = {
    **{op: _space(_ROW_POINTS) for op in ROW_FAMILIES},
    "layer_norm": _space(_LAYER_NORM_POINTS),
    **{
        op: _space(
            [
                {},
                {"BLOCK_SIZE": 4096},
                {"BLOCK_SIZE": 1024},
                {"BLOCK_SIZE": 8192, "NUM_WARPS": 16},
                {"BLOCK_SIZE": 4096, "NUM_WARPS": 8},
                {"BLOCK_SIZE": 2048, "NUM_WARPS": 4},
                {"X_EVICTION": "evict_first"},
                {"FLAT": False},
                {"BLOCK_SIZE": 512, "NUM_WARPS": 2},
            ]
        )
        for op in GATED_FAMILIES
    },
    "linear": _space(_LINEAR_POINTS),
    "rope": _space(
        [
            {},
            {"NUM_WARPS": 2},
            {"TOKENS_PER_PROGRAM": 2},
            {"TOKENS_PER_PROGRAM": 4},
            {"TOKENS_PER_PROGRAM": 2, "NUM_WARPS": 4},
            {"MAX_PROGRAMS": 1056},
            {"FLAT_ROWS": 16},
            {"FLAT_ROWS": 32, "NUM_WARPS": 4},
            {"HEAD_BLOCK": 8, "NUM_WARPS": 2},
            {"HEAD_BLOCK": 8},
            {"HEAD_BLOCK": 4, "NUM_WARPS": 2},
            {"NUM_WARPS": 1},
            {"NUM_WARPS": 8},
            {"TOKENS_PER_PROGRAM": 8, "NUM_WARPS": 8},
            {"HEAD_BLOCK": 16, "NUM_WARPS": 4},
        ]
    ),
}


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
