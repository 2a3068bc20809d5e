#!/usr/bin/env python3
"""Decode attention with split keys: the last split program merging (engine counters) against the
second merge kernel, for the served model's decode shapes.

For each batch (rows of one query token; Qwen2.5-1.5B's 12 query heads over 2 KV heads, head dim
128, a 2049-slot cache as `gpuyantra serve` keeps by default: 8 splits of 512 keys) it

* checks both merges against `reference_decode_attention` and against each other over `--trials`
  random caches and positions (the in-kernel merge is a cross-program handshake: a race would show
  as a wrong row now and then), and that the counters are left zero;
* times one call of each inside a CUDA graph of `--layers` calls (one per layer, as a decode step
  runs them), median of `--repeats`.

    python3 benchmarks/attention_merge.py --out /tmp/attention_merge.json
    python3 benchmarks/attention_merge.py --device cpu --out /tmp/am.json   # interpreter: checks only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--batches", default="1,8")
    p.add_argument("--cache-len", type=int, default=2049, help="cache slots (serve's default 2048 + scratch)")
    p.add_argument("--trials", type=int, default=200, help="random caches checked per batch")
    p.add_argument("--layers", type=int, default=28, help="calls per graph (one per layer)")
    p.add_argument("--repeats", type=int, default=5)
    return p.parse_args(argv)


def check(torch: Any, attention: Any, batch: int, args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Worst differences over the trials: in-kernel merge vs the reference and vs the merge kernel."""
    gen = torch.Generator(device=device).manual_seed(batch)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    worst_ref = worst_pair = 0.0
    counters = torch.zeros(1024, dtype=torch.int32, device=device)
    for _ in range(args.trials):
        keys = torch.randn(batch, 2, args.cache_len, 128, generator=gen, device=device, dtype=dtype)
        values = torch.randn(batch, 2, args.cache_len, 128, generator=gen, device=device, dtype=dtype)
        query = torch.randn(batch, 12, 1, 128, generator=gen, device=device, dtype=dtype)
        positions = torch.randint(0, args.cache_len - 1, (batch,), generator=gen, device=device)
        merged = attention.decode_attention(query, keys, values, positions, 128**-0.5, counters=counters)
        second = attention.decode_attention(query, keys, values, positions, 128**-0.5)
        want = attention.reference_decode_attention(query, keys, values, positions, 128**-0.5)
        worst_ref = max(worst_ref, float((merged.float() - want.float()).abs().max()))
        worst_pair = max(worst_pair, float((merged.float() - second.float()).abs().max()))
    return {
        "trials": args.trials,
        "max_abs_vs_reference": worst_ref,
        "max_abs_vs_merge_kernel": worst_pair,
        "counters_left_zero": not bool(counters.any()),
    }


def time_graph(torch: Any, calls: list[Any], repeats: int) -> float:
    """Median microseconds per call: the calls captured in one CUDA graph, replayed."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / (20 * len(calls)) * 1e6)
    return sorted(samples)[len(samples) // 2]


def timing(torch: Any, attention: Any, batch: int, args: argparse.Namespace) -> dict[str, float]:
    gen = torch.Generator(device="cuda").manual_seed(7)
    layers = [
        tuple(
            torch.randn(batch, 2, args.cache_len, 128, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in "kv"
        )
        for _ in range(args.layers)
    ]
    query = torch.randn(batch, 12, 1, 128, generator=gen, device="cuda", dtype=torch.bfloat16)
    positions = torch.full((batch,), 95, device="cuda")  # a 32-token prompt, 64 generated: what campaigns time
    counters = torch.zeros(1024, dtype=torch.int32, device="cuda")

    def calls(with_counters: bool) -> list[Any]:
        extra = {"counters": counters} if with_counters else {}
        return [
            lambda k=k, v=v: attention.decode_attention(query, k, v, positions, 128**-0.5, **extra) for k, v in layers
        ]

    return {
        "merge_kernel_us": round(time_graph(torch, calls(False), args.repeats), 3),
        "last_program_merges_us": round(time_graph(torch, calls(True), args.repeats), 3),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.cache_len, args.trials = min(args.cache_len, 40), min(args.trials, 2)
    import torch

    import serving.attention as attention

    if args.device == "cpu":
        attention.KEYS_PER_SPLIT = 8  # the interpreter: the same splits over a short cache
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        row: dict[str, Any] = {"batch": batch, "splits": attention._splits_for(args.cache_len)}
        row.update(check(torch, attention, batch, args, args.device))
        if args.device == "cuda":
            row.update(timing(torch, attention, batch, args))
        rows.append(row)
        print(row, flush=True)
    Path(args.out).write_text(json.dumps({"device": args.device, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
