#!/usr/bin/env python3
"""Does a Gemma2 model serve on CUDA with `--cuda-graphs`? One command on a GPU machine:

    python benchmarks/gemma2_graphs_check.py            # Gemma2-2B's shapes, random weights, bf16
    python benchmarks/gemma2_graphs_check.py --tiny     # a 2-layer Gemma2 (seconds)

Builds the engine as `serve --cuda-graphs` does (graph capture, run-ahead, mixed steps at their
CUDA default, decode attention auto) on a Gemma2 config with random weights, then lets two short
requests join two running ones (a mixed step) and compares every request's greedy tokens with full
forwards without a cache. Prints one JSON line: the engine's graphs, its decode attention's calls and
fallbacks (each layer's reason is logged once), the mixed admissions and whether the tokens match;
exit 0 when they all do. Before the fix of the mixed-step fallback, building the engine failed in
warm-up with `The size of tensor a (64) must match the size of tensor b (8)` (56 prompt rows and 8
decode rows attending over the cache's 8 rows).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def gemma2_config(tiny: bool) -> Any:
    from transformers import Gemma2Config

    from tests.serving.test_sliding_window_models import tiny_gemma2_config

    return tiny_gemma2_config(window=64) if tiny else Gemma2Config()  # the defaults: Gemma2-2B's shapes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer Gemma2 instead of Gemma2-2B's shapes")
    parser.add_argument("--layers", type=int, default=26, help="decoder layers of the full-size config (2B: 26)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda", help="cpu runs the graph step eagerly (a smoke test)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    from serving.engine import Engine, GenRequest
    from serving.models import load_model
    from tests.serving.helpers import reference_greedy
    from tests.serving.test_mixed_steps import drive

    config = gemma2_config(args.tiny)
    if not args.tiny:
        config.num_hidden_layers = args.layers
    folder = Path(tempfile.mkdtemp()) / "gemma2"
    config.save_pretrained(folder)
    loaded = load_model(str(folder), random_weights=True, byte_tokenizer=True, device=args.device, dtype=args.dtype)
    engine = Engine(loaded, state_dir=tempfile.mkdtemp(), max_batch=8, max_seq_len=256, cuda_graphs=True)
    vocab = int(config.vocab_size)
    prompts = [[(7 * i + 3 + 11 * r) % vocab for i in range(5 + r)] for r in range(4)]
    first = [GenRequest(prompts[0], 8), GenRequest(prompts[1], 8)]
    later = [GenRequest(prompts[2], 6), GenRequest(prompts[3], 6)]
    drive(engine, first, later, after_passes=1)
    matches = [r.output_ids == reference_greedy(engine.model, r.prompt_ids, r.max_tokens) for r in first + later]
    attention = engine.decode_attention
    print(
        json.dumps(
            {
                "model": "gemma2-tiny" if args.tiny else f"gemma2-{args.layers}-layers",
                "graphs": engine.graphs is not None,
                "mixed_admissions": engine.mixed_admissions,
                "decode_attention": None
                if attention is None
                else {
                    "calls": attention.calls,
                    "fallbacks": attention.fallbacks,
                    "last_fallback": attention.last_fallback,
                },
                "usable_len": engine.cache.usable_len,
                "tokens_match": matches,
            }
        )
    )
    return 0 if all(matches) else 1


if __name__ == "__main__":
    raise SystemExit(main())
