"""The offline template author's first write: the seed skill's strategy when the request carries
one (`seed_strategy`, else parsed from `seed_source`), else a heuristic start from the shapes, dtype
and hardware (rows per program for small H, chunked loops for wide rows, interpreter-friendly
tiles on CPU, the linear GEMV / 16-row / prefill tiles of an H200 sweep, one start per regime).

Kept apart from the feedback-driven search (template_search.py), which falls back to it.
"""

from __future__ import annotations

from typing import Any

from gpuyantra.authors.base import WriteRequest
from gpuyantra.authors.template_render import default_strategy, parse_strategy
from gpuyantra.authors.template_space import (
    GATED_FAMILIES,
    ROW_FAMILIES,
    linear_out_features,
    linear_regime,
    pow2,
    request_shapes,
    rows_hidden,
)


def _itemsize(dtype: str) -> int:
    name = str(dtype).replace("torch.", "")
    return {"float32": 4, "float": 4, "float64": 8, "double": 8}.get(name, 2)


def _linear_initial(strategy: dict[str, Any], rows: list[int], k: int, n: int, itemsize: int, cpu: bool) -> None:
    """First linear point: every regime gets its own start, since the served kernel meets every
    row count whatever shapes were verified; the verified `rows` size the prefill tiles.

    CPU: interpreter-friendly tiles (few, wide programs). GPU, from an H200 sweep of Qwen2.5-1.5B's
    decode projections (bf16, CUDA-graph replay, weights from HBM):
    * 1-4 rows, the unrolled GEMV over 512-wide K steps, weights evicted first, one warp per output
      feature, no K split: 4 features per program for N < 8192 (q/k/v 3.6 us, o_proj 3.2 us vs
      cuBLAS 5.5-9.4 / 6.5), 2 for gate/up and lm_head and for a long K (gate/up 14.1 us, 96 % of
      copy bandwidth, vs 17.2; down_proj 8.2 us, 82 %, vs 11.8); 2-4 rows the looped GEMV (the
      unrolled one with 4 rows: gate/up 21.6, down 18.0 us, against cuBLAS 17.2 / 11.8);
    * 5-16 rows, a 16-row tl.dot tile over 16 output features (N < 8192), or its transposed form over
      64 (N >= 8192, or a K at least 4 N), K 128 per step
      (batch 8: q/k/v 5.8, o 5.2, gate/up 16.3, lm_head 112 us, cuBLAS 5.8 / 5.2 / 17.7 / 116), K split
      automatically (none at K 1536, as measured; a long K with few tiles is split);
    * prefill, 64-row tiles over 64 output features (54 rows: q/k/v 7.1, o 6.6, down 12.7, gate/up
      17.9 us vs cuBLAS 5.9 / 5.3 / 12.5 / 18.0), 128-row tiles from 512 rows, K split automatically
      where the tiles are few."""
    strategy.update(GEMV_MAX_ROWS=4, SMALL_MAX_ROWS=16)
    prefill_rows = max([r for r in rows if linear_regime(strategy, r) == "big"], default=0)
    if cpu:
        strategy.update(BLOCK_N=256, BLOCK_K=512, SPLIT_K=1)
        strategy.update(SMALL_BLOCK_N=128, SMALL_BLOCK_K=64, SMALL_SPLIT_K=1)
        strategy.update(BLOCK_M=64, MM_BLOCK_N=128, MM_BLOCK_K=64, MM_SPLIT_K=1)
        return
    _linear_gemv_start(strategy, k, n, itemsize)
    _linear_small_rows_start(strategy, k, n)
    _linear_big_tiles_start(strategy, prefill_rows)


def _linear_gemv_start(strategy: dict[str, Any], k: int, n: int, itemsize: int) -> None:
    # Unrolled per-row sums (H200: the looped kernel's best was q/k/v 4.5, o 4.0, gate/up 17.5, down
    # 10.8 us); within 2 % of each shape's best of 44-60 unrolled points.
    strategy.update(DEFER_REDUCE=True, GEMV_UNROLL=True, GEMV_UNROLL_ROWS=1, SPLIT_K=1, W_EVICTION="evict_first")
    strategy["BLOCK_K"] = 512 if itemsize <= 2 else 256
    features = 2 if k >= 4 * n or n >= 8192 else 4  # down_proj and gate/up 2 (8.2, 14.1 us), q/k/v and o 4
    strategy.update(BLOCK_N=features, GEMV_WARPS=features)


def _linear_small_rows_start(strategy: dict[str, Any], k: int, n: int) -> None:
    # H200, bf16, batch 8, CUDA-graph replays over weight copies (`gpu_session.sh linear-b8-grid`, 36
    # points a shape): wide N (gate/up 17920x1536) and a long K (down_proj 1536x8960) run best as the
    # transposed tile over 64 features (gate/up 15.6 us vs 16.3 untransposed and cuBLAS 17.3; down 11.0
    # with K 256 vs 11.2 and cuBLAS 11.0); q/k/v and o_proj within 1 % of their best untransposed at 16.
    wide, long_k = n >= 8192, k >= 4 * n
    strategy.update(SMALL_SPLIT_K=0, SMALL_WARPS=4)
    if wide or long_k:
        strategy.update(SMALL_SWAP_AB=True, SMALL_BLOCK_N=64, SMALL_BLOCK_K=256 if long_k else 128)
        strategy["SMALL_STAGES"] = 4 if long_k else 3
    else:
        strategy.update(SMALL_SWAP_AB=False, SMALL_BLOCK_N=16, SMALL_BLOCK_K=128, SMALL_STAGES=5)


def _linear_big_tiles_start(strategy: dict[str, Any], prefill_rows: int) -> None:
    big = prefill_rows >= 512
    strategy.update(
        BLOCK_M=128 if big else 64,
        MM_BLOCK_N=128 if big else 64,  # 64 was the best point of every 54-row projection measured
        MM_BLOCK_K=64,
        MM_SPLIT_K=0,
        MM_WARPS=8 if big else 4,
        NUM_STAGES=4,
    )


def initial_strategy(request: WriteRequest) -> dict[str, Any]:
    """A sensible first point from the shapes, dtype and hardware (no feedback yet)."""
    op = request.op
    strategy = default_strategy(op)
    shapes = request_shapes(request)
    dims = [rows_hidden(op, s) for s in shapes]
    max_rows = max(d[0] for d in dims)
    hidden = max(d[1] for d in dims)
    cpu = str(request.hardware).lower().startswith("cpu")
    if op == "linear":
        n = linear_out_features(request) or hidden
        _linear_initial(strategy, [d[0] for d in dims], hidden, n, _itemsize(request.dtype), cpu)
        return strategy
    if op in ROW_FAMILIES:
        block = pow2(hidden)
        if block > strategy["BLOCK_H_MAX"]:
            # Wide rows: chunked loop; smaller slices for 4-byte types keep registers in check.
            strategy["CHUNK"] = 2048 if _itemsize(request.dtype) >= 4 else 4096
        if cpu:
            # The interpreter runs programs one after another: fewer, taller tiles verify faster.
            strategy["ROWS_PER_PROGRAM"] = max(1, min(32, 16384 // block, pow2(max_rows)))
        elif max_rows >= 64:
            # Small H (head-dim norms, small models): several rows per program amortize the
            # weight load and the per-program cost; 4096-wide and up keep one row per program.
            strategy["ROWS_PER_PROGRAM"] = max(1, min(16, 2048 // block))
    elif op in GATED_FAMILIES:
        if cpu:
            strategy["BLOCK_SIZE"] = 16384
    return strategy


def seed_point(request: WriteRequest) -> dict[str, Any] | None:
    if request.seed_strategy:
        return dict(request.seed_strategy)
    if request.seed_source:
        parsed = parse_strategy(request.seed_source)
        return parsed or None
    return None
