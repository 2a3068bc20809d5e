#!/usr/bin/env python3
"""Time explicit strategies of one or more families at one benchmark shape (what-if runs for the
author's heuristics): `python benchmarks/strategy_sweep.py --ops rms_norm,softmax --shape large`.
Strategies: the template default, every curated point of STRATEGY_SPACES, and --extra JSON points.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.ops_bench import DEVICE, DTYPES, copy_bandwidth, evaluate, shape_specs, template_adapter
from gpuyantra.authors.template import STRATEGY_SPACES, default_strategy, normalize
from gpuyantra.ops import get_op


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ops", required=True)
    p.add_argument("--shape", default="large")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--extra", default="{}", help='JSON {"op": [partial strategies]}')
    p.add_argument("--only-extra", action="store_true", help="skip the curated STRATEGY_SPACES points")
    args = p.parse_args()
    extra = json.loads(args.extra)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    for op in args.ops.split(","):
        family = get_op(op)
        ((_, rows, hidden),) = shape_specs(op, [args.shape], args.hidden, DEVICE == "cpu")
        dtype = DTYPES[args.dtype]
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        acts = family.make_activations(rows, hidden, dtype, DEVICE, gen)
        params = family.make_params(hidden, dtype, DEVICE, gen)
        floor = family.bytes_moved(list(acts[0].shape), dtype) / bw * 1e6
        points, seen = [], set()
        curated = [] if args.only_extra else STRATEGY_SPACES[op]
        for point in [{}] + curated + extra.get(op, []):
            full = normalize(op, {**default_strategy(op), **point})
            key = json.dumps(full, sort_keys=True)
            if key not in seen:
                seen.add(key)
                points.append(full)
        for strategy in points:
            attempt = evaluate(family, strategy, template_adapter(op), acts, params, dtype, None, None, floor)
            changed = {k: v for k, v in strategy.items() if default_strategy(op)[k] != v}
            if attempt.kernel_us is None:
                print(f"{op:>14} {'FAILED':>9}  {changed}  {attempt.failures[0]['message'][:120]}", flush=True)
            else:
                print(
                    f"{op:>14} {attempt.kernel_us:8.1f}us {100 * floor / attempt.kernel_us:5.1f}%  {changed}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
