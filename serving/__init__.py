"""The serving process: a transformers causal LM behind an OpenAI-compatible HTTP API, with an
admin API that hot-swaps verified Triton kernels into the live model between forward passes.

- `serving.models`: presets and model/tokenizer loading.
- `serving.cache`: the slot KV cache the engine owns (positions, masks, rows).
- `serving.engine`: the generation loop (one worker thread, continuous batching over cache slots),
  and the coordination of swaps, rollbacks, profiling and benchmarks between forward passes.
- `serving.graphs`: CUDA-graph decode (one graph per batch-size bucket).
- `serving.app`: the FastAPI application (`create_app`).
- `serving.openai_api`: `/v1/completions` and `/v1/chat/completions` (bodies, stop strings,
  logprobs, streaming), used by `serving.app`.

Only `serving.app`, `serving.openai_api` and `serving.metrics` import FastAPI and prometheus-client,
so the engine can be driven directly (benchmarks, tests) where the web stack is not installed.
"""
