"""The dashboard's pure parts: Prometheus samples, progress rows, access rules, charts, skill rows."""

from __future__ import annotations

import math

import pytest

from gpuyantra.campaign_client import progress_fields
from gpuyantra.dashboard.app import host_of, is_loopback, token_denial
from gpuyantra.dashboard.metrics import Ring, Scrape, charts, interval_mean, parse
from gpuyantra.dashboard.skills import matches, skill_rows
from gpuyantra.report import line_chart
from tests.skills.conftest import make_skill

METRICS = """# TYPE gpuyantra_tokens_per_second gauge
gpuyantra_tokens_per_second 12.5
# TYPE gpuyantra_request_latency_seconds histogram
gpuyantra_request_latency_seconds_bucket{le="+Inf"} 4.0
gpuyantra_request_latency_seconds_count 4.0
gpuyantra_request_latency_seconds_sum 2.0
# TYPE gpuyantra_requests_total counter
gpuyantra_requests_total{status="ok"} 4.0
gpuyantra_requests_total{status="error"} 1.0
# TYPE gpuyantra_requests_active gauge
gpuyantra_requests_active 2.0
"""


def test_parse_reads_the_served_figures() -> None:
    scrape = parse(METRICS)
    assert scrape.tokens_per_s == 12.5 and scrape.latency_sum == 2.0 and scrape.latency_count == 4.0
    assert scrape.requests_ok == 4.0 and scrape.requests_error == 1.0 and scrape.active == 2.0
    assert scrape.ttft_sum is None and scrape.waiting is None


def test_latency_is_the_mean_of_the_requests_between_samples() -> None:
    assert interval_mean((2.0, 4.0), (5.0, 6.0)) == 1.5
    assert interval_mean((2.0, 4.0), (2.0, 4.0)) is None  # nothing finished in between
    assert interval_mean((2.0, 4.0), (0.1, 1.0)) is None  # counters reset: the server restarted
    assert interval_mean((None, None), (0.1, 1.0)) is None


def test_ring_is_bounded_and_breaks_at_gaps() -> None:
    ring = Ring(capacity=3)
    ring.add(1.0, Scrape(tokens_per_s=1.0, latency_sum=1.0, latency_count=1.0))
    second = ring.add(2.0, Scrape(tokens_per_s=2.0, latency_sum=4.0, latency_count=3.0))
    assert second.latency_s == 1.5
    ring.gap(3.0)
    after_gap = ring.add(4.0, Scrape(tokens_per_s=3.0, latency_sum=9.0, latency_count=5.0))
    assert after_gap.latency_s is None  # no difference across a gap
    assert [s.t for s in ring.samples()] == [2.0, 3.0, 4.0]
    drawn = charts(ring.samples(), now=4.0)
    assert drawn["tokens"].count("<circle") == 2  # two one-point runs around the gap, no line across it


def test_line_chart_escapes_and_draws_each_series() -> None:
    svg = line_chart("a <b>", [("x&y", [(0.0, 1.0), (1.0, 2.0)]), ("none", [(0.0, None)])], "s", "ms")
    assert svg.startswith("<svg") and "a &lt;b&gt;" in svg and "x&amp;y" in svg and svg.count("<polyline") == 1
    assert line_chart("empty", [("a", [])], "s", "ms").startswith("<svg")


def test_progress_fields_of_a_running_campaign() -> None:
    fields = progress_fields(
        {
            "stage": "targets",
            "deploying": None,
            "notices": ["approve ignored"],
            "targets": {
                "silu_mul:LlamaMLP": {"stage": "write", "iteration": 2, "best_reward": -1},
                "rms_norm:Qwen2RMSNorm": {"stage": "verify", "iteration": 3, "best_reward": 2},
            },
        }
    )
    assert fields["stage"] == "targets" and fields["best_reward"] == 2 and fields["notices"] == ["approve ignored"]
    assert [t["target"] for t in fields["targets"]] == ["rms_norm:Qwen2RMSNorm", "silu_mul:LlamaMLP"]
    assert fields["targets"][0] == {
        "target": "rms_norm:Qwen2RMSNorm",
        "stage": "verify",
        "iteration": 3,
        "best_reward": 2,
    }
    assert progress_fields(None)["targets"] == [] and progress_fields("junk")["best_reward"] is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("example.com", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_host_header_without_port() -> None:
    assert host_of("127.0.0.1:8300") == "127.0.0.1" and host_of("[::1]:8300") == "::1"
    assert host_of("localhost") == "localhost" and host_of("evil.example:80") == "evil.example"


def test_token_denial() -> None:
    assert token_denial("secret", "Bearer secret") is None and token_denial("secret", "bearer  secret ") is None
    assert token_denial("secret", None)[0] == 401 and token_denial("secret", "Bearer wrong")[0] == 401
    assert token_denial("secret", "secret")[0] == 401  # the scheme is required
    assert token_denial(None, "Bearer anything")[0] == 403  # no token configured: actions are off


def test_skill_rows_score_over_the_arms_retrieval_offers_together() -> None:
    a, b = make_skill("rms_norm", "cpu", "a"), make_skill("rms_norm", "cpu", "b")
    other = make_skill("silu_mul", "cpu", "c")
    a.pulls, a.total_reward = 3, 9.0
    b.pulls, b.total_reward = 1, -1.0
    other.pulls, other.total_reward = 50, 150.0
    rows = {row["id"]: row for row in skill_rows([a, b, other])}
    assert rows[a.id]["mean_reward"] == 3.0 and rows[b.id]["mean_reward"] == -1.0
    assert rows[a.id]["ucb"] == pytest.approx(1 + math.sqrt(2) * math.sqrt(math.log(4) / 3), abs=1e-4)
    # 4 pulls in the rms_norm/cpu group: silu_mul's 50 pulls are not counted.
    assert rows[b.id]["ucb"] == pytest.approx(0 + math.sqrt(2) * math.sqrt(math.log(4) / 1), abs=1e-4)
    fresh = make_skill("rms_norm", "cpu", "d")
    assert skill_rows([fresh])[0]["unpulled"] and skill_rows([fresh])[0]["ucb"] is None


def test_skill_filters_are_case_insensitive_substrings() -> None:
    skill = make_skill("rms_norm", "nvidia-h200", regime="memory-bound")
    assert matches(skill, "", "", "") and matches(skill, "RMS", "H200", "Memory-Bound")
    assert not matches(skill, "silu", "", "") and not matches(skill, "", "", "launch-bound")
