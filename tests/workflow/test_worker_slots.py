"""The GPU worker's slots: on CUDA several GPU-queue activities at once (a deployment never queues
behind a campaign's verifications; their timing phases still take turns), on CPU one."""

from __future__ import annotations

import concurrent.futures

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from gpuyantra.config import CPU_TASK_QUEUE, GPU_TASK_QUEUE
from workers.main import CUDA_GPU_SLOTS, build_workers, default_gpu_slots


def test_default_slots_follow_the_device() -> None:
    assert default_gpu_slots("cuda") == default_gpu_slots("cuda:1") == CUDA_GPU_SLOTS > 1
    assert default_gpu_slots("cpu") == 1


@pytest.mark.parametrize("role", ["gpu", "all"])
async def test_the_gpu_queue_takes_as_many_activities_as_slots(env: WorkflowEnvironment, role: str) -> None:
    # A client of its own: a client registers each worker it builds, one per task queue.
    client = await Client.connect(env.client.service_client.config.target_host)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as executor:
        workers = build_workers(client, role, executor, gpu_slots=5)
        slots = {w.task_queue: w.config().get("max_concurrent_activities") for w in workers}
    assert slots[GPU_TASK_QUEUE] == 5
    if role == "all":
        assert slots[CPU_TASK_QUEUE] == 4


def test_a_gpu_worker_imports_the_model_code_while_it_waits(monkeypatch, tmp_path) -> None:
    import sys

    from workers import main

    (tmp_path / "gy_model_code_probe.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(main, "MODEL_CODE", "gy_model_code_probe")
    main._import_model_code_in_background().join(timeout=60)
    assert sys.modules["gy_model_code_probe"].LOADED
    monkeypatch.delitem(sys.modules, "gy_model_code_probe")


def test_the_switch_interval_comes_from_the_environment(monkeypatch) -> None:
    from gpuyantra.config import DEFAULT_SWITCH_INTERVAL_MS, SWITCH_INTERVAL_ENV, switch_interval_s

    monkeypatch.delenv(SWITCH_INTERVAL_ENV, raising=False)
    assert switch_interval_s() == DEFAULT_SWITCH_INTERVAL_MS / 1000 < 0.005  # below Python's own 5 ms
    monkeypatch.setenv(SWITCH_INTERVAL_ENV, " 2.5 ")
    assert switch_interval_s() == 0.0025
    for bad in ("fast", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(SWITCH_INTERVAL_ENV, bad)
        with pytest.raises(ValueError, match=SWITCH_INTERVAL_ENV):
            switch_interval_s()


def test_a_bad_switch_interval_stops_the_worker_before_it_connects(monkeypatch, capsys) -> None:
    from gpuyantra.cli import main
    from gpuyantra.config import SWITCH_INTERVAL_ENV

    monkeypatch.setenv(SWITCH_INTERVAL_ENV, "fast")
    # Port 1 on loopback: were the setting not checked first, the worker would try to connect there.
    assert main(["worker", "all", "--temporal", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and SWITCH_INTERVAL_ENV in err and "'fast'" in err
