#!/usr/bin/env python3
# Over 600 lines: a self-contained sweep of GEMV kernel variants, one script to copy to a GPU host.
"""Decode GEMV variants: which Triton formulation of y = x @ W.T reads the weights nearest copy speed.

x is [M, K] (M = 1 by default; 2 and 4 via --rows), W is [N, K] row-major, both 16-bit; products and
sums are float32, y is rounded once to x's dtype. For each decode projection of Qwen2.5-1.5B
(linear_gemv.DECODE_SHAPES: qkv with bias, o_proj, gate_up, down_proj, lm_head) it times

* cublas          - F.linear(x, w, b)
* template        - gpuyantra/kernels/linear.py's `entry` (`_gemv` + `_splitk_reduce`) at the module's
                    current knobs
* template_start  - the same at the offline author's start knobs for the shape
                    (gpuyantra/authors/template_start.py::_linear_gemv_start)
* static          - new: K is a constexpr and the K loop a tl.static_range (fully unrolled), so every
                    weight load of a program can be in flight at once; a program owns BLOCK_N rows of
                    W, keeps float32 per-lane sums ([BLOCK_N, BLOCK_K] per x row, in the weight
                    tile's own layout) and reduces once at the end
* splitk_sem      - new: the static loop over one of SPLIT slices of K; each program writes float32
                    partials to a cached workspace, counts itself in with an acq_rel atomic, and the
                    last one to arrive sums the SPLIT partials in a fixed order (deterministic), adds
                    the bias, stores y and resets the counter (so CUDA-graph replays need no memset)
* loop            - new: the static variant with a dynamic `range` K loop and num_stages 1/3/4
                    passed to the launch (does Triton pipeline these plain loads?)

each new variant over a grid of configs (BLOCK_N, BLOCK_K, num_warps, eviction hint, SPLIT or
num_stages), pruned of configs that cannot do well (under one 16-byte vector per thread, float32
per-lane sums past 64 registers a thread, fewer programs than SMs, a ragged K over few steps) and
capped at --max-configs per variant, most plausible first. Timing is linear_gemv's harness: one
call per weight copy captured in a CUDA graph (the copies together are several times the L2, so
weights come from HBM), replayed; a call's time is the replay time / calls. Bandwidth is bytes
moved (weight, x, y, bias) / time, as % of the measured copy bandwidth (bytes read + written of a
1 GiB device copy). Every config is checked against F.linear in float32, before and after its
timing (max abs error / max |ref| <= 2e-2, else rejected); configs that fail to compile are
recorded with a short error. --budget-s bounds the new variants' sweeps (each shape and row count
gets an equal share of what is left; configs are timed round-robin across variants, and those
left when a share runs out are listed as skipped). On a GPU, worker processes compile the
planned configs ahead of the timing loop (--compile-workers; 0 compiles in the loop).

Prints a table per shape and row count (best config of each method, us, % copy bandwidth, speed
vs cuBLAS) and writes JSON (--out) with every timed config, rewritten after each shape.

    python benchmarks/gemv_variants.py --out /tmp/gemv_variants.json
    python benchmarks/gemv_variants.py --shapes down_proj,gate_up --rows 1,2,4 --budget-s 300
    TRITON_INTERPRET=1 python benchmarks/gemv_variants.py --dry-run --out /tmp/gemv_dry.json

--dry-run runs tiny shapes (48x96; 20x130 with bias) at 1 and 3 rows on the CPU under Triton's
interpreter, plain loops instead of graphs, a handful of configs per variant (ragged K, a partial
N block, uneven splits with masked steps, every num_stages), and checks every result (exit 1 if any
config failed or was wrong).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__" and "--dry-run" in sys.argv[1:]:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # triton.jit reads it when the kernels below are defined

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from linear_gemv import (  # noqa: E402
    DECODE_SHAPES,
    measure_copy_bandwidth,
    projection_inputs,
    sync,
    time_calls,
)

# (name, N, K, bias): K 96 is three 32-wide steps; K 130 leaves a ragged tail; N 20 a partial block.
DRY_SHAPES = [("tiny", 48, 96, False), ("tiny_bias", 20, 130, True)]
VARIANTS = ("static", "splitk_sem", "loop")
REL_TOL = 2e-2  # max abs error / max |reference| above this rejects a config
SMS = 132  # H100/H200 multiprocessors: a grid smaller than this leaves SMs idle
MAX_LANES = 64  # float32 per-lane sums a thread may hold (ROWS * BLOCK_N * BLOCK_K / threads): more spill
MAX_SPLIT_PROGRAMS = 2048  # split-K only where the unsplit grid is small (down_proj, not gate_up)
BLOCK_NS = (1, 2, 4, 8, 16)
BLOCK_KS = (256, 512, 1024)
WARPS = (1, 2, 4, 8)
SPLITS = (2, 4, 8)
STAGES = (1, 3, 4)
EVICTS = ("evict_first", "")
TEMPLATE_KNOBS = (
    "GEMV_MAX_ROWS GEMV_ROWS BLOCK_N BLOCK_K SPLIT_K GEMV_WARPS W_EVICTION DEFER_REDUCE TARGET_PROGRAMS".split()
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gemv_variants.json", help="JSON output file")
    p.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    p.add_argument("--rows", default="", help="rows of x, comma-separated (default 1; dry run 1,3)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="new variants to sweep")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--budget-s", type=float, default=150.0, help="wall-clock seconds for the variant sweeps")
    p.add_argument("--max-configs", type=int, default=60, help="configs per variant, shape and row count")
    p.add_argument("--replays", type=int, default=20, help="graph replays per measurement")
    p.add_argument("--repeats", type=int, default=5, help="measurements per config (the median is kept)")
    p.add_argument("--compile-workers", type=int, default=-1, help="processes compiling ahead (-1: auto)")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (Triton's interpreter)")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------ kernels


# Each x row keeps its own [BLOCK_N, BLOCK_K] float32 lanes in the weight tile's own layout: a 3-D
# [ROWS, BLOCK_N, BLOCK_K] product makes Triton move every weight tile through shared memory (a
# layout conversion with barriers each step). Up to 4 rows (the template's GEMV_MAX_ROWS); the
# lanes of absent rows are never touched and compile away.


@triton.jit
def _load_row(X, r, stride_xm, ks, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MASKED: tl.constexpr):
    """x[r, ks] as a [BLOCK_N, BLOCK_K] tile (each row the same): a tile shaped like the weight's
    loads in the weight's layout, where a [BLOCK_K] vector would need a layout conversion (shared
    memory and barriers, which keep the next step's weight loads from issuing early). The repeated
    addresses hit L1."""
    ptrs = tl.broadcast_to((X + r * stride_xm + ks)[None, :], (BLOCK_N, BLOCK_K))
    if MASKED:
        x = tl.load(ptrs, mask=(ks < K)[None, :], other=0.0)
    else:
        x = tl.load(ptrs)
    return x.to(tl.float32)


@triton.jit
def _accumulate(
    l0,
    l1,
    l2,
    l3,
    X,
    w_ptrs,
    ks,
    K,
    stride_xm,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MASKED: tl.constexpr,
    EVICT: tl.constexpr,
):
    """One K step: the [BLOCK_N, BLOCK_K] weight tile times each x row, into per-lane sums."""
    if MASKED:
        w = tl.load(w_ptrs + ks[None, :], mask=(ks < K)[None, :], other=0.0, eviction_policy=EVICT)
    else:
        w = tl.load(w_ptrs + ks[None, :], eviction_policy=EVICT)
    w = w.to(tl.float32)
    l0 += _load_row(X, 0, stride_xm, ks, K, BLOCK_N, BLOCK_K, MASKED) * w
    if ROWS > 1:
        l1 += _load_row(X, 1, stride_xm, ks, K, BLOCK_N, BLOCK_K, MASKED) * w
    if ROWS > 2:
        l2 += _load_row(X, 2, stride_xm, ks, K, BLOCK_N, BLOCK_K, MASKED) * w
    if ROWS > 3:
        l3 += _load_row(X, 3, stride_xm, ks, K, BLOCK_N, BLOCK_K, MASKED) * w
    return l0, l1, l2, l3


@triton.jit
def _store_row(acc, r, B, Y, cols, N, HAS_BIAS: tl.constexpr):
    """Bias, the one rounding, y's row r. Columns past N were computed on a clamped row; dropped here."""
    if HAS_BIAS:
        acc += tl.load(B + tl.minimum(cols, N - 1)).to(tl.float32)
    tl.store(Y + r * N + cols, acc.to(Y.dtype.element_ty), mask=cols < N)


@triton.jit
def _split_row(l, r, pid_k, P, B, Y, cols, N, ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    if SPLIT == 1:
        _store_row(tl.sum(l, axis=1), r, B, Y, cols, N, HAS_BIAS)
    else:
        tl.store(P + (pid_k * ROWS + r) * N + cols, tl.sum(l, axis=1), mask=cols < N)


@triton.jit
def _reduce_row(r, P, B, Y, cols, N, ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    """Row r of y from the SPLIT partials, added in slice order whichever program arrived last."""
    # .cg: read at L2, where the other programs' partials are, never a stale L1 line
    part = P + r * N + cols
    total = tl.load(part, mask=cols < N, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLIT):
        total += tl.load(part + s * ROWS * N, mask=cols < N, other=0.0, cache_modifier=".cg")
    _store_row(total, r, B, Y, cols, N, HAS_BIAS)


@triton.jit
def _gemv_static(
    X,
    W,
    B,
    Y,
    P,
    C,
    N,
    stride_xm,
    stride_wn,
    K: tl.constexpr,
    SLICE: tl.constexpr,
    STEPS: tl.constexpr,
    FULL_STEPS: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVICT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Columns past N re-read row N-1 instead of masking every load; only a ragged K needs masks.
    w_ptrs = W + tl.minimum(cols, N - 1).to(tl.int64)[:, None] * stride_wn
    k0 = pid_k * SLICE
    l0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    l1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    l2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    l3 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    # Unrolled: no load waits on a loop counter, so the compiler can issue them all up front.
    for i in tl.static_range(STEPS):
        ks = k0 + i * BLOCK_K + tl.arange(0, BLOCK_K)
        # Steps below FULL_STEPS lie inside K in every slice (decided at compile time).
        l0, l1, l2, l3 = _accumulate(
            l0, l1, l2, l3, X, w_ptrs, ks, K, stride_xm, ROWS, BLOCK_N, BLOCK_K, i >= FULL_STEPS, EVICT
        )
    _split_row(l0, 0, pid_k, P, B, Y, cols, N, ROWS, HAS_BIAS, SPLIT)
    if ROWS > 1:
        _split_row(l1, 1, pid_k, P, B, Y, cols, N, ROWS, HAS_BIAS, SPLIT)
    if ROWS > 2:
        _split_row(l2, 2, pid_k, P, B, Y, cols, N, ROWS, HAS_BIAS, SPLIT)
    if ROWS > 3:
        _split_row(l3, 3, pid_k, P, B, Y, cols, N, ROWS, HAS_BIAS, SPLIT)
    if SPLIT > 1:
        tl.debug_barrier()  # every thread's partials are written before the arrival is published (release)
        arrived = tl.atomic_add(C + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT - 1:  # the last slice in: every partial is visible (acquire)
            for r in tl.static_range(ROWS):
                _reduce_row(r, P, B, Y, cols, N, ROWS, HAS_BIAS, SPLIT)
            tl.store(C + pid_n, 0)  # ready for the next launch (graph replay) without a memset


@triton.jit
def _gemv_loop(
    X,
    W,
    B,
    Y,
    N,
    K,
    stride_xm,
    stride_wn,
    TAIL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVICT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_ptrs = W + tl.minimum(cols, N - 1).to(tl.int64)[:, None] * stride_wn
    l0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    l1 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    l2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    l3 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    k_full = (K // BLOCK_K) * BLOCK_K
    for k in range(0, k_full, BLOCK_K):  # a runtime loop: pipelined (or not) per the launch's num_stages
        ks = k + tl.arange(0, BLOCK_K)
        l0, l1, l2, l3 = _accumulate(l0, l1, l2, l3, X, w_ptrs, ks, K, stride_xm, ROWS, BLOCK_N, BLOCK_K, False, EVICT)
    if TAIL:  # K % BLOCK_K != 0: one masked step
        ks = k_full + tl.arange(0, BLOCK_K)
        l0, l1, l2, l3 = _accumulate(l0, l1, l2, l3, X, w_ptrs, ks, K, stride_xm, ROWS, BLOCK_N, BLOCK_K, True, EVICT)
    _store_row(tl.sum(l0, axis=1), 0, B, Y, cols, N, HAS_BIAS)
    if ROWS > 1:
        _store_row(tl.sum(l1, axis=1), 1, B, Y, cols, N, HAS_BIAS)
    if ROWS > 2:
        _store_row(tl.sum(l2, axis=1), 2, B, Y, cols, N, HAS_BIAS)
    if ROWS > 3:
        _store_row(tl.sum(l3, axis=1), 3, B, Y, cols, N, HAS_BIAS)


# ------------------------------------------------------------------------------------------ configs


@dataclass(frozen=True)
class Config:
    variant: str  # static | splitk_sem | loop
    block_n: int
    block_k: int
    warps: int
    evict: str = ""
    split: int = 1
    stages: int = 0  # loop only: num_stages of the launch

    def label(self) -> str:
        text = f"BN{self.block_n} BK{self.block_k} w{self.warps}"
        if self.split > 1:
            text += f" S{self.split}"
        if self.stages:
            text += f" st{self.stages}"
        return text + (" ef" if self.evict else "")


@dataclass(frozen=True)
class Slices:
    """How a static-loop program walks K: SPLIT slices of SLICE elements, STEPS steps each, the
    first FULL_STEPS of which lie inside K in every slice (the rest are masked)."""

    split: int
    slice: int
    steps: int
    full_steps: int


def slices(k: int, block_k: int, split: int) -> Slices | None:
    """Whole BLOCK_K steps shared out over `split` slices; None where a slice would be empty."""
    steps = triton.cdiv(triton.cdiv(k, block_k), split)
    size = steps * block_k
    if (split - 1) * size >= k:
        return None
    return Slices(split, size, steps, (k - (split - 1) * size) // block_k)


def tile_ok(block_n: int, block_k: int, warps: int, k: int, rows: int, itemsize: int) -> bool:
    per_thread = block_n * block_k // (32 * warps)
    if per_thread * itemsize < 16:  # under one 16-byte vector a thread: lanes idle or loads narrow
        return False
    if rows * per_thread > MAX_LANES:  # per-lane float32 sums past this spill
        return False
    return not (k % block_k and k < 4 * block_k)  # a ragged K only where its masked step is a small part


def rank(cfg: Config, n: int) -> tuple[float, ...]:
    """Most plausible first (kept when --max-configs or the budget cuts): ~32 weight elements a
    thread per step (4 vectors), ~4 programs an SM, 4 warps, evict_first."""
    per_thread = cfg.block_n * cfg.block_k / (32 * cfg.warps)
    programs = triton.cdiv(n, cfg.block_n) * cfg.split
    return (
        round(abs(math.log2(per_thread / 32))),
        round(abs(math.log2(programs / (4 * SMS)))),
        abs(math.log2(cfg.warps / 4)),
        cfg.evict != "evict_first",
        cfg.block_n,
        cfg.block_k,
        cfg.split,
        cfg.stages,
    )


def gpu_configs(variant: str, n: int, k: int, rows: int, itemsize: int) -> list[Config]:
    """The full grid of `variant` for an N x K weight at `rows` rows, less the pruned configs, best-first."""
    out = []
    for bn in BLOCK_NS:
        for bk in BLOCK_KS:
            for warps in WARPS:
                if not tile_ok(bn, bk, warps, k, rows, itemsize):
                    continue
                blocks = triton.cdiv(n, bn)
                for evict in EVICTS:
                    if variant == "static" and blocks >= SMS:
                        out.append(Config(variant, bn, bk, warps, evict))
                    elif variant == "loop" and blocks >= SMS:
                        out += [Config(variant, bn, bk, warps, evict, stages=s) for s in STAGES]
                    elif variant == "splitk_sem":
                        out += [Config(variant, bn, bk, warps, evict, split=s) for s in split_counts(k, bk)]
    if variant == "splitk_sem":
        out = [
            c
            for c in out
            if SMS <= triton.cdiv(n, c.block_n) * c.split <= MAX_SPLIT_PROGRAMS and slices(k, c.block_k, c.split)
        ]
    return sorted(out, key=lambda c: rank(c, n))


def split_counts(k: int, block_k: int) -> list[int]:
    """SPLITS, plus any count up to 8 that cuts K into equal whole steps (no masked step at all)."""
    even = {s for s in range(3, 9) if k % (s * block_k) == 0}
    return sorted(set(SPLITS) | even)


def dry_configs(variant: str, k: int) -> list[Config]:
    """A handful of interpreter-sized configs (few programs: the interpreter pays per program and
    step): several steps, a ragged tail, a partial N block, evict hints, uneven splits with masked
    steps, every num_stages."""
    if variant == "static":
        return [Config(variant, 16, 32, 1), Config(variant, 8, 64, 2, "evict_first"), Config(variant, 16, 128, 4)]
    if variant == "loop":
        return [Config(variant, 16, 32, 1, stages=1), Config(variant, 8, 64, 2, "evict_first", stages=3)] + [
            Config(variant, 16, 128, 4, stages=4)
        ]
    cfgs = [Config(variant, 16, 32, 1, split=2), Config(variant, 8, 32, 2, "evict_first", split=3)]
    cfgs += [Config(variant, 16, 8, 1, split=4)]
    return [c for c in cfgs if slices(k, c.block_k, c.split)]


# ------------------------------------------------------------------------------------------ launches

_WORKSPACES: dict[tuple[str, int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def workspace(device: torch.device, n: int, m: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 partials [split, m, n] and int32 arrival counters (one per N block, at most n), made
    once per (device, N, M, SPLIT): zeros, and every launch leaves the counters at zero."""
    key = (str(device), n, m, split)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = (
            torch.zeros((split, m, n), dtype=torch.float32, device=device),
            torch.zeros(n, dtype=torch.int32, device=device),
        )
    return _WORKSPACES[key]


@dataclass
class Launch:
    kernel: Any
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def plan(cfg: Config, x: Any, w: Any, b: Any, y: Any, p: Any, c: Any, m: int, n: int, k: int) -> Launch:
    """The kernel, grid and arguments of `cfg` for x [m, k] (row stride k), w [n, k], y [m, n];
    p and c are the split workspace and counters (any tensor where unused)."""
    blocks = triton.cdiv(n, cfg.block_n)
    common = dict(HAS_BIAS=b is not None, ROWS=m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVICT=cfg.evict)
    if cfg.variant == "loop":
        kwargs = dict(common, TAIL=k % cfg.block_k != 0, num_warps=cfg.warps, num_stages=cfg.stages)
        return Launch(_gemv_loop, (blocks,), (x, w, b, y, n, k, k, k), kwargs)
    sl = slices(k, cfg.block_k, cfg.split)
    if sl is None:
        raise ValueError(f"split {cfg.split} leaves an empty slice of K {k}")
    kwargs = dict(common, K=k, SLICE=sl.slice, STEPS=sl.steps, FULL_STEPS=sl.full_steps, SPLIT=cfg.split)
    return Launch(_gemv_static, (blocks, cfg.split), (x, w, b, y, p, c, n, k, k), dict(kwargs, num_warps=cfg.warps))


def make_fn(cfg: Config) -> Callable[[Any, Any, Any], Any]:
    """fn(x, w, b) -> y for `cfg`, allocating y per call (as F.linear and the template do)."""

    def fn(x: Any, w: Any, b: Any) -> Any:
        m, k = x.shape
        n = w.shape[0]
        if x.stride() != (k, 1) or w.stride() != (k, 1):
            raise ValueError("x and w must be contiguous (the launch passes K as their row stride)")
        y = torch.empty((m, n), dtype=x.dtype, device=x.device)
        p, c = workspace(x.device, n, m, cfg.split) if cfg.split > 1 else (y, y)
        launch = plan(cfg, x, w, b, y, p, c, m, n, k)
        launch.kernel[launch.grid](*launch.args, **launch.kwargs)
        return y

    return fn


def precompile_job(cfg: Config, m: int, n: int, k: int, has_bias: bool, dtype: str) -> str:
    """Compile `cfg` for this shape without launching it (a worker process): the same arguments the
    timed call passes, so the timing loop finds the kernel in Triton's on-disk cache. '' or the error."""
    try:
        dt = getattr(torch, dtype)
        one = torch.empty(16, dtype=dt, device="cuda")  # contents and sizes do not enter the compile
        p, c = (torch.empty(16, device="cuda"), torch.empty(16, dtype=torch.int32, device="cuda"))
        if cfg.split == 1:
            p = c = one
        launch = plan(cfg, one, one, one if has_bias else None, one, p, c, m, n, k)
        launch.kernel.warmup(*launch.args, grid=launch.grid, **launch.kwargs)
        return ""
    except Exception as exc:  # noqa: BLE001 - the timing loop compiles it again and records the error
        return f"{type(exc).__name__}: {exc}"[:200]


# ------------------------------------------------------------------------------------------ measuring


def rel_error(got: Any, x: Any, w: Any, b: Any) -> float:
    """max |got - F.linear| / max |F.linear|, all in float32."""
    want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    return float((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-30))


@dataclass
class Bench:
    """One shape at one row count: the weight copies, x, and what a result is worth."""

    name: str
    n: int
    k: int
    m: int
    x: Any
    weights: list[Any]
    biases: list[Any]
    nbytes: int
    copy_gbs: float
    device: str
    replays: int
    repeats: int
    cublas_us: float = 0.0

    def calls(self, fn: Callable[..., Any]) -> list[Callable[[], Any]]:
        """One call per weight copy (each its own bias)."""
        return [functools.partial(fn, self.x, w, b) for w, b in zip(self.weights, self.biases)]

    def measure(self, fn: Callable[..., Any]) -> dict[str, Any]:
        """Checked before and after timing (a split's counters must survive graph replay)."""
        x, w, b = self.x, self.weights[0], self.biases[0]
        err = rel_error(fn(x, w, b), x, w, b)
        if not err <= REL_TOL:
            return {"rel_err": err, "rejected": f"relative error {err:.3g} > {REL_TOL}"}
        us = time_calls(torch, self.device, self.calls(fn), self.replays, self.repeats)
        err = max(err, rel_error(fn(x, w, b), x, w, b))
        result: dict[str, Any] = {"us": round(us, 3), "pct_copy_bw": round(self.pct(us), 1), "rel_err": err}
        if self.cublas_us:
            result["vs_cublas"] = round(self.cublas_us / us, 3)
        if not err <= REL_TOL:
            result["rejected"] = f"relative error {err:.3g} > {REL_TOL} after timing"
        return result

    def pct(self, us: float) -> float:
        return 100 * self.nbytes / (us * 1e-6) / 1e9 / self.copy_gbs


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return " ".join(text.split())[:240]


def make_bench(shape: tuple, m: int, args: argparse.Namespace, ctx: dict[str, Any]) -> Bench:
    name, n, k, _has_bias = shape
    device = ctx["device"]
    # one copy in the interpreter: the code path, not HBM traffic
    x, weights, biases, nbytes = projection_inputs(torch, shape, m, device, getattr(torch, args.dtype), cpu_copies=1)
    return Bench(name, n, k, m, x, weights, biases, nbytes, ctx["copy_gbs"], device, args.replays, args.repeats)


@contextlib.contextmanager
def template_knobs(module: Any, knobs: dict[str, Any]) -> Iterator[None]:
    """`entry` reads the module's knobs at call time (graph capture included): set, then restore."""
    saved = {name: getattr(module, name) for name in knobs}
    for name, value in knobs.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def bench_template(bench: Bench, knobs: dict[str, Any]) -> dict[str, Any]:
    from gpuyantra.kernels import linear

    shown = {name: getattr(linear, name) for name in TEMPLATE_KNOBS} | knobs
    try:
        with template_knobs(linear, knobs):
            result = bench.measure(lambda x, w, b: linear.entry(x, weight=w, bias=b))
    except Exception as exc:  # noqa: BLE001 - one failed method is one error cell
        result = {"error": short_error(exc)}
    return {**result, "knobs": shown}


def start_knobs(n: int, k: int, itemsize: int) -> dict[str, Any]:
    from gpuyantra.authors.template_start import _linear_gemv_start

    knobs: dict[str, Any] = {}
    _linear_gemv_start(knobs, k, n, itemsize)
    return knobs


# ------------------------------------------------------------------------------------------ sweeps


class Precompiler:
    """Worker processes compiling planned configs ahead of the timing loop (GPU only). Anything
    going wrong here only costs time: the timing loop compiles what the workers did not."""

    WAIT_S = 120.0  # longest wait for one config's compile before compiling it in the loop

    def __init__(self, workers: int) -> None:
        import multiprocessing

        self.pool: ProcessPoolExecutor | None = None
        self.futures: dict[tuple[Any, ...], Future[str]] = {}
        if workers > 0:
            try:
                self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
            except Exception as exc:  # noqa: BLE001
                print(f"no compile workers ({short_error(exc)}): compiling in the timing loop", file=sys.stderr)

    def submit(self, cfg: Config, m: int, n: int, k: int, has_bias: bool, dtype: str) -> None:
        if self.pool is not None:
            key = (cfg, m, n, k, has_bias, dtype)
            self.futures[key] = self.pool.submit(precompile_job, cfg, m, n, k, has_bias, dtype)

    def wait(self, cfg: Config, m: int, n: int, k: int, has_bias: bool, dtype: str) -> None:
        future = self.futures.pop((cfg, m, n, k, has_bias, dtype), None)
        if future is not None:
            with contextlib.suppress(Exception):  # a broken or slow worker: the loop compiles it itself
                future.result(timeout=self.WAIT_S)

    def close(self) -> None:
        if self.pool is None:
            return
        processes = list(getattr(self.pool, "_processes", {}).values())  # private: no public handle
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # a compile still running (or hung) must not hold up the exit
            process.terminate()


def plan_configs(shape: tuple, m: int, args: argparse.Namespace, itemsize: int) -> dict[str, list[Config]]:
    _, n, k, _ = shape
    out = {}
    for variant in args.variants.split(","):
        cfgs = dry_configs(variant, k) if args.dry_run else gpu_configs(variant, n, k, m, itemsize)
        out[variant] = cfgs[: args.max_configs]
    return out


def round_robin(planned: dict[str, list[Config]]) -> list[Config]:
    """The variants' configs interleaved, each variant best-first, so a budget cut leaves each
    variant its most plausible configs."""
    order = []
    for i in range(max((len(c) for c in planned.values()), default=0)):
        order += [cfgs[i] for cfgs in planned.values() if i < len(cfgs)]
    return order


def sweep(
    bench: Bench, planned: dict[str, list[Config]], deadline: float, pre: Precompiler, shape: tuple, dtype: str
) -> dict[str, dict[str, Any]]:
    """Times every planned config until `deadline`; returns {variant: summary with every record}."""
    results: dict[str, dict[str, Any]] = {
        v: {"planned": len(c), "timed": [], "failed": [], "rejected": [], "skipped": []} for v, c in planned.items()
    }
    for cfg in round_robin(planned):
        bucket = results[cfg.variant]
        if time.perf_counter() > deadline:
            bucket["skipped"].append(cfg.label())
            continue
        pre.wait(cfg, bench.m, bench.n, bench.k, shape[3], dtype)
        record: dict[str, Any] = {"label": cfg.label(), "config": asdict(cfg)}
        try:
            record |= bench.measure(make_fn(cfg))
        except Exception as exc:  # noqa: BLE001 - a config that fails to compile or run is recorded
            record["error"] = short_error(exc)
            if cfg.split > 1:  # a launch that died midway may leave counters set
                _WORKSPACES.pop((str(bench.x.device), bench.n, bench.m, cfg.split), None)
        kind = "failed" if "error" in record else "rejected" if "rejected" in record else "timed"
        bucket[kind].append(record)
    for bucket in results.values():
        timed = bucket["timed"]
        bucket["best"] = min(timed, key=lambda r: r["us"]) if timed else None
        if bucket["skipped"]:
            bucket["note"] = f"{len(bucket['skipped'])} configs skipped: the budget ran out"
    return results


def bench_shape(
    shape: tuple, m: int, args: argparse.Namespace, ctx: dict[str, Any], deadline: float, pre: Precompiler
) -> dict[str, Any]:
    name, n, k, has_bias = shape
    bench = make_bench(shape, m, args, ctx)
    itemsize = bench.x.element_size()
    row: dict[str, Any] = {"shape": name, "n": n, "k": k, "bias": has_bias, "m": m}
    row |= {"copies": len(bench.weights), "bytes": bench.nbytes}
    with torch.no_grad():
        try:
            row["cublas"] = bench.measure(torch.nn.functional.linear)
            bench.cublas_us = row["cublas"]["us"]
        except Exception as exc:  # noqa: BLE001
            row["cublas"] = {"error": short_error(exc)}
        row["template"] = bench_template(bench, {})
        row["template_start"] = bench_template(bench, start_knobs(n, k, itemsize))
        planned = ctx["planned"][(name, m)]
        row["variants"] = sweep(bench, planned, deadline, pre, shape, args.dtype)
    sync(torch, ctx["device"])  # nothing in flight reads the copies or the workspaces freed here
    bench.weights.clear()  # free the copies before the next shape
    _WORKSPACES.clear()
    if ctx["device"] == "cuda":
        torch.cuda.empty_cache()
    return row


# ------------------------------------------------------------------------------------------ output


def line(method: str, label: str, result: dict[str, Any] | None) -> str:
    if not result:
        return f"  {method:<15} {'-':<34}"
    if "error" in result or "us" not in result:
        why = result.get("error") or result.get("rejected") or "?"
        return f"  {method:<15} {label:<34} {why[:60]}"
    vs = f"{result['vs_cublas']:.2f}x" if "vs_cublas" in result else "-"
    return f"  {method:<15} {label:<34} {result['us']:8.2f} {result['pct_copy_bw']:6.1f}% {vs:>8}"


def knob_label(knobs: dict[str, Any]) -> str:
    evict = " ef" if knobs.get("W_EVICTION") else ""
    return f"BN{knobs['BLOCK_N']} BK{knobs['BLOCK_K']} S{knobs['SPLIT_K']} w{knobs['GEMV_WARPS']}{evict}"


def print_row(row: dict[str, Any]) -> None:
    bias = " +bias" if row["bias"] else ""
    print(f"\n{row['shape']}: N={row['n']} K={row['k']}{bias} M={row['m']} ({row['bytes'] / 1e6:.2f} MB)")
    print(f"  {'method':<15} {'config':<34} {'us':>8} {'%copy':>7} {'vs cuBLAS':>8}")
    print(line("cublas", "F.linear", row["cublas"]))
    for method in ("template", "template_start"):
        result = row[method]
        print(line(method, knob_label(result["knobs"]), result))
    for variant, bucket in row["variants"].items():
        best = bucket["best"]
        print(line(variant, best["label"] if best else "-", best))
    for variant, bucket in row["variants"].items():
        counts = ", ".join(f"{len(bucket[key])} {key}" for key in ("timed", "failed", "rejected", "skipped"))
        print(f"    {variant}: {bucket['planned']} planned: {counts}")
        for record in bucket["failed"][:2]:
            print(f"      e.g. {record['label']}: {record['error'][:100]}")


def write_json(path: str, meta: dict[str, Any], rows: list[dict[str, Any]], started: float) -> None:
    result = {**meta, "seconds": round(time.perf_counter() - started, 1), "rows": rows}
    Path(path).write_text(json.dumps(result, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        print("--dry-run needs TRITON_INTERPRET=1 set before triton is imported", file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if device == "cpu" and not args.dry_run:
        print("no CUDA device: use --dry-run for the interpreter smoke run", file=sys.stderr)
        return 2
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        print(f"unknown variants {sorted(unknown)}; known: {','.join(VARIANTS)}", file=sys.stderr)
        return 2
    if args.dry_run:
        args.replays, args.repeats = 1, 1
    rows_list = [int(r) for r in (args.rows or ("1,3" if args.dry_run else "1")).split(",") if r.strip()]
    if not all(1 <= m <= 4 for m in rows_list):
        print("--rows: 1 to 4 rows (the kernels keep one accumulator per row)", file=sys.stderr)
        return 2
    shapes = DRY_SHAPES if args.dry_run else DECODE_SHAPES
    if args.shapes:
        shapes = [s for s in shapes if s[0] in set(args.shapes.split(","))]
    started = time.perf_counter()
    itemsize = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    pairs = [(shape, m) for shape in shapes for m in rows_list]
    planned = {(s[0], m): plan_configs(s, m, args, itemsize) for s, m in pairs}
    workers = args.compile_workers
    if workers < 0:
        workers = 0 if device == "cpu" else max(0, min(14, (os.cpu_count() or 1) - 2))
    pre = Precompiler(workers if device == "cuda" else 0)
    for shape, m in pairs:  # the timing loop's order, so the workers stay ahead of it
        for cfg in round_robin(planned[(shape[0], m)]):
            pre.submit(cfg, m, shape[1], shape[2], shape[3], args.dtype)
    copy_gbs = measure_copy_bandwidth(torch, device)
    ctx = {"device": device, "copy_gbs": copy_gbs, "planned": planned}
    meta = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "dtype": args.dtype,
        "copy_bandwidth_gbs": round(copy_gbs, 1),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dry_run": args.dry_run,
        "budget_s": args.budget_s,
        "compile_workers": workers,
    }
    out_rows: list[dict[str, Any]] = []
    try:
        for i, (shape, m) in enumerate(pairs):
            # An equal share of what is left: a quick shape leaves more to the next ones.
            left = args.budget_s - (time.perf_counter() - started)
            deadline = time.perf_counter() + max(0.0, left) / (len(pairs) - i)
            out_rows.append(bench_shape(shape, m, args, ctx, deadline, pre))
            print_row(out_rows[-1])
            print(f"  ({shape[0]} M={m} done at {time.perf_counter() - started:.0f} s)", file=sys.stderr)
            write_json(args.out, meta, out_rows, started)  # a run cut short keeps what it measured
    finally:
        pre.close()
    print(f"\ncopy bandwidth {ctx['copy_gbs']:.0f} GB/s; {time.perf_counter() - started:.0f} s; wrote {args.out}")
    if args.dry_run:
        return check_dry(out_rows)
    return 0


def check_dry(rows: list[dict[str, Any]]) -> int:
    """The dry run's verdict: every method and every planned config ran and was right."""
    problems = []
    for row in rows:
        where = f"{row['shape']} M={row['m']}"
        for method in ("cublas", "template", "template_start"):
            if "us" not in row[method] or "rejected" in row[method]:
                problems.append(f"{where} {method}: {row[method]}")
        for variant, bucket in row["variants"].items():
            for record in bucket["failed"] + bucket["rejected"]:
                problems.append(f"{where} {variant} {record['label']}: {record.get('error') or record['rejected']}")
            if not bucket["timed"] or bucket["skipped"]:
                problems.append(f"{where} {variant}: {len(bucket['timed'])} timed, {len(bucket['skipped'])} skipped")
    for problem in problems:
        print("DRY RUN FAILURE:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
