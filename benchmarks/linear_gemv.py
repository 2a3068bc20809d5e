#!/usr/bin/env python3
"""Projections: cuBLAS (F.linear) vs torch.compile vs the `linear` template kernel, per regime.

For each projection shape of a Qwen2.5-1.5B-architecture model (N x K: q/k/v fused 2048x1536 with
bias, o_proj 1536x1536, gate/up fused 17920x1536, down_proj 1536x8960, lm_head 151936x1536) at
1, 8 and 54 rows (batch-1 decode, batch-8 decode, a 54-token prefill: the template's GEMV, 16-row
tile and big-tile regimes), it times

* cublas    - F.linear(x, w, b) (what nn.Linear runs)
* compile   - torch.compile of the same call (default mode)
* template  - the template kernel (gpuyantra/kernels/linear.py) at its best knobs: the offline
              author's start for the shape, its one-step neighbours in the knobs of the regime that
              runs at that row count, then its strategy space, each timed once (twins skipped), the
              fastest kept; the table shows the regime and its knobs

as the served model runs them: inside a CUDA graph. One graph calls the method once on each of
C copies of the weights (C large enough that the copies together are several times the L2, so
every call reads its weight from HBM, as each layer's projection does); the graph is replayed
R times and a call's time is the replay time / (R x C). Bandwidth is bytes moved (weight, x, y,
bias, once each) / time, reported as % of the device's copy bandwidth (a 1 GiB device-to-device
copy, bytes read + written). Each template result is checked against F.linear in float32.

Prints a table and writes JSON (--out). `--dry-run` runs tiny shapes on the CPU under Triton's
interpreter (plain loops instead of graphs), so the script is tested where no GPU is.

    python benchmarks/linear_gemv.py --out /tmp/linear_gemv.json
    TRITON_INTERPRET=1 python benchmarks/linear_gemv.py --dry-run --out /tmp/linear_dry.json
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (name, N, K, bias): the decode projections of Qwen2.5-1.5B with fused q/k/v and gate/up.
DECODE_SHAPES = [
    ("qkv", 2048, 1536, True),
    ("o_proj", 1536, 1536, False),
    ("gate_up", 17920, 1536, False),
    ("down_proj", 1536, 8960, False),
    ("lm_head", 151936, 1536, False),
]
DRY_SHAPES = [("tiny_qkv", 48, 32, True), ("tiny_down", 20, 130, False)]
HBM_BYTES = 512 * 2**20  # weight copies per shape add up to at least this (H200 L2: 60 MB)
MAX_COPY_BYTES = 8 * 2**30  # ... and at most this


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="linear_gemv.json", help="JSON output file")
    p.add_argument("--batches", default="1,8,54", help="rows of x (decode batch sizes, prefill tokens)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    p.add_argument("--replays", type=int, default=20, help="graph replays per measurement")
    p.add_argument("--repeats", type=int, default=5, help="measurements per method (the median is kept)")
    p.add_argument("--max-points", type=int, default=40, help="template strategies timed per shape and batch")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument(
        "--grid",
        default="",
        help="time this grid over the author's start instead of its neighbours and space: "
        "'KNOB=v1|v2;KNOB2=v3|v4' (every combination; the start is timed first)",
    )
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (Triton's interpreter)")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------ timing


def measure_copy_bandwidth(torch: Any, device: str) -> float:
    """Copy bandwidth in GB/s (bytes read + written) of a large device-to-device copy, best of 10."""
    n = (1 << 30) if device == "cuda" else (1 << 24)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(12):
        sync(torch, device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(torch, device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n / best / 1e9


def sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_calls(torch: Any, device: str, calls: list[Callable[[], Any]], replays: int, repeats: int) -> float:
    """Median microseconds of one call: the calls (one per weight copy) captured in one CUDA graph
    and replayed (CPU: run in a loop)."""
    for call in calls:  # warm up: compile, autotune, allocate outside the graph
        call()
    sync(torch, device)
    if device == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for call in calls:
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for call in calls:
                call()
        graph.replay()
        run: Callable[[], None] = graph.replay
    else:

        def run() -> None:
            for call in calls:
                call()

    samples = []
    for _ in range(repeats):
        sync(torch, device)
        t0 = time.perf_counter()
        for _ in range(replays):
            run()
        sync(torch, device)
        samples.append((time.perf_counter() - t0) / (replays * len(calls)) * 1e6)
    samples.sort()
    return samples[len(samples) // 2]


# ------------------------------------------------------------------------------------------ methods


def template_points(
    n: int, k: int, batch: int, dtype: str, hardware: str, limit: int, grid: dict[str, list[Any]] | None = None
) -> list[dict[str, Any]]:
    """The offline author's first point for this shape, its one-step neighbours in the knobs of the
    regime that runs at `batch` rows, then its strategy space (or the `grid` over the start), without twins."""
    from gpuyantra.authors.base import WriteRequest
    from gpuyantra.authors.template import canonical, initial_strategy, strategy_space

    request = WriteRequest(
        op="linear",
        module_class="Linear",
        adapter=[],
        shapes=[[batch, k]],
        dtype=dtype,
        hardware=hardware,
        param_shapes={"weight": [n, k], "bias": None},
    )
    start = initial_strategy(request)
    if grid:
        candidates = grid_points(start, grid)
    else:
        candidates = [start, *regime_neighbours(start, batch), *strategy_space("linear", request)]
    points, seen = [], set()
    for point in candidates:
        key = canonical("linear", point, [[batch, k]], n)
        if key not in seen:
            seen.add(key)
            points.append(point)
    return points[:limit]


def parse_grid(text: str) -> dict[str, list[Any]]:
    """'A=1|2;B=True|False' -> {"A": [1, 2], "B": [True, False]} (values as Python literals, else strings)."""
    grid: dict[str, list[Any]] = {}
    for chunk in filter(None, (c.strip() for c in text.split(";"))):
        knob, _, values = chunk.partition("=")
        grid[knob.strip()] = [_literal(v.strip()) for v in values.split("|")]
    return grid


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def grid_points(start: dict[str, Any], grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The start, then every combination of the grid's values over it."""
    combos = itertools.product(*grid.values())
    return [start, *({**start, **dict(zip(grid, values))} for values in combos)]


def regime_neighbours(start: dict[str, Any], rows: int) -> list[dict[str, Any]]:
    """`start` with one knob of the regime running at `rows` (or the auto-split target) one step away."""
    from gpuyantra.authors.template_space import KNOBS, LINEAR_REGIME_KNOBS, linear_regime

    knobs = KNOBS["linear"]
    points = []
    for knob in (*LINEAR_REGIME_KNOBS[linear_regime(start, rows)], "TARGET_PROGRAMS"):
        values = knobs[knob]
        i = values.index(start[knob]) if start[knob] in values else 0
        points += [{**start, knob: values[j]} for j in (i - 1, i + 1) if 0 <= j < len(values)]
    return points


def regime_knobs(strategy: dict[str, Any], rows: int) -> tuple[str, dict[str, Any]]:
    """(regime, its knobs) of `strategy` at `rows` rows: what the table shows."""
    from gpuyantra.authors.template_space import LINEAR_REGIME_KNOBS, linear_regime

    regime = linear_regime(strategy, rows)
    return regime, {knob: strategy[knob] for knob in LINEAR_REGIME_KNOBS[regime] if knob in strategy}


def load_template(strategy: dict[str, Any], folder: Path) -> Callable[..., Any]:
    from gpuyantra.authors.template import render
    from gpuyantra.candidate import load_candidate

    adapter = [{"kernel_param": "weight", "module_attr": "weight"}, {"kernel_param": "bias", "module_attr": "bias"}]
    path = folder / f"linear_{abs(hash(json.dumps(strategy, sort_keys=True)))}.py"
    path.write_text(render("linear", strategy, adapter))  # Triton reads kernel source from a real file
    return load_candidate(path).entry


def max_error(torch: Any, got: Any, x: Any, w: Any, b: Any) -> float:
    want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    return float((got.float() - want).abs().max())


def projection_inputs(
    torch: Any, shape: tuple, rows: int, device: str, dtype: Any, cpu_copies: int
) -> tuple[Any, list[Any], list[Any], int]:
    """x [rows, K], the weight copies (together several times the L2, at most MAX_COPY_BYTES: each
    call reads its weight from HBM; `cpu_copies` in the interpreter, where only the code path counts),
    their biases, and the bytes one call moves (weight, x, y, bias once each)."""
    _name, n, k, has_bias = shape
    itemsize = torch.empty((), dtype=dtype).element_size()
    weight_bytes = n * k * itemsize
    copies = max(2, min(64, math.ceil(HBM_BYTES / weight_bytes), MAX_COPY_BYTES // weight_bytes))
    if device == "cpu":
        copies = cpu_copies
    gen = torch.Generator(device=device).manual_seed(0)
    weights = [torch.randn(n, k, generator=gen, device=device, dtype=dtype) * 0.02 for _ in range(copies)]
    biases = [torch.randn(n, generator=gen, device=device, dtype=dtype) if has_bias else None for _ in range(copies)]
    x = torch.randn(rows, k, generator=gen, device=device, dtype=dtype)
    return x, weights, biases, (n * k + rows * k + rows * n + (n if has_bias else 0)) * itemsize


def bench_shape(torch: Any, args: argparse.Namespace, shape: tuple, batch: int, ctx: dict[str, Any]) -> dict[str, Any]:
    name, n, k, has_bias = shape
    device, dtype = ctx["device"], getattr(torch, args.dtype)
    x, weights, biases, nbytes = projection_inputs(torch, shape, batch, device, dtype, cpu_copies=2)
    copies = len(weights)
    row: dict[str, Any] = {"shape": name, "n": n, "k": k, "bias": has_bias, "batch": batch, "copies": copies}
    row["bytes"] = nbytes

    def calls(fn: Callable[..., Any]) -> list[Callable[[], Any]]:
        return [lambda w=w, b=b: fn(x, w, b) for w, b in zip(weights, biases)]

    def record(method: str, fn: Callable[..., Any]) -> None:
        try:
            us = time_calls(torch, device, calls(fn), args.replays, args.repeats)
        except Exception as exc:  # noqa: BLE001 - one failed method is one error cell
            row[method] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            return
        row[method] = {"us": round(us, 3), "pct_copy_bw": round(100 * nbytes / (us * 1e-6) / 1e9 / ctx["copy_gbs"], 1)}

    with torch.no_grad():
        record("cublas", torch.nn.functional.linear)
        if not args.no_compile:
            backend = "eager" if device == "cpu" else "inductor"  # CPU: the code path, not a C++ build
            compiled = torch.compile(lambda a, w, b: torch.nn.functional.linear(a, w, b), backend=backend)
            record("compile", compiled)
            torch._dynamo.reset()
        best: dict[str, Any] | None = None
        tried = []
        grid = parse_grid(args.grid)
        for point in template_points(n, k, batch, args.dtype, ctx["hardware"], args.max_points, grid):
            try:
                entry = load_template(point, ctx["folder"])
                err = max_error(torch, entry(x, weight=weights[0], bias=biases[0]), x, weights[0], biases[0])
                us = time_calls(
                    torch, device, calls(lambda a, w, b, e=entry: e(a, weight=w, bias=b)), args.replays, args.repeats
                )
            except Exception as exc:  # noqa: BLE001 - a point that fails to compile or run is skipped
                tried.append({"strategy": point, "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            tried.append({"strategy": point, "us": round(us, 3), "max_abs_err": err})
            if best is None or us < best["us"]:
                best = {"us": us, "strategy": point, "max_abs_err": err}
        if best is not None:
            us = best["us"]
            regime, knobs = regime_knobs(best["strategy"], batch)
            row["template"] = {
                "us": round(us, 3),
                "pct_copy_bw": round(100 * nbytes / (us * 1e-6) / 1e9 / ctx["copy_gbs"], 1),
                "regime": regime,
                "knobs": knobs,
                "strategy": best["strategy"],
                "max_abs_err": best["max_abs_err"],
            }
        else:
            row["template"] = {"error": "every strategy failed"}
        row["template_points"] = tried
    weights.clear()  # free the copies before the next shape
    biases.clear()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


# ------------------------------------------------------------------------------------------ output


def cell(result: dict[str, Any] | None) -> str:
    if not result:
        return "-"
    if "error" in result:
        return "error"
    return f"{result['us']:8.2f} us {result['pct_copy_bw']:5.1f}%"


def print_table(rows: list[dict[str, Any]], copy_gbs: float) -> None:
    print(f"copy bandwidth: {copy_gbs:.0f} GB/s; time per call (CUDA-graph replay) and % of copy bandwidth")
    header = (
        f"{'shape':<10} {'N x K':>14} {'batch':>5}  {'cublas':>20}  {'compile':>20}  {'template':>20}  "
        "regime: best knobs"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        template = row.get("template") or {}
        best = f"{template.get('regime', '-')}: {template.get('knobs')}"
        print(
            f"{row['shape']:<10} {row['n']:>7}x{row['k']:<6} {row['batch']:>5}  {cell(row.get('cublas')):>20}  "
            f"{cell(row.get('compile')):>20}  {cell(template):>20}  {best}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    if device == "cpu" and not args.dry_run:
        print("no CUDA device: use --dry-run for the interpreter smoke run", file=sys.stderr)
        return 2
    if device == "cpu":
        args.dtype = "float32" if args.dtype == "bfloat16" else args.dtype  # the interpreter's bf16 is unreliable
        args.replays, args.repeats, args.max_points = 1, 1, min(args.max_points, 2)
    shapes = DRY_SHAPES if args.dry_run else DECODE_SHAPES
    if args.shapes:
        wanted = set(args.shapes.split(","))
        shapes = [s for s in shapes if s[0] in wanted]
    hardware = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="linear_gemv_") as tmp:
        ctx = {
            "device": device,
            "hardware": hardware,
            "copy_gbs": measure_copy_bandwidth(torch, device),
            "folder": Path(tmp),
        }
        rows = []
        for shape in shapes:
            for batch in [int(b) for b in args.batches.split(",") if b.strip()]:
                rows.append(bench_shape(torch, args, shape, batch, ctx))
                print(f"  {shape[0]} batch {batch}: done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    print_table(rows, ctx["copy_gbs"])
    result = {
        "device": hardware,
        "dtype": args.dtype,
        "copy_bandwidth_gbs": round(ctx["copy_gbs"], 1),
        "torch": torch.__version__,
        "dry_run": args.dry_run,
        "seconds": round(time.perf_counter() - started, 1),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
