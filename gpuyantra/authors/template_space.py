"""The offline template author's strategy spaces: each family's knobs (value lists ordered so that
neighbours are one step apart), the curated points tried once a neighbourhood is exhausted, and the
canonical form under which points that launch the same kernels for the request's shapes are twins.

The shape helpers here mirror what each template's entry computes (rows, hidden size, heads,
automatic num_warps, the linear GEMV's K split); the first strategy (template_start.py) and the
search (template_search.py) read them.
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
    s["GEMV_ROWS"] = min(s["GEMV_ROWS"] or s["GEMV_MAX_ROWS"], pow2(rows))
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
    For linear the order depends on the decode shape (`request`): split-K points first where few
    output features meet a long K."""
    points = STRATEGY_SPACES.get(op, [{}])
    if op == "linear" and request is not None:
        rows, k, _ = rows_hidden(op, request_shapes(request)[0])
        n = linear_out_features(request) or k
        long_k = k >= 4 * n
        points = sorted(points, key=lambda p: 0 if (p.get("SPLIT_K", 1) != 1) == long_k else 1)
    return [normalize(op, p) for p in points]


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
