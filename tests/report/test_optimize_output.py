"""`gpuyantra optimize --wait` against a fake Temporal client: what it prints, in which order, where
the report goes, and that Ctrl-C leaves the campaign running."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gpuyantra import campaign_client
from gpuyantra.cli import main
from tests.report.results import gpu_result

PROGRESS = [
    None,  # before the first workflow task: the query fails
    {"stage": "profile", "targets": {}, "deploying": None, "notices": []},
    {"stage": "profile", "targets": {}, "deploying": None, "notices": []},  # no change: no line
    {"stage": "targets", "targets": {"rms_norm:Qwen2RMSNorm": {"stage": "write", "iteration": 1}}, "notices": []},
    {"stage": "targets", "targets": {"rms_norm:Qwen2RMSNorm": {"stage": "verify", "iteration": 1}}, "notices": []},
    {
        "stage": "targets",
        "targets": {"rms_norm:Qwen2RMSNorm": {"stage": "verify", "iteration": 2}},
        "notices": ["approve 'x' matches no target of this campaign (rms_norm)"],
    },
    {"stage": "done", "targets": {"rms_norm:Qwen2RMSNorm": {"stage": "deployed", "iteration": 2}}, "notices": []},
]


class FakeHandle:
    def __init__(self, workflow_id: str, result: dict[str, Any], interrupt_after: int | None) -> None:
        self.id, self._result, self._interrupt_after = workflow_id, result, interrupt_after
        self.queries = 0

    async def query(self, name: str) -> Any:
        assert name == "progress"
        self.queries += 1
        if self._interrupt_after is not None and self.queries > self._interrupt_after:
            raise KeyboardInterrupt  # what Ctrl-C does inside asyncio.run
        progress = PROGRESS[min(self.queries, len(PROGRESS)) - 1]
        if progress is None:
            raise RuntimeError("no poller yet")
        return progress

    async def result(self) -> dict[str, Any]:
        while self.queries < len(PROGRESS):
            await asyncio.sleep(0.001)
        return self._result


class FakeClient:
    def __init__(self, interrupt_after: int | None = None) -> None:
        self.interrupt_after = interrupt_after
        self.started: list[str] = []

    async def list_workflows(self, query: str, limit: int):  # no campaign runs: nothing listed
        return
        yield

    async def start_workflow(self, workflow: str, params: Any, id: str, task_queue: str) -> FakeHandle:
        self.started.append(id)
        return FakeHandle(id, {**gpu_result(), "workflow_id": id}, self.interrupt_after)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    client = FakeClient()

    async def connect(address: str) -> FakeClient:
        return client

    monkeypatch.setattr(campaign_client, "connect", connect)
    monkeypatch.setattr(campaign_client, "POLL_S", 0.001)
    monkeypatch.setattr("gpuyantra.commands.optimize.check_reachable", lambda url: None)
    monkeypatch.setattr("gpuyantra.server_client.served_model", lambda url: "tiny-qwen2")
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path))
    return client


ARGS = [
    "optimize",
    "--server",
    "http://127.0.0.1:8000",
    "--ops",
    "rms_norm",
    "--min-reward",
    "1",
    "--temporal",
    "127.0.0.1:7233",
    "--wait",
]


def test_wait_prints_where_to_look_then_progress_then_summary_and_report(fake, capsys, tmp_path):
    assert main(ARGS) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    [workflow_id] = fake.started
    assert workflow_id.startswith("campaign-tiny-qwen2-rms_norm-127.0.0.1-8000-")
    assert lines[:4] == [
        f"Campaign {workflow_id} started.",
        f"  Web UI: http://127.0.0.1:8233/namespaces/default/workflows/{workflow_id}",
        f"  show:   temporal workflow show --address 127.0.0.1:7233 --workflow-id {workflow_id}",
        f"  cancel: temporal workflow cancel --address 127.0.0.1:7233 --workflow-id {workflow_id}",
    ]
    assert lines[4:11] == [
        "stage profile",
        "stage targets",
        "rms_norm:Qwen2RMSNorm: write (iteration 1)",
        "rms_norm:Qwen2RMSNorm: verify (iteration 1)",
        "rms_norm:Qwen2RMSNorm: verify (iteration 2)",
        "notice: approve 'x' matches no target of this campaign (rms_norm)",
        "stage done",
    ]
    assert lines[11] == "rms_norm:Qwen2RMSNorm: deployed (iteration 2)"
    assert lines[12].startswith(f"Campaign {workflow_id} finished: 1 deployed into http://127.0.0.1:8000, 2 rejected")
    assert any("deployed rms_norm (Qwen2RMSNorm): reward +3" in line for line in lines[13:])
    assert any(line.startswith("  served decode: 250.0 -> 262.0 tokens/s") for line in lines[13:])
    report = tmp_path / "reports" / f"{workflow_id}.html"
    assert lines[-1] == f"Report: {report}" and "<svg" in report.read_text()
    assert json.loads((tmp_path / "reports" / f"{workflow_id}.json").read_text())["workflow_id"] == workflow_id
    assert err == ""


def test_wait_json_keeps_stdout_to_the_result(fake, capsys):
    assert main([*ARGS, "--json"]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and json.loads(out)["deployed"][0]["op"] == "rms_norm"
    assert err.splitlines()[0] == f"Campaign {fake.started[0]} started." and "Report: " in err


def test_ctrl_c_leaves_the_campaign_running_and_says_how_to_follow(fake, capsys):
    fake.interrupt_after = 3
    assert main(ARGS) == 130
    out, err = capsys.readouterr()
    [workflow_id] = fake.started
    assert out.splitlines()[0] == f"Campaign {workflow_id} started." and "stage profile" in out
    assert f"campaign {workflow_id} keeps running" in err
    assert f"temporal workflow show --address 127.0.0.1:7233 --workflow-id {workflow_id} --follow" in err
    assert f"temporal workflow cancel --address 127.0.0.1:7233 --workflow-id {workflow_id}" in err


def test_progress_lines_show_every_stage_a_target_passed_between_two_polls():
    # A reused verdict turns verify into deploy within a poll: the trail still shows verify.
    from workflows.campaign import enter

    seen: dict[str, str] = {}
    target: dict[str, Any] = {}
    progress = {"stage": "search", "targets": {"rms_norm:Qwen2RMSNorm": target}, "notices": []}
    enter(target, "retrieve")
    first = campaign_client.progress_lines(seen, progress)
    assert first == ["stage search", "rms_norm:Qwen2RMSNorm: retrieve"]
    target["iteration"] = 1
    for stage in ("write", "verify", "deploy"):
        enter(target, stage)
    assert campaign_client.progress_lines(seen, progress) == [
        "rms_norm:Qwen2RMSNorm: write (iteration 1)",
        "rms_norm:Qwen2RMSNorm: verify (iteration 1)",
        "rms_norm:Qwen2RMSNorm: deploy (iteration 1)",
    ]
    assert campaign_client.progress_lines(seen, progress) == []  # nothing new, nothing printed


def test_progress_lines_say_what_the_campaign_waits_for_once():
    seen: dict[str, str] = {}
    note = "waiting for a GPU worker of kind k: none polls gpuyantra-gpu-k"
    progress = {"stage": "targets", "targets": {}, "notices": [], "waiting": note}
    assert campaign_client.progress_lines(seen, progress) == ["stage targets", note]
    assert campaign_client.progress_lines(seen, progress) == []
