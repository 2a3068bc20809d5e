"""The serving process: a transformers causal LM behind an OpenAI-compatible HTTP API, with an
admin API that hot-swaps verified Triton kernels into the live model between forward passes.

- `serving.models`: presets and model/tokenizer loading.
- `serving.cache`: the slot KV cache the engine owns (positions, masks, rows).
- `serving.engine`: the engine, which owns its parts: `serving.runner` (model, cache, forward
  passes), `serving.scheduler` (one worker thread, continuous batching over cache slots, swaps and
  admin operations between passes; each pass a `serving.plan.StepPlan`), `serving.speed`
  (benchmarks) and `serving.profiling` (`/admin/profile`).
- `serving.graphs`: CUDA-graph decode (one graph per batch-size bucket).
- `serving.app`: the FastAPI application (`create_app`): model loading, error bodies, assembly.
- `serving.state`: `ServeConfig`, `ServerState` and the `State` dependency routes reach them through.
- `serving.auth`: the admin bearer token (middleware and the admin routes' dependency).
- `serving.routes_health`: `/healthz`, `/readyz`, `/metrics`, `/v1/models`.
- `serving.openai_api`: `/v1/completions` and `/v1/chat/completions` (bodies, stop strings,
  logprobs, streaming).
- `serving.routes_admin` (bodies in `serving.admin_schema`): `/admin/...`.

Only the web layer (`app`, `state`, `auth`, `routes_*`, `admin_schema`, `openai_api`, `metrics`) imports
FastAPI and prometheus-client, so the engine can be driven directly (benchmarks, tests) where the web
stack is not installed.
"""
