"""One GPU worker per device: the worker command's device options, `up`'s workers on a machine with
several GPUs, and what `status` shows of a campaign waiting for a worker of its kind."""

from __future__ import annotations

import argparse

import pytest

from gpuyantra.campaign_client import progress_fields
from gpuyantra.cli import main
from gpuyantra.commands import up, worker
from gpuyantra.commands.status import campaign_line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["worker", "cpu", "--device", "cuda:1"], "--device and --devices are for GPU workers"),
        (["worker", "cpu", "--devices", "all"], "--device and --devices are for GPU workers"),
        (["worker", "gpu", "--device", "gpu1"], "expected cuda:N"),
    ],
)
def test_a_bad_device_option_is_one_line_and_exit_2(monkeypatch, capsys, argv: list[str], message: str) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # Port 1 on loopback: were the option not checked first, the worker would try to connect there.
    assert main([*argv, "--temporal", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_a_bad_hardware_kind_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["worker", "gpu", "--hardware-kind", "H100 80GB", "--temporal", "127.0.0.1:1"])
    assert exit_info.value.code == 2 and "lower-case letters" in capsys.readouterr().err


def test_a_device_is_the_one_gpu_its_worker_sees(monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    worker.see_one_gpu("cuda:1")
    assert worker.os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # the machine's numbering maps through it
    worker.see_one_gpu("cuda:1")
    assert worker.os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    with pytest.raises(ValueError, match="shows 1 GPU"):
        worker.see_one_gpu("cuda:1")  # only GPU 6 is visible now


def test_devices_all_starts_one_worker_per_gpu_with_the_same_options() -> None:
    args = argparse.Namespace(role="all", gpu_slots=4, hardware_kind="kind-x", server=["a=http://a"])
    argv = worker.per_device_argv(args, "t:7233", "cuda:1")
    assert argv[argv.index("worker") :] == [
        "worker",
        "all",
        "--temporal",
        "t:7233",
        "--device",
        "cuda:1",
        "--gpu-slots",
        "4",
        "--hardware-kind",
        "kind-x",
        "--server",
        "a=http://a",
    ]


def test_up_starts_a_gpu_worker_per_device() -> None:
    assert up.worker_commands([]) == up.worker_commands(["cuda:0"]) == [("all", [], "worker-all")]
    assert up.worker_commands(["cuda:0", "cuda:1", "cuda:2"]) == [
        ("all", ["--device", "cuda:0"], "worker-all"),
        ("gpu", ["--device", "cuda:1"], "worker-gpu-cuda1"),
        ("gpu", ["--device", "cuda:2"], "worker-gpu-cuda2"),
    ]


def test_status_says_what_a_campaign_waits_for() -> None:
    campaign = {
        "status": "running",
        "id": "c1",
        "elapsed_s": 65,
        "stage": "targets",
        "targets": [{"target": "rms_norm:N", "stage": "waiting-for-gpu-worker", "iteration": 1}],
        "waiting": "waiting for a GPU worker of kind nvidia-h100-80gb: none polls gpuyantra-gpu-nvidia-h100-80gb",
    }
    line = campaign_line(campaign)
    assert line.endswith("rms_norm:N waiting-for-gpu-worker (iteration 1); " + campaign["waiting"])
    # The progress query's `waiting` reaches `status` and the dashboard through progress_fields.
    assert progress_fields({"stage": "targets", "waiting": campaign["waiting"]})["waiting"] == campaign["waiting"]
    assert progress_fields({"stage": "targets"})["waiting"] is None
