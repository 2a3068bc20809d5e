"""What the engine serves and reports: a generation request, its errors, and the observer hooks."""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gpuyantra.swap.records import SwapRecord


class EngineObserver:
    """Hooks the engine calls (from its thread); `serving.metrics` implements them with Prometheus."""

    def on_forward(self, phase: str, rows: int, tokens: int, seconds: float) -> None: ...
    def on_request_finished(self, request: GenRequest) -> None: ...
    def on_queue(self, waiting: int, active: int) -> None: ...
    def on_swap_event(self, kind: str, record: SwapRecord, **info: Any) -> None: ...


class RequestError(ValueError):
    """A request the engine cannot run as asked (HTTP 400)."""


class EngineNotReady(RuntimeError):
    pass


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    # Log-probabilities of the generated tokens (log_softmax of the model's float32 logits, before
    # temperature / top_p): None = off; k >= 0 = each token's own plus the k most likely alternatives.
    logprobs: int | None = None
    # Who asked (the HTTP client's address; None in-process): waiting requests are admitted fairly
    # between clients (serving.scheduler.share_between_clients).
    client: str | None = None
    on_token: Callable[[int], None] | None = None
    on_finish: Callable[[GenRequest], None] | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    output_ids: list[int] = field(default_factory=list)
    # with `logprobs`: one (logprob, [(token_id, logprob), ...k most likely]) per output id, appended
    # before on_token sees the token
    output_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    finish_reason: str | None = None  # length | stop | cancelled | error
    error: str | None = None
    cancelled: bool = False
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class _Slot:
    request: GenRequest
    pos: int  # position the next fed token is written at
    last_token: int
    generator: torch.Generator | None = None


@dataclass
class _AdminOp:
    fn: Callable[[], Any]
    exclusive: bool
    future: concurrent.futures.Future
    name: str
