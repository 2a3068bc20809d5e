"""The served GPU's hardware kind in /admin/profile is the kind a GPU worker on that GPU announces,
so a campaign finds the worker's queue (a coarser name there left every verification waiting)."""

from __future__ import annotations

import pytest
import torch

from gpuyantra.campaign.records import ServerProfile
from gpuyantra.hardware import class_from_name, hardware_kind
from serving.profiling import served_kind
from workflows.campaign import server_kind

DEVICE_NAMES = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-40GB", "NVIDIA H100 PCIe"]


@pytest.mark.parametrize("device_name", DEVICE_NAMES)
def test_the_campaign_reads_the_kind_a_worker_on_the_served_gpu_polls(monkeypatch, device_name: str) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: device_name)
    answer = {"hardware": class_from_name(device_name), "hardware_kind": served_kind(torch.device("cuda"))}
    worker_kind = hardware_kind(device_name)  # gpuyantra/hardware.py:device_facts announces this kind
    assert server_kind(ServerProfile.from_answer(answer)) == worker_kind


def test_a_cpu_server_is_of_kind_cpu() -> None:
    assert served_kind(torch.device("cpu")) == "cpu"
