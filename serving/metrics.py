"""Prometheus metrics of the serving process (one registry per app, served at `GET /metrics`)."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from serving.request import EngineObserver, GenRequest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
TOKENS_WINDOW_S = 10.0


class Metrics(EngineObserver):
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("gpuyantra_requests", "Completion requests by outcome", ["status"], registry=r)
        self.prompt_tokens = Counter("gpuyantra_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generated_tokens = Counter("gpuyantra_generated_tokens", "Tokens generated", registry=r)
        self.request_latency = Histogram(
            "gpuyantra_request_latency_seconds",
            "Request latency, submit to last token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gpuyantra_time_to_first_token_seconds", "Submit to first token", buckets=LATENCY_BUCKETS, registry=r
        )
        self.forward_latency = Histogram(
            "gpuyantra_forward_seconds",
            "One forward pass (prefill or decode step)",
            ["phase"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.decode_batch = Histogram(
            "gpuyantra_decode_batch_size",
            "Active requests per decode step",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.tokens_per_s = Gauge(
            "gpuyantra_tokens_per_second",
            f"Tokens generated per second over the last {TOKENS_WINDOW_S:g} s",
            registry=r,
        )
        self.waiting = Gauge("gpuyantra_requests_waiting", "Requests queued for a batch slot", registry=r)
        self.active = Gauge("gpuyantra_requests_active", "Requests in a batch slot", registry=r)
        self.swaps = Counter(
            "gpuyantra_swaps",
            "Swap attempts by result (committed, rolled_back, rejected, invalid, forbidden)",
            ["result"],
            registry=r,
        )
        self.rollbacks = Counter(
            "gpuyantra_rollbacks", "Rollbacks by cause (admin, fallback, parity, reapply)", ["cause"], registry=r
        )
        self.parity_failures = Counter(
            "gpuyantra_parity_failures", "Swaps refused because parity failed or raised", registry=r
        )
        self.fallbacks = Counter(
            "gpuyantra_kernel_fallbacks",
            "Swapped-kernel calls that raised and fell back to the original forward",
            registry=r,
        )
        self.active_swaps = Gauge("gpuyantra_active_swaps", "Swaps bound in the live model now", registry=r)
        for status in ("ok", "error", "cancelled"):
            self.requests.labels(status=status)
        for result in ("committed", "rolled_back", "rejected", "invalid", "forbidden"):
            self.swaps.labels(result=result)
        for cause in ("admin", "fallback", "parity", "reapply"):
            self.rollbacks.labels(cause=cause)
        for phase in ("prefill", "decode"):
            self.forward_latency.labels(phase=phase)
        self._window: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()
        self.tokens_per_s.set_function(self._tokens_per_s)

    # ------------------------------------------------------------------ engine hooks
    def on_forward(self, phase: str, rows: int, tokens: int, seconds: float) -> None:
        self.forward_latency.labels(phase=phase).observe(seconds)
        if phase == "decode":
            self.decode_batch.observe(tokens)
        produced = 1 if phase == "prefill" else tokens
        now = time.monotonic()
        with self._lock:
            self._window.append((now, produced))
            self._trim(now)

    def on_request_finished(self, request: GenRequest) -> None:
        status = {"length": "ok", "stop": "ok", "cancelled": "cancelled"}.get(request.finish_reason or "", "error")
        self.requests.labels(status=status).inc()
        self.prompt_tokens.inc(len(request.prompt_ids))
        self.generated_tokens.inc(len(request.output_ids))
        if request.finished_at is not None:
            self.request_latency.observe(request.finished_at - request.submitted_at)
        if request.first_token_at is not None:
            self.ttft.observe(request.first_token_at - request.submitted_at)

    def on_queue(self, waiting: int, active: int) -> None:
        self.waiting.set(waiting)
        self.active.set(active)

    def on_swap_event(self, kind: str, record: Any, **info: Any) -> None:
        if kind == "committed":
            self.swaps.labels(result="committed").inc()
        elif kind == "parity_failed":
            self.swaps.labels(result="rolled_back").inc()
            self.parity_failures.inc()
            self.rollbacks.labels(cause="parity").inc()
        elif kind == "rolled_back":
            self.rollbacks.labels(cause=info.get("cause", "admin")).inc()
        elif kind == "fallback":
            self.fallbacks.inc()

    def bind_active_swaps(self, fn) -> None:
        self.active_swaps.set_function(lambda: float(len(fn())))

    # ------------------------------------------------------------------ helpers
    def _trim(self, now: float) -> None:
        while self._window and now - self._window[0][0] > TOKENS_WINDOW_S:
            self._window.popleft()

    def _tokens_per_s(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            if not self._window:
                return 0.0
            total = sum(n for _, n in self._window)
        return total / TOKENS_WINDOW_S
