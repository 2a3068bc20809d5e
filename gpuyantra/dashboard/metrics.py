"""Served speed over time, from the serving process's Prometheus text (`GET /metrics`).

The server keeps counters (requests, latency sums) and a tokens/s gauge over its last 10 s
(serving/metrics.py). A dashboard sample holds the gauge and the mean request latency and time to
first token of the requests that finished between two scrapes (differences of the histograms' sums
and counts), so a chart shows how latency moves, not its average since the server started.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpuyantra.report import line_chart

TOKENS_PER_S = "gpuyantra_tokens_per_second"
LATENCY = "gpuyantra_request_latency_seconds"
TTFT = "gpuyantra_time_to_first_token_seconds"
ACTIVE = "gpuyantra_requests_active"
WAITING = "gpuyantra_requests_waiting"
REQUESTS = "gpuyantra_requests"


@dataclass(frozen=True)
class Scrape:
    """The figures of one /metrics answer that the dashboard draws (None: absent from the text)."""

    tokens_per_s: float | None = None
    latency_sum: float | None = None
    latency_count: float | None = None
    ttft_sum: float | None = None
    ttft_count: float | None = None
    active: float | None = None
    waiting: float | None = None
    requests_ok: float | None = None
    requests_error: float | None = None


def parse(text: str) -> Scrape:
    """The figures of a Prometheus text exposition; ValueError when it is not one."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            status = sample.labels.get("status")
            key = f"{sample.name}:{status}" if status else sample.name
            values[key] = float(sample.value)
    return Scrape(
        tokens_per_s=values.get(TOKENS_PER_S),
        latency_sum=values.get(f"{LATENCY}_sum"),
        latency_count=values.get(f"{LATENCY}_count"),
        ttft_sum=values.get(f"{TTFT}_sum"),
        ttft_count=values.get(f"{TTFT}_count"),
        active=values.get(ACTIVE),
        waiting=values.get(WAITING),
        requests_ok=values.get(f"{REQUESTS}_total:ok"),
        requests_error=values.get(f"{REQUESTS}_total:error"),
    )


def interval_mean(before: tuple[float | None, float | None], after: tuple[float | None, float | None]) -> float | None:
    """Mean of the observations a histogram got between two scrapes, from its (sum, count) pairs;
    None with none in between, or when the counts went down (the server restarted: no difference)."""
    (sum0, count0), (sum1, count1) = before, after
    if sum0 is None or count0 is None or sum1 is None or count1 is None:
        return None
    observed = count1 - count0
    return (sum1 - sum0) / observed if observed > 0 else None


@dataclass(frozen=True)
class Sample:
    t: float  # unix seconds of the scrape
    tokens_per_s: float | None
    latency_s: float | None  # mean latency of the requests finished since the previous sample
    ttft_s: float | None  # their mean time to first token
    active: float | None
    waiting: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Ring:
    """The last `capacity` samples (a bounded deque: memory stays flat however long it runs)."""

    def __init__(self, capacity: int) -> None:
        self._samples: deque[Sample] = deque(maxlen=capacity)
        self._last: Scrape | None = None

    def add(self, t: float, scrape: Scrape) -> Sample:
        last = self._last or Scrape()
        sample = Sample(
            t=t,
            tokens_per_s=scrape.tokens_per_s,
            latency_s=interval_mean((last.latency_sum, last.latency_count), (scrape.latency_sum, scrape.latency_count)),
            ttft_s=interval_mean((last.ttft_sum, last.ttft_count), (scrape.ttft_sum, scrape.ttft_count)),
            active=scrape.active,
            waiting=scrape.waiting,
        )
        self._samples.append(sample)
        self._last = scrape
        return sample

    def gap(self, t: float) -> None:
        """The server did not answer: a hole in the lines, and no difference across it."""
        self._samples.append(Sample(t, None, None, None, None, None))
        self._last = None

    def samples(self) -> list[Sample]:
        return list(self._samples)


def charts(samples: list[Sample], now: float) -> dict[str, str]:
    """Inline SVG line charts of tokens/s and latency, x in seconds before `now`. Latency lines join
    the samples that had requests finish (idle samples have no latency, but nothing changed either)
    and break only where the server did not answer."""
    tokens = [(s.t - now, s.tokens_per_s) for s in samples]
    latency = _milliseconds(samples, now, "latency_s")
    ttft = _milliseconds(samples, now, "ttft_s")
    return {
        "tokens": line_chart(
            "Served tokens/s (the server's 10 s window)", [("tokens/s", tokens)], "seconds (0: now)", "tokens/s"
        ),
        "latency": line_chart(
            "Request latency (mean of requests finished per sample)",
            [("latency", latency), ("first token", ttft)],
            "seconds (0: now)",
            "milliseconds",
        ),
    }


def _milliseconds(samples: list[Sample], now: float, name: str) -> list[tuple[float, float | None]]:
    points: list[tuple[float, float | None]] = []
    for s in samples:
        value = getattr(s, name)
        if value is not None:
            points.append((s.t - now, 1000 * value))
        elif s.tokens_per_s is None:  # a gap: the server did not answer
            points.append((s.t - now, None))
    return points
