"""The offline template author's strategy spaces: each family's knobs (value lists ordered so that
neighbours are one step apart), the curated points tried once a neighbourhood is exhausted, and the
canonical form under which points that launch the same kernels for the request's shapes are twins.

The shape helpers here mirror what each template's entry computes (rows, hidden size, heads,
automatic num_warps, the linear template's regime and K split per row count); the first strategy
(template_start.py) and the search (template_search.py) read them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gpuyantra.authors.base import WriteRequest
from gpuyantra.authors.template_render import normalize

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
# linear: three regimes by rows (template docstring), each with its own knobs. Knobs the search's
# priority lists do not name are walked in this order: batched decode first, then prefill.
LINEAR_KNOBS: dict[str, list[Any]] = {
    "GEMV_MAX_ROWS": [1, 2, 4, 8, 16, 32],
    "GEMV_ROWS": [0, 1, 2, 4, 8, 16],  # 0: every row in one program
    "BLOCK_N": [4, 8, 16, 32, 64, 128, 256],
    "BLOCK_K": [32, 64, 128, 256, 512, 1024],
    "SPLIT_K": [0, 1, 2, 3, 4, 6, 8, 12, 16],  # 0: auto (TARGET_PROGRAMS)
    "GEMV_WARPS": [1, 2, 4, 8, 16],
    "W_EVICTION": ["", "evict_first"],
    "DEFER_REDUCE": [False, True],
    "GEMV_UNROLL": [True, False],
    "GEMV_UNROLL_ROWS": [1, 2, 4],
    "SMALL_SPLIT_K": [0, 1, 2, 3, 4, 6, 8, 12, 16],  # 0: auto (TARGET_PROGRAMS)
    "SMALL_BLOCK_N": [16, 32, 64, 128, 256],
    "SMALL_BLOCK_K": [32, 64, 128, 256, 512],
    "SMALL_STAGES": [1, 2, 3, 4, 5],
    "SMALL_WARPS": [2, 4, 8],
    "SMALL_SWAP_AB": [False, True],
    "TARGET_PROGRAMS": [132, 264, 528, 1056],
    "SMALL_MAX_ROWS": [8, 16, 32, 64],
    "MM_SPLIT_K": [0, 1, 2, 3, 4, 6, 8],  # 0: auto (TARGET_PROGRAMS)
    "BLOCK_M": [16, 32, 64, 128],
    "MM_BLOCK_N": [16, 32, 64, 128, 256],
    "MM_BLOCK_K": [32, 64, 128, 256],
    "GROUP_M": [1, 4, 8, 16],
    "MM_WARPS": [2, 4, 8],
}
# The knobs each linear regime reads (TARGET_PROGRAMS and the row bounds aside), and its K split.
LINEAR_REGIME_KNOBS: dict[str, tuple[str, ...]] = {
    "gemv": (
        "GEMV_ROWS",
        "BLOCK_N",
        "BLOCK_K",
        "SPLIT_K",
        "GEMV_WARPS",
        "W_EVICTION",
        "DEFER_REDUCE",
        "GEMV_UNROLL",
        "GEMV_UNROLL_ROWS",
    ),
    "small": ("SMALL_BLOCK_N", "SMALL_BLOCK_K", "SMALL_SPLIT_K", "SMALL_WARPS", "SMALL_STAGES", "SMALL_SWAP_AB"),
    "big": ("BLOCK_M", "MM_BLOCK_N", "MM_BLOCK_K", "MM_SPLIT_K", "GROUP_M", "MM_WARPS", "NUM_STAGES"),
}
LINEAR_SPLIT_KNOB = {"gemv": "SPLIT_K", "small": "SMALL_SPLIT_K", "big": "MM_SPLIT_K"}
# Constants of the linear template (gpuyantra/kernels/linear.py) that its K split reads.
LINEAR_SMALL_BLOCK_M = 16
LINEAR_GEMV_MIN_SLICE_STEPS = 4
LINEAR_MATMUL_MIN_SLICE_STEPS = 8
LINEAR_MAX_SLICES = 64
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


# --------------------------------------------------------------------------- shapes and canonical forms


def pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def rows_hidden(op: str, shape: Sequence[int]) -> tuple[int, int, int]:
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


def request_shapes(request: WriteRequest) -> list[list[int]]:
    return [list(s) for s in request.shapes if s] or [[1, 4096]]


def auto_warps(op: str, strategy: dict[str, Any], shape: Sequence[int]) -> int:
    """num_warps the template picks by itself for NUM_WARPS = 0 (mirrors each template's entry)."""
    rows, hidden, heads = rows_hidden(op, shape)
    if op in ROW_FAMILIES:
        block = pow2(hidden)
        elems = block * strategy["ROWS_PER_PROGRAM"] if block <= strategy["BLOCK_H_MAX"] else strategy["CHUNK"]
        return max(1, min(16, elems // 512))
    if op in GATED_FAMILIES:
        return max(1, min(16, strategy["BLOCK_SIZE"] // 256))
    if op == "rope":
        if strategy.get("FLAT_ROWS"):
            return max(1, min(8, strategy["FLAT_ROWS"] * pow2(hidden // 2) // 128))
        kv_heads = heads // 4 if heads % 4 == 0 else heads  # the families' grouped-query k
        hbq, hbk = pow2(heads), pow2(kv_heads)
        if strategy["HEAD_BLOCK"]:
            hbq, hbk = min(hbq, strategy["HEAD_BLOCK"]), min(hbk, strategy["HEAD_BLOCK"])
        tokens = min(strategy.get("TOKENS_PER_PROGRAM", 1), pow2(rows))
        if hbq >= heads and hbk >= kv_heads:  # one tile per tensor
            return max(1, min(8, tokens * hbq * pow2(hidden // 2) // 512))
        return max(1, min(8, tokens * hbq * pow2(hidden // 2) // 128))
    return 4


def linear_out_features(request: WriteRequest) -> int | None:
    """N of a linear target (its live weight's rows), when the request carries it."""
    weight = (request.param_shapes or {}).get("weight")
    return int(weight[0]) if weight else None


def linear_regime(strategy: dict[str, Any], rows: int) -> str:
    """Which of the linear template's kernels runs at `rows` rows: "gemv", "small" or "big"."""
    if rows <= strategy["GEMV_MAX_ROWS"]:
        return "gemv"
    return "small" if rows <= strategy["SMALL_MAX_ROWS"] else "big"


def _k_slices(k: int, block_k: int, split: int, tiles: int, min_steps: int, target: int) -> int:
    """K slices launched for `split` asked (0: auto) over `tiles` output tiles (the template's `_k_slices`)."""
    k_blocks = -(-k // block_k)
    if split == 0:
        split = max(1, min(k_blocks // min_steps, target // max(1, tiles), LINEAR_MAX_SLICES))
    k_per_split = -(-k_blocks // min(split, k_blocks)) * block_k
    return -(-k // k_per_split)


def linear_split(strategy: dict[str, Any], n: int, k: int, rows: int = 1) -> int:
    """The number of K slices the linear template launches for `rows` rows of N x K."""
    s, target = strategy, strategy["TARGET_PROGRAMS"]
    regime = linear_regime(s, rows)
    if regime == "gemv":
        return _k_slices(k, s["BLOCK_K"], s["SPLIT_K"], -(-n // s["BLOCK_N"]), LINEAR_GEMV_MIN_SLICE_STEPS, target)
    if regime == "small":
        tiles = -(-rows // LINEAR_SMALL_BLOCK_M) * -(-n // s["SMALL_BLOCK_N"])
        return _k_slices(k, s["SMALL_BLOCK_K"], s["SMALL_SPLIT_K"], tiles, LINEAR_MATMUL_MIN_SLICE_STEPS, target)
    tiles = -(-rows // s["BLOCK_M"]) * -(-n // s["MM_BLOCK_N"])
    return _k_slices(k, s["MM_BLOCK_K"], s["MM_SPLIT_K"], tiles, LINEAR_MATMUL_MIN_SLICE_STEPS, target)


def _linear_canonical(s: dict[str, Any], rows: int, k: int, n: int) -> dict[str, Any]:
    """Only the regime that runs at `rows` matters: its knobs, the GEMV by its effective rows, and
    every K split by the slices it launches (TARGET_PROGRAMS only steers automatic splits)."""
    regime = linear_regime(s, rows)
    s[LINEAR_SPLIT_KNOB[regime]] = linear_split(s, n, k, rows)
    if regime == "gemv":
        s["GEMV_ROWS"] = min(s["GEMV_ROWS"] or s["GEMV_MAX_ROWS"], pow2(rows))
    for other, knobs in LINEAR_REGIME_KNOBS.items():
        if other != regime:
            for knob in knobs:
                s[knob] = None
    s["TARGET_PROGRAMS"] = None
    s["GEMV_MAX_ROWS"] = s["SMALL_MAX_ROWS"] = regime
    return s


def canonical(
    op: str, strategy: dict[str, Any], shapes: Sequence[Sequence[int]], out_features: int | None = None
) -> str:
    """A key equal for strategies that launch the same kernels with the same settings on `shapes`
    (`out_features`: a linear's N, which is not part of its activation shape; default N = K)."""
    per_shape = []
    for shape in shapes:
        s = dict(strategy)
        rows, hidden, heads = rows_hidden(op, shape)
        if op == "linear":
            s = _linear_canonical(s, rows, hidden, out_features or hidden)
        elif op in ROW_FAMILIES:
            chunked = pow2(hidden) > s["BLOCK_H_MAX"]
            if chunked:
                programs = rows
            else:
                # The templates shrink the row tile to the rows there are.
                s["ROWS_PER_PROGRAM"] = min(s["ROWS_PER_PROGRAM"], pow2(rows))
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
            tokens = min(s.get("TOKENS_PER_PROGRAM", 1), pow2(rows))
            s["TOKENS_PER_PROGRAM"] = None if s.get("FLAT_ROWS") else tokens
            if s["HEAD_BLOCK"] >= pow2(heads) or s.get("FLAT_ROWS"):
                s["HEAD_BLOCK"] = 0
            if s["MAX_PROGRAMS"] >= -(-rows // tokens) or s.get("FLAT_ROWS"):
                s["MAX_PROGRAMS"] = 0
        per_shape.append(s)
    return json.dumps(per_shape, sort_keys=True, default=str)


# --------------------------------------------------------------------------- the curated points


def strategy_space(op: str, request: WriteRequest | None = None) -> list[dict[str, Any]]:
    """The curated, ordered list of points tried once the neighbourhood of the best is exhausted.
    For linear the order depends on the request's shapes (`_linear_order`)."""
    points = [normalize(op, p) for p in STRATEGY_SPACES.get(op, [{}])]
    if op == "linear" and request is not None:
        keys = [_linear_order(raw, full, request) for raw, full in zip(STRATEGY_SPACES[op], points)]
        points = [p for _, p in sorted(zip(keys, points), key=lambda kp: kp[0])]
    return points


def _linear_order(raw: dict[str, Any], point: dict[str, Any], request: WriteRequest) -> tuple[int, int]:
    """Points that move the knobs of a regime the shapes run first (the empty point counts), then
    split-K points first where few output features meet a long K, unsplit ones first elsewhere."""
    dims = [rows_hidden("linear", shape) for shape in request_shapes(request)]
    k = dims[0][1]
    n = linear_out_features(request) or k
    regimes = {linear_regime(point, rows) for rows, _, _ in dims}
    moves_used = not raw or any(knob in raw for regime in regimes for knob in LINEAR_REGIME_KNOBS[regime])
    splits = any(linear_split(point, n, k, rows) > 1 for rows, _, _ in dims)
    return (0 if moves_used else 1, 0 if splits == (k >= 4 * n) else 1)


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
# linear points per regime: GEMV (decode), 16-row tiles (batched decode), big tiles (prefill).
_SMALL_TILE = {"SMALL_BLOCK_K": 128, "SMALL_WARPS": 4}
_BIG_TILE = {"BLOCK_M": 64, "MM_BLOCK_N": 128, "MM_BLOCK_K": 64, "NUM_STAGES": 4}
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
    {**_SMALL_TILE, "SMALL_BLOCK_N": 16, "SMALL_STAGES": 5},
    {**_SMALL_TILE, "SMALL_BLOCK_N": 32, "SMALL_STAGES": 3},
    {**_SMALL_TILE, "SMALL_BLOCK_N": 16, "SMALL_STAGES": 5, "SMALL_SPLIT_K": 1},
    {**_SMALL_TILE, "SMALL_BLOCK_N": 16, "SMALL_STAGES": 5, "SMALL_SPLIT_K": 4},
    {**_SMALL_TILE, "SMALL_BLOCK_N": 16, "SMALL_STAGES": 5, "TARGET_PROGRAMS": 528},
    {**_SMALL_TILE, "SMALL_BLOCK_N": 64, "SMALL_STAGES": 3},
    {"SMALL_BLOCK_N": 64, "SMALL_BLOCK_K": 256, "SMALL_STAGES": 3},
    {**_BIG_TILE, "MM_SPLIT_K": 0},
    {**_BIG_TILE, "MM_BLOCK_N": 64, "MM_SPLIT_K": 0},
    {**_BIG_TILE, "MM_SPLIT_K": 1},
    {**_BIG_TILE, "BLOCK_M": 128, "MM_WARPS": 8},
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
