#!/usr/bin/env python3
"""What a mixed step costs by its number of rows: for each prompt budget T, the mixed graph of
`max_batch + T` rows is captured and replayed against the full decode step, on the model's own
kernels or a campaign's (`--state-dir`: its manifest's swaps re-applied first).

A mixed step is taken only while its extra GPU time stays below the prefill passes it replaces
(`serving.scheduler`), and its graph has one fixed size. This shows how that extra time grows with
the rows, where a tile boundary of the projections' matmuls makes a step, and so which sizes
of mixed graph are worth capturing.

    python benchmarks/mixed_rows_sweep.py --out /tmp/mixed.json [--state-dir /tmp/gystate]
    python benchmarks/mixed_rows_sweep.py --smoke --out /tmp/m.json     # CPU (tiny-qwen2, eager steps)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--model", default="qwen2.5-1.5b")
    p.add_argument("--state-dir", default=None, help="re-apply this state folder's manifest first")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--prompt-tokens", default="8,16,24,32,40,48,56,64,72,88,120", help="budgets T to sweep")
    p.add_argument("--replays", type=int, default=50, help="timed replays per graph")
    p.add_argument("--smoke", action="store_true", help="tiny-qwen2 on the CPU: the path, no meaningful times")
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.prompt_tokens, args.replays, args.max_batch, args.max_seq_len = "tiny-qwen2", "4,8", 2, 2, 64
    try:
        args.budgets = sorted({int(t) for t in args.prompt_tokens.split(",") if t.strip()})
    except ValueError:
        p.error(f"--prompt-tokens {args.prompt_tokens!r}: comma-separated whole numbers")
    if not args.budgets or min(args.budgets) < 1 or args.replays < 1:
        p.error("--prompt-tokens needs budgets of at least 1, --replays at least 1")
    return args


def replay_ms(graphs: Any, st: dict[str, Any], replays: int) -> dict[str, float]:
    """One captured step (a decode bucket's or the mixed graph's) replayed at the scratch slot: min and
    median GPU ms (eager static step and wall ms on the CPU)."""
    if graphs.capture_enabled:
        times = graphs.replay_times_ms(st, replays)
    else:
        times = []
        for _ in range(replays):
            graphs._reset_inputs(st)
            t = time.perf_counter()
            graphs._step(st)
            times.append(1e3 * (time.perf_counter() - t))
        graphs._reset_inputs(st)
    return {"min_ms": round(min(times), 4), "median_ms": round(statistics.median(times), 4)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gpuyantra.triton_env import prepare

    device = prepare("cpu" if args.smoke else None)
    import torch

    from serving.engine import Engine
    from serving.graphs import GraphDecoder
    from serving.models import describe, load_model

    loaded = load_model(args.model, device=device, seed=0)
    state = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="gy-mixed-sweep-"))
    engine = Engine(
        loaded, state_dir=state, max_batch=args.max_batch, max_seq_len=args.max_seq_len, mixed_prompt_tokens=0
    )
    reapplied = engine.swaps.reapply() if args.state_dir else []
    result: dict[str, Any] = {
        "model": describe(loaded),
        "versions": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu"},
        "reapplied": reapplied,
        "active_swaps": engine.swaps.active_ids(),
        "max_batch": args.max_batch,
        "replays": args.replays,
        "rows": [],
    }
    for budget in args.budgets:
        rows = args.max_batch + budget
        graphs = GraphDecoder(engine.runner, [args.max_batch], mixed_rows=rows)
        graphs.capture_all()
        decode = replay_ms(graphs, graphs.static[args.max_batch], args.replays)
        mixed = replay_ms(graphs, graphs.mixed_static[rows], args.replays)
        record = {
            "prompt_tokens": budget,
            "rows": rows,
            "decode_ms": decode,
            "mixed_ms": mixed,
            "extra_median_ms": round(mixed["median_ms"] - decode["median_ms"], 4),
            "extra_measured_ms": graphs.mixed_extra_ms,  # what the scheduler weighs (best of a few replays)
        }
        result["rows"].append(record)
        print(json.dumps(record), flush=True)
        del graphs
        if device == "cuda":
            torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
