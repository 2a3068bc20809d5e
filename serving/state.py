"""What the serving process holds while it runs, and how a route reaches it.

`ServeConfig` is what `gpuyantra serve` was started with; `ServerState` is the live server (the engine once
the model has loaded, or the error that stopped it). Routes take the state as a dependency (`State`) and ask it
for the engine inside their body (`state.require_engine()`): after the body is validated, so a malformed body
is a 422 even while the model loads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request

from serving.engine import Engine
from serving.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CHOICES,
    DEFAULT_MAX_CLIENT_REQUESTS,
    DEFAULT_MAX_PROMPT_TOKENS,
    RequestLimits,
)
from serving.metrics import Metrics

RETRY_AFTER_S = "5"  # Retry-After (seconds) of a 503 while the model loads


@dataclass
class ServeConfig:
    model: str = "tiny-qwen2"
    random_weights: bool = False
    byte_tokenizer: bool = False  # serve a folder with ByteTokenizer instead of its own tokenizer
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    state_dir: str | None = None
    admin_token: str | None = None
    cuda_graphs: bool = False
    decode_attention: str = "auto"
    fuse_projections: str = "auto"
    fuse_norms: str = "auto"
    run_ahead: bool = True  # graph decode queues step k+1 before reading step k's greedy tokens
    prefill_graphs: bool = True  # with cuda_graphs: one-row prefill replays a graph per prompt-length bucket
    mixed_prompt_tokens: int | None = None  # short prompts join a decode step (serving.scheduler); None: auto
    max_batch: int = 8
    max_seq_len: int | None = None
    max_parity_shapes: int = 4
    graph_buckets: list[int] | None = None
    allow_unverified_swaps: bool = False  # swap without a valid attestation, with a warning each time
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger bodies: 413 before they are read
    max_choices: int = DEFAULT_MAX_CHOICES  # prompts x n per completions request
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS  # prompt tokens per request, all prompts together
    max_client_requests: int = DEFAULT_MAX_CLIENT_REQUESTS  # completions requests in flight per client; 0: off
    # Called (on the loader thread) with the one-line cause when the model fails to load or warm up:
    # `serve` stops the process with it. None: the server stays up and its probes report the error.
    on_load_failure: Callable[[str], None] | None = None

    def request_limits(self) -> RequestLimits:
        return RequestLimits(self.max_body_bytes, self.max_choices, self.max_prompt_tokens, self.max_client_requests)

    def resolved_state_dir(self) -> Path:
        if self.state_dir:
            path = Path(self.state_dir).expanduser().resolve()
            path.mkdir(parents=True, exist_ok=True)
            return path
        from gpuyantra.config import state_dir

        return state_dir()


@dataclass
class ServerState:
    config: ServeConfig
    metrics: Metrics
    attestation_key: bytes  # the key /admin/swap checks attestations with (gpuyantra/attestation.py)
    engine: Engine | None = None
    error: str | None = None
    loading: bool = True
    started_at: float = field(default_factory=time.time)
    reapplied: list[dict[str, Any]] = field(default_factory=list)
    description: dict[str, Any] = field(default_factory=dict)

    def require_engine(self) -> Engine:
        """The engine, or a 503: saying why loading failed, or (still loading) when to retry."""
        if self.engine is None:
            if self.error:
                raise HTTPException(503, self.error)
            raise HTTPException(503, "the model is still loading", headers={"Retry-After": RETRY_AFTER_S})
        return self.engine


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server  # set by serving.app.create_app
    return state


State = Annotated[ServerState, Depends(server_state)]  # a route parameter `state: State`
