"""benchmark_server: served speed at each batch the campaign asks for, measured while holding the
verifier's GPU timing lock (bounded wait, recorded), so no verification times on the GPU meanwhile."""

from __future__ import annotations

import fcntl
import os
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

import activities.gpu as gpu
from gpuyantra.campaign.records import BenchmarkInput
from gpuyantra.verifier.gpu_locks import hold_lock
from tests.verifier.conftest import can_take


@pytest.fixture
def lock_path(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUYANTRA_SERVERS", "fake=http://x")  # the worker trusts it
    from gpuyantra.verifier.baselines import timing_lock as verifier_timing_lock

    return verifier_timing_lock()


class FakeServer:
    """Stands in for AdminClient: answers /admin/benchmark per batch, noting whether the lock was free."""

    def __init__(self, lock_path) -> None:
        self.lock_path = lock_path
        self.asked: list[dict[str, Any]] = []
        self.lock_free_while_measuring: list[bool] = []
        self.gpu_shareable_while_measuring: list[bool] = []

    def __call__(self, server_url: str, token: str | None = None, timeout_s: float = 600.0) -> FakeServer:
        return self

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/admin/benchmark"
        self.asked.append(body)
        self.lock_free_while_measuring.append(can_take(self.lock_path))
        quiet = self.lock_path.with_name("gpu-quiet.lock")
        self.gpu_shareable_while_measuring.append(can_take(quiet, fcntl.LOCK_SH))
        return {"tokens_per_s": 100.0 * body["batch"], "batch": body["batch"], "relative_spread": 0.01, "repeats": 5}


def test_each_batch_is_measured_with_the_timing_lock_held(lock_path, monkeypatch):
    server = FakeServer(lock_path)
    monkeypatch.setattr(gpu, "AdminClient", server)
    result = ActivityEnvironment().run(gpu.benchmark_server, BenchmarkInput("http://x", batches=[8, 1]))
    assert [body["batch"] for body in server.asked] == [1, 8]
    assert all(body["repeats"] == 5 for body in server.asked)
    assert server.lock_free_while_measuring == [False, False]  # a verification would have waited
    assert server.gpu_shareable_while_measuring == [False, False]  # to time, and to check correctness
    assert can_take(lock_path)  # and may time again once the check is done
    assert result.batch == 1 and result.tokens_per_s == 100.0
    assert [answer.tokens_per_s for answer in result.batches] == [100.0, 800.0]
    assert result.timing_lock is not None
    assert result.timing_lock["held"] is True and result.timing_lock["waited_s"] >= 0
    assert result.timing_lock["locks"] == {"turn": True, "timing": True, "quiet": True}


def test_a_campaign_recorded_before_batches_measures_batch_one(lock_path, monkeypatch):
    server = FakeServer(lock_path)
    monkeypatch.setattr(gpu, "AdminClient", server)
    result = ActivityEnvironment().run(gpu.benchmark_server, BenchmarkInput("http://x"))
    assert [body["batch"] for body in server.asked] == [1] and result.tokens_per_s == 100.0


def test_the_wait_for_the_lock_is_bounded_and_recorded(lock_path, monkeypatch):
    server = FakeServer(lock_path)
    monkeypatch.setattr(gpu, "AdminClient", server)
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a verification timing its kernel
    try:
        result = gpu.measure_served_speed("http://x", [1], wait_s=0.2)
    finally:
        os.close(fd)
    assert result.timing_lock is not None
    assert result.timing_lock["held"] is False and result.timing_lock["waited_s"] >= 0.2
    assert result.timing_lock["locks"] == {"turn": True, "timing": False, "quiet": True}
    assert result.tokens_per_s == 100.0  # measured anyway, and said so


def test_the_lock_is_taken_once_it_is_released(tmp_path):
    path = tmp_path / "gpu-timing.lock"
    with hold_lock(path, wait_s=1.0) as first:
        assert first["held"] and not can_take(path)
        with hold_lock(path, wait_s=0.1) as second:
            assert not second["held"]
    assert can_take(path)
