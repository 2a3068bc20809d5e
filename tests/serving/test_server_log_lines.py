"""The server's log says what happened to its kernels, one line each (swap, refusal, rollback), and
profiling from the engine's thread logs no profiler-library error."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from concurrent.futures import Future
from typing import Any

import pytest

from gpuyantra.swap.records import SwapError, SwapRecord
from serving import routes_admin
from serving.admin_schema import RollbackBody, SwapBody

RECORD = SwapRecord(
    swap_id="swap-0001-abcd", op="rms_norm", model="tiny", file="/k.py", digest="0" * 64, status="committed"
)
RECORD.module_class, RECORD.modules = "Qwen2RMSNorm", 5


class Engine:
    """Runs what the route hands to the engine's thread at once, or raises `fails`."""

    def __init__(self, fails: SwapError | None = None) -> None:
        self.fails = fails
        self.device = type("Device", (), {"type": "cpu"})()
        self.swaps = type("Swaps", (), {"active": staticmethod(lambda: [])})()

    def call(self, work: Any, **_: Any) -> Future:
        done: Future = Future()
        if self.fails is not None:
            done.set_exception(self.fails)
        else:
            done.set_result(work())
        return done


class State:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.metrics = type("Metrics", (), {"swaps": None})()
        self.config = type("Config", (), {"allow_unverified_swaps": True})()
        self.attestation_key = b"k"

    def require_engine(self) -> Engine:
        return self.engine


def kernel_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpuyantra.serving"]


def test_a_swap_and_a_rollback_are_one_line_each(caplog: pytest.LogCaptureFixture) -> None:
    engine = Engine()
    engine.swaps.swap = lambda *a, **k: RECORD  # type: ignore[attr-defined]
    engine.swaps.rollback = lambda *a, **k: [RECORD]  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO, "gpuyantra.serving"):
        asyncio.run(routes_admin.swap(SwapBody(source="OP = 'rms_norm'"), State(engine)))  # type: ignore[arg-type]
        asyncio.run(routes_admin.rollback(RollbackBody(swap_id=RECORD.swap_id), State(engine)))  # type: ignore[arg-type]
    assert kernel_lines(caplog) == [
        "swap swap-0001-abcd: rms_norm into 5 Qwen2RMSNorm module(s), committed",
        "rollback swap-0001-abcd: rms_norm restored to its original forward in 5 module(s)",
    ]


def test_a_refused_swap_is_one_warning(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes_admin, "count_refusal", lambda metrics, exc: None)
    engine = Engine(fails=SwapError("parity failed on (1, 64)"))
    with caplog.at_level(logging.INFO, "gpuyantra.serving"):
        asyncio.run(routes_admin.swap(SwapBody(source="OP = 'rms_norm'"), State(engine)))  # type: ignore[arg-type]
    assert kernel_lines(caplog) == ["swap refused (409 rejected): parity failed on (1, 64)"]


PROFILE_FROM_ANOTHER_THREAD = """
import threading, torch
from serving.profiling import prepare_profiler_on_this_thread
prepare_profiler_on_this_thread("cpu")
def profile():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        torch.ones(4) + 1
thread = threading.Thread(target=profile)
thread.start()
thread.join()
"""


def test_profiling_on_the_engine_thread_logs_no_profiler_error() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROFILE_FROM_ANOTHER_THREAD], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "External init callback" not in done.stderr
