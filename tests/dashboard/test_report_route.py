"""`GET /api/campaigns/{id}/report`: a completed campaign's report, and a one-line refusal for every
other campaign (the browser test opens a real one from the page)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from temporalio.client import Client

from gpuyantra.config import CONTROL_TASK_QUEUE
from gpuyantra.dashboard import Settings, Sources, create_app
from gpuyantra.dashboard.sources import NoReport
from gpuyantra.processes import Managed
from tests.dashboard.conftest import ADMIN_TOKEN, Dashboard, wait_for


class Reports(Sources):
    """Sources whose only answer is a report (no background loops: TestClient runs no lifespan here)."""

    async def report(self, campaign_id: str) -> str:
        if campaign_id == "done":
            return "<!DOCTYPE html><html><body><h1>gpuyantra campaign done</h1></body></html>"
        raise NoReport(409, f"campaign {campaign_id} is running, not completed: no report yet")


def test_report_route_serves_the_page_or_says_why_not() -> None:
    settings = Settings(server_url="http://127.0.0.1:1", temporal_address="127.0.0.1:1")
    client = TestClient(create_app(settings, Reports(settings)), base_url="http://127.0.0.1")
    page = client.get("/api/campaigns/done/report")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<h1>gpuyantra campaign done</h1>" in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")  # no script runs in it
    refused = client.get("/api/campaigns/busy/report")
    assert refused.status_code == 409
    assert refused.json() == {"detail": "campaign busy is running, not completed: no report yet"}

    exposed = Settings(server_url="http://127.0.0.1:1", temporal_address="127.0.0.1:1", host="0.0.0.0")
    guarded = TestClient(create_app(exposed, Reports(exposed)), base_url="http://127.0.0.1")
    assert guarded.get("/api/campaigns/done/report").status_code == 403  # no token configured: reads refused


@pytest.fixture(scope="module")
def reporting(tmp_path_factory: pytest.TempPathFactory, temporal: Managed) -> Iterator[dict[str, Dashboard]]:
    logs = tmp_path_factory.mktemp("dashboard-report-logs")
    started = {
        "live": Dashboard(
            logs, "--server", "http://127.0.0.1:1", "--temporal", temporal.info["address"], "--admin-token", ADMIN_TOKEN
        ),
        "dead": Dashboard(logs, "--server", "http://127.0.0.1:1", "--temporal", "127.0.0.1:1"),
    }
    try:
        for dashboard in started.values():
            dashboard.wait_ready()
        yield started
    finally:
        for dashboard in started.values():
            dashboard.stop()


async def _failed_campaign(address: str, workflow_id: str) -> None:
    client = await Client.connect(address)
    await client.start_workflow("OptimizeCampaign", {}, id=workflow_id, task_queue=CONTROL_TASK_QUEUE)


@pytest.mark.integration
def test_report_route_refuses_unknown_failed_and_unreachable(
    reporting: dict[str, Dashboard], temporal: Managed, workers: list[Managed]
) -> None:
    live, dead = reporting["live"], reporting["dead"]
    unknown = live.get("/api/campaigns/no-such-campaign/report")
    assert unknown.status_code == 404 and unknown.json() == {"detail": "no campaign no-such-campaign in default"}

    failed = f"dash-report-bad-input-{uuid.uuid4().hex[:6]}"
    asyncio.run(_failed_campaign(temporal.info["address"], failed))  # invalid input: it fails at once
    answer = wait_for(
        lambda: (r := live.get(f"/api/campaigns/{failed}/report")).status_code == 409 and "is failed" in r.text and r,
        30,
        "the failed campaign's refusal",
    )
    assert answer.json() == {"detail": f"campaign {failed} is failed, not completed: no report yet"}

    down = dead.get("/api/campaigns/anything/report")
    assert down.status_code == 502 and down.json()["detail"].startswith("cannot reach Temporal at 127.0.0.1:1")
