"""A campaign result is data anyone who can start a workflow writes: the report (`gpuyantra report`, the
dashboard's /api/campaigns/<id>/report) shows a kernel's source only from the state folder's own
candidates/, resolved, never from a path the result names elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuyantra import config
from gpuyantra.cli import main
from gpuyantra.report import render_html
from tests.report.results import gpu_result

SECRET = "admin-token-that-must-not-leak"


@pytest.fixture
def state(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path / "state"))
    folder = config.state_dir()
    (folder / "admin-token").write_text(SECRET)
    return folder


def paths_outside(state: Path) -> list[str]:
    """Ways a result may name the token file: directly, through candidates/.., through a link inside."""
    link = config.candidates_dir() / "campaign-x" / "rms_norm_X_1.py"
    link.parent.mkdir(parents=True)
    link.symlink_to(state / "admin-token")
    return [str(state / "admin-token"), str(config.candidates_dir() / ".." / "admin-token"), str(link)]


def test_a_result_naming_a_file_outside_candidates_shows_no_source(state):
    for path in paths_outside(state):
        page = render_html(gpu_result(path))
        assert SECRET not in page, path
        assert "Kernel source: absent." in page


def test_a_kept_candidate_is_shown(state):
    kept = config.candidates_dir() / "campaign-y" / "rms_norm_X_1.py"
    kept.parent.mkdir(parents=True)
    kept.write_text("OP = 'rms_norm'  # kept by the GPU worker\n")
    assert "kept by the GPU worker" in render_html(gpu_result(str(kept)))


def test_report_from_json_reads_no_file_the_result_names(state, tmp_path, capsys):
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(gpu_result(str(state / "admin-token"))))
    out = tmp_path / "report.html"
    assert main(["report", "--from-json", str(saved), "--out", str(out)]) == 0
    assert SECRET not in out.read_text()


class CompletedCampaign:
    """Stands in for Temporal: one completed campaign whose result is `result`."""

    def __init__(self, result: dict) -> None:
        self.result_value = result

    def get_workflow_handle(self, campaign_id: str) -> CompletedCampaign:
        return self

    async def describe(self) -> object:
        from types import SimpleNamespace

        from temporalio.client import WorkflowExecutionStatus

        return SimpleNamespace(status=WorkflowExecutionStatus.COMPLETED)

    async def result(self) -> dict:
        return self.result_value


def test_the_dashboards_report_route_reads_no_file_the_result_names(state):
    from fastapi.testclient import TestClient

    from gpuyantra.dashboard.app import create_app
    from gpuyantra.dashboard.sources import Settings, Sources

    settings = Settings(server_url="http://127.0.0.1:1", temporal_address="127.0.0.1:1")
    sources = Sources(settings)
    sources._temporal = CompletedCampaign(gpu_result(str(state / "admin-token")))
    app = create_app(settings, sources)
    page = TestClient(app, base_url="http://127.0.0.1").get("/api/campaigns/campaign-x/report")  # no token
    assert page.status_code == 200 and "Kernel source: absent." in page.text
    assert SECRET not in page.text
