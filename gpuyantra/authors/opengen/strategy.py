"""The tunables of an open-target file (its `# strategy:begin/end` block) and the points to try."""

from __future__ import annotations

from typing import Any

DEFAULT: dict[str, Any] = {
    "BLOCK_R_MAX": 8192,  # reduced rows up to this width are held in registers (one read of x)
    "CHUNK": 2048,  # slice width of the chunked passes over wider rows
    "TILE": 4096,  # elements per program in row kernels (rows per program = TILE // block)
    "FLAT_BLOCK": 1024,  # elements per program in elementwise kernels
    # Elementwise kernels of window gathers (pooling): smaller programs, one warp per 128 elements.
    # Measured on an H200 (KernelBench max/avg pooling 1-3-D): 256 beats 1024 by 1.1-1.45x
    "GATHER_BLOCK": 256,
    # Folds over a non-last dim: consecutive rows of the contiguous dim per program. Measured on an
    # H200 (sum/max/argmax over dim 1 of [128, 4096, 4095]): 64 is 1.2-1.5x faster than 32
    "INNER_ROWS": 64,
    # Scans over rows wider than BLOCK_R_MAX: slice width and elements per program (one row each).
    # Measured on an H200 (reverse and exclusive cumsum, rows of 32,768): 1.0-1.7x over CHUNK/TILE
    "SCAN_CHUNK": 1024,
    "SCAN_TILE": 1024,
    "NUM_WARPS": 0,  # 0: from the tile size (one warp per 256 elements, 1 to 8)
    "SPLIT_PARTS": 1024,  # full reductions: at most this many partial programs
    "SPLIT_CHUNK": 8192,  # full reductions: at least this many elements per partial program
    # matmul kernels (H100/H200-class defaults; written into files that have one)
    "MM_BLOCK_M": 128,  # rows per tile for 16-bit operands (float32 IEEE: half)
    "MM_BLOCK_N": 128,  # columns per tile for 16-bit operands (float32 IEEE: half)
    "MM_BLOCK_K": 32,  # K per step of the tile loop
    "MM_GROUP_M": 8,  # row tiles per swizzle group
    "MM_WARPS": 0,  # 0: from the tile (8 for 128x128, 4 for 64x64)
    "MM_STAGES": 3,  # software pipelining depth of the K loop
    # float32 products as three TF32 tensor-core products (1) or IEEE products on the FMA units (0).
    # Measured on an H200: 30 float32 matmul and convolution problems all within the verifier's
    # float32 tolerance, convolutions 6-29x faster than with IEEE products
    "MM_F32_TC": 1,
    "MM_SPLIT_K": 0,  # K slices (0: auto, when the tiles alone leave the GPU idle)
    "MM_PROGRAMS": 264,  # auto split-K: programs to aim for (2 per SM on a 132-SM H100/H200)
    "GEMV_MAX": 4,  # products with at most this many rows or columns take the GEMV path
    # GEMV: K per step and elements of the broadcast product per step (rows x K x columns).
    # Measured on an H200 (2048 x 1,048,576 float32 by a vector): 512 and 16384 read at 2.1x the
    # speed of 128 and 8192 (longer contiguous runs per row)
    "GEMV_BLOCK_K": 512,
    "GEMV_TILE": 16384,
}
# The knobs only matmul kernels read: written into the files that have one.
MATMUL_KNOBS = frozenset(k for k in DEFAULT if k.startswith(("MM_", "GEMV_")))
COMMENTS = {
    "BLOCK_R_MAX": "reduced rows up to this (power-of-2) width stay in registers: one pass over memory",
    "CHUNK": "slice width of the chunked passes over wider rows",
    "TILE": "elements per program in row kernels (rows per program = TILE // block)",
    "FLAT_BLOCK": "elements per program in elementwise kernels",
    "GATHER_BLOCK": "elements per program in elementwise kernels of window gathers (pooling)",
    "INNER_ROWS": "folds over a non-last dim: rows of the contiguous kept dim per program (coalesced columns)",
    "NUM_WARPS": "0: from the tile size (one warp per 256 elements, 1 to 8)",
    "SCAN_CHUNK": "scans over rows wider than BLOCK_R_MAX: slice width",
    "SCAN_TILE": "scans over rows wider than BLOCK_R_MAX: elements per program (rows = SCAN_TILE // SCAN_CHUNK)",
    "SPLIT_PARTS": "full reductions: at most this many partial programs (then one program folds them)",
    "SPLIT_CHUNK": "full reductions: at least this many elements per partial program",
    "MM_BLOCK_M": "matmul: rows per tile for 16-bit operands (float32, IEEE products: half)",
    "MM_BLOCK_N": "matmul: columns per tile for 16-bit operands (float32, IEEE products: half)",
    "MM_BLOCK_K": "matmul: K per step of the tile loop",
    "MM_GROUP_M": "matmul: row tiles per swizzle group (neighbouring programs share operand tiles in L2)",
    "MM_WARPS": "matmul: num_warps (0: from the tile, 8 for 128x128, 4 for 64x64)",
    "MM_STAGES": "matmul: software pipelining depth of the K loop",
    "MM_F32_TC": (
        "matmul: float32 operands on tensor cores, each split into a TF32 high and low part and three "
        "products summed in float32 (the low parts' product dropped); 0: IEEE products on the FMA units"
    ),
    "MM_SPLIT_K": "matmul: K slices summed by a second launch (0: auto, when the tiles leave the GPU idle)",
    "MM_PROGRAMS": "matmul: programs the auto split-K aims for (2 per SM on a 132-SM H100/H200)",
    "GEMV_MAX": "matmul: at most this many rows or columns take the GEMV path (bandwidth-bound)",
    "GEMV_BLOCK_K": "GEMV: K per step",
    "GEMV_TILE": "GEMV: elements of the broadcast product per step (rows x K x columns)",
}
KNOBS: dict[str, list[int]] = {
    "BLOCK_R_MAX": [1024, 2048, 4096, 8192, 16384],
    "CHUNK": [512, 1024, 2048, 4096, 8192],
    "TILE": [1024, 2048, 4096, 8192, 16384],
    "FLAT_BLOCK": [256, 512, 1024, 2048, 4096],
    "GATHER_BLOCK": [64, 128, 256, 512, 1024],
    "INNER_ROWS": [8, 16, 32, 64, 128],
    "SCAN_CHUNK": [256, 512, 1024, 2048, 4096],
    "SCAN_TILE": [1024, 2048, 4096, 8192],
    "NUM_WARPS": [0, 1, 2, 4, 8, 16],
    "SPLIT_PARTS": [128, 256, 512, 1024, 2048],
    "SPLIT_CHUNK": [2048, 4096, 8192, 16384, 32768],
    "MM_BLOCK_M": [32, 64, 128, 256],
    "MM_BLOCK_N": [32, 64, 128, 256],
    "MM_BLOCK_K": [16, 32, 64, 128],
    "MM_GROUP_M": [1, 4, 8, 16],
    "MM_WARPS": [0, 2, 4, 8],
    "MM_STAGES": [1, 2, 3, 4, 5],
    "MM_F32_TC": [0, 1],
    "MM_SPLIT_K": [0, 1, 2, 4, 8, 16, 32],
    "MM_PROGRAMS": [132, 264, 528],
    "GEMV_MAX": [0, 1, 2, 4, 8, 16],
    "GEMV_BLOCK_K": [32, 64, 128, 256, 512, 1024],
    "GEMV_TILE": [2048, 4096, 8192, 16384, 32768],
}
# Knobs kept where a strategy gives them and never defaulted: which part runs in torch's library.
# LIBRARY_CONV 1: the forward's leading convolution through torch.nn.functional, the rest in Triton
# (library_conv.py); 0: everything in Triton. Only targets that start with a convolution have it.
LIBRARY_KNOBS: dict[str, list[int]] = {"LIBRARY_CONV": [0, 1]}
COMMENTS["LIBRARY_CONV"] = "1: the leading convolution runs in torch's library (cuDNN), the rest in Triton"
# Knobs whose value must be one of KNOBS' (counts, not tile sizes); the others are powers of 2.
_CHOICES = frozenset({"NUM_WARPS", "MM_WARPS", "MM_STAGES", "MM_F32_TC", "MM_SPLIT_K", "MM_PROGRAMS", "GEMV_MAX"})
MAX_POINTS = 8


def normalize(strategy: dict[str, Any] | None) -> dict[str, Any]:
    """`strategy` restricted to the known knobs (ints, powers of 2 for sizes), defaults elsewhere."""
    out = dict(DEFAULT)
    for key, value in (strategy or {}).items():
        if key not in DEFAULT or isinstance(value, bool) or not isinstance(value, int):
            continue
        if key in _CHOICES:
            if value not in KNOBS[key]:
                continue
        elif value < 1 or value & (value - 1):
            continue  # tile sizes must be powers of 2
        out[key] = value
    for key, values in LIBRARY_KNOBS.items():
        value = (strategy or {}).get(key)
        if value in values and not isinstance(value, bool):
            out[key] = value
    return out


def points(features: set[str]) -> list[dict[str, Any]]:
    """The default first, then one-knob moves on the knobs the kernels use. `features`: "rows"
    (row kernels), "inner" (folds over a non-last dim), "split" (split full reductions), "flat"
    (elementwise kernels), "gather" (elementwise kernels of window gathers), "scan" (scans over wide rows),
    "matmul" (matmul kernels)."""
    groups = {
        "matmul": [
            ("MM_BLOCK_K", 64),
            ("MM_BLOCK_M", 64),
            ("MM_STAGES", 4),
            ("MM_BLOCK_N", 256),
            ("MM_WARPS", 4),
            ("MM_SPLIT_K", 1),
            ("MM_F32_TC", 0),  # IEEE products: where tensor-core float32 misses the tolerance or speed
        ],
        "rows": [("TILE", 8192), ("BLOCK_R_MAX", 16384), ("TILE", 2048), ("CHUNK", 4096), ("BLOCK_R_MAX", 4096)],
        "inner": [("INNER_ROWS", 128), ("INNER_ROWS", 32)],
        "scan": [("SCAN_CHUNK", 2048), ("SCAN_TILE", 4096)],
        "gather": [("GATHER_BLOCK", 512), ("GATHER_BLOCK", 128)],
        "split": [("SPLIT_PARTS", 512), ("SPLIT_CHUNK", 32768)],
        "flat": [("FLAT_BLOCK", 2048), ("FLAT_BLOCK", 512), ("FLAT_BLOCK", 4096)],
    }
    order = ("matmul", "rows", "inner", "scan", "split", "flat", "gather")
    queues = [list(groups[f]) for f in order if f in features]
    moves: list[tuple[str, int]] = []
    while any(queues):  # round-robin, so every kind of kernel gets tried early
        for q in queues:
            if q:
                moves.append(q.pop(0))
    if features - {"matmul"}:  # NUM_WARPS is read by the row and elementwise kernels only
        moves += [("NUM_WARPS", 8), ("NUM_WARPS", 2)]
    out = [dict(DEFAULT)]
    for key, value in moves:
        point = {**DEFAULT, key: value}
        if point not in out:
            out.append(point)
        if len(out) >= MAX_POINTS:
            break
    return out


def distance(a: dict[str, Any], b: dict[str, Any]) -> int:
    """Steps between two points along the knobs' value lists."""
    total = 0
    for key, values in KNOBS.items():
        va, vb = a.get(key, DEFAULT[key]), b.get(key, DEFAULT[key])
        if va == vb:
            continue
        total += abs(values.index(va) - values.index(vb)) if va in values and vb in values else 1
    # Library or Triton convolution: a different program, farther than any tile move.
    total += sum(8 for key in LIBRARY_KNOBS if a.get(key) != b.get(key))
    return total
