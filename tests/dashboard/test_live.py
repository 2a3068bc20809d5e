"""`gpuyantra dashboard`, `kernels` and `status` against real parts: the Temporal dev server with real
GPU/CPU workers running a real campaign, a uvicorn serving process, a Qdrant folder."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from gpuyantra.campaign.records import CampaignInput
from gpuyantra.config import CONTROL_TASK_QUEUE
from gpuyantra.processes import Managed
from tests.dashboard.conftest import ADMIN_TOKEN, REPO, Dashboard, wait_for
from tests.serving.helpers import RMS_NORM_KERNEL, attested

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CAMPAIGN_WITHIN_S = 120.0  # workers start, profile, benchmark, write and verify on the CPU: ~20 s here


# ------------------------------------------------------------------------------- fixtures


async def _start(address: str, workflow_id: str, arg: object) -> None:
    client = await Client.connect(address)
    await client.start_workflow("OptimizeCampaign", arg, id=workflow_id, task_queue=CONTROL_TASK_QUEUE)


async def _terminate(address: str, workflow_id: str) -> None:
    client = await Client.connect(address)
    try:
        await client.get_workflow_handle(workflow_id).terminate("dashboard tests done")
    except Exception:  # noqa: BLE001 - it may have ended already
        pass


@pytest.fixture(scope="module")
def campaigns(temporal: Managed, workers: list[Managed], served: Managed) -> Iterator[dict[str, str]]:
    """A campaign that stops at `awaiting-approval` (running, with a verdict in), and one whose input is
    invalid (failed at once: a past campaign)."""
    address = temporal.info["address"]
    running, failed = f"dash-running-{uuid.uuid4().hex[:6]}", f"dash-failed-{uuid.uuid4().hex[:6]}"
    params = CampaignInput(
        server_url=served.info["url"], ops=["rms_norm"], min_reward=1, max_iterations=1, require_approval=True
    )
    asyncio.run(_start(address, running, params))
    asyncio.run(_start(address, failed, {}))
    yield {"running": running, "failed": failed}
    asyncio.run(_terminate(address, running))


@pytest.fixture(scope="module")
def dashboards(
    tmp_path_factory: pytest.TempPathFactory, temporal: Managed, served: Managed, skills_folder: Path
) -> Iterator[dict[str, Dashboard]]:
    """Three dashboards started together: on loopback, on 0.0.0.0 (reads need the token), and one
    whose every source is unreachable."""
    logs = tmp_path_factory.mktemp("dashboard-logs")
    live = ["--server", served.info["url"], "--temporal", temporal.info["address"], "--admin-token", ADMIN_TOKEN]
    started = {
        "local": Dashboard(logs, *live, "--qdrant-path", str(skills_folder)),
        "open": Dashboard(logs, *live, "--qdrant-path", str(skills_folder), host="0.0.0.0"),
        "dead": Dashboard(
            logs,
            *("--server", "http://127.0.0.1:1", "--temporal", "127.0.0.1:1"),
            *("--qdrant-url", "http://127.0.0.1:1", "--admin-token", ADMIN_TOKEN),
        ),
    }
    try:
        for dashboard in started.values():
            dashboard.wait_ready()
        yield started
    finally:
        for dashboard in started.values():
            dashboard.stop()


def swap_rms_norm(url: str) -> str:
    source = RMS_NORM_KERNEL.read_text()
    response = httpx.post(
        f"{url}/admin/swap", json={"source": source, "attestation": attested(source)}, headers=AUTH, timeout=300
    )
    assert response.status_code == 200, response.text
    return response.json()["swap_id"]


def active_on_server(url: str) -> list[str]:
    return [k["swap_id"] for k in httpx.get(f"{url}/admin/kernels", headers=AUTH, timeout=30).json()["active"]]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuyantra.cli", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


# ------------------------------------------------------------------------------- the page and reads


def test_page_loads_with_no_external_url(dashboards: dict[str, Dashboard]) -> None:
    response = dashboards["local"].get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "<script>" in page and "/api/campaigns" in page and "/api/kernels/rollback" in page
    assert not re.search(r"https?://|\bsrc=|<link\b|@import|url\(", page), "the page must need nothing outside it"


def test_campaigns_running_with_progress_and_past(dashboards: dict[str, Dashboard], campaigns: dict[str, str]) -> None:
    local = dashboards["local"]

    def listed() -> dict[str, dict] | None:
        body = local.get("/api/campaigns").json()
        rows = {row["id"]: row for row in body["campaigns"]}
        running, failed = rows.get(campaigns["running"]), rows.get(campaigns["failed"])
        if running and failed and failed["status"] == "failed" and running["best_reward"] is not None:
            return {"running": running, "failed": failed, "status": body["status"]}
        return None

    seen = wait_for(listed, CAMPAIGN_WITHIN_S, "a running campaign with a verdict and a failed one")
    running, failed = seen["running"], seen["failed"]
    assert seen["status"]["ok"] and "1 running" in seen["status"]["message"]
    assert running["status"] == "running" and running["stage"] == "targets" and running["elapsed_s"] > 0
    [target] = running["targets"]
    assert target["target"].startswith("rms_norm:") and target["iteration"] == 1
    assert target["best_reward"] == 1 and running["best_reward"] == 1  # CPU: correct kernels score +1
    assert target["stage"] in ("learn", "awaiting-approval")
    assert failed["closed"] and failed["stage"] is None and failed["targets"] == []


def test_status_cli_shows_server_temporal_and_campaigns(
    served: Managed, temporal: Managed, campaigns: dict[str, str]
) -> None:
    url, address = served.info["url"], temporal.info["address"]

    def shown() -> subprocess.CompletedProcess | None:  # run alone, the campaign may still be verifying
        result = cli("status", "--server", url, "--temporal", address, "--admin-token", ADMIN_TOKEN)
        return result if "best +1" in result.stdout else None

    summary = wait_for(shown, CAMPAIGN_WITHIN_S, "`status` showing the campaign's verdict", every_s=2)
    assert summary.returncode == 0, summary.stdout + summary.stderr
    assert f"server    {url}: ready, tiny-qwen2 on cpu" in summary.stdout
    assert f"temporal  {address} (default): 1 campaign(s) running" in summary.stdout
    assert f"running    {campaigns['running']}" in summary.stdout and "best +1" in summary.stdout
    assert f"failed     {campaigns['failed']}" in summary.stdout

    down = cli("status", "--server", "http://127.0.0.1:1", "--temporal", address)
    assert down.returncode == 1  # the server is down: exit 1, the rest still shown
    assert "server not reachable at http://127.0.0.1:1" in down.stdout and campaigns["running"] in down.stdout


def test_metrics_sampled_into_a_line_chart(dashboards: dict[str, Dashboard], served: Managed) -> None:
    local = dashboards["local"]
    completion = {"prompt": "The quick brown fox", "max_tokens": 8}

    def sampled() -> dict | None:  # traffic in several sample intervals: latency points to join
        assert httpx.post(f"{served.info['url']}/v1/completions", json=completion, timeout=120).status_code == 200
        body = local.get("/api/metrics").json()
        with_latency = [s for s in body["samples"] if s["latency_s"] is not None]
        speed = [s for s in body["samples"] if (s["tokens_per_s"] or 0) > 0]
        return body if len(with_latency) >= 2 and speed else None

    body = wait_for(sampled, 30, "samples with tokens/s and request latency")
    assert body["status"]["ok"] and "tokens/s" in body["status"]["message"]
    assert body["interval_s"] == 2.0 and len(body["samples"]) >= 2
    times = [s["t"] for s in body["samples"]]
    assert times == sorted(times)
    for chart in ("tokens", "latency"):
        assert body["charts"][chart].startswith("<svg") and "<polyline" in body["charts"][chart]


def test_kernels_listed_and_rollback_needs_the_token(dashboards: dict[str, Dashboard], served: Managed) -> None:
    local, url = dashboards["local"], served.info["url"]
    swap_id = swap_rms_norm(url)
    listed = wait_for(
        lambda: [k for k in local.get("/api/kernels").json()["active"] if k["swap_id"] == swap_id],
        10,
        "the swapped kernel in /api/kernels",
    )
    assert listed[0]["op"] == "rms_norm" and listed[0]["modules"] >= 3

    body = {"swap_id": swap_id}
    assert local.post("/api/kernels/rollback", json=body).status_code == 401
    wrong = local.post("/api/kernels/rollback", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and swap_id in active_on_server(url)

    answer = local.post("/api/kernels/rollback", json=body, headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert [r["swap_id"] for r in answer.json()["rolled_back"]] == [swap_id]
    assert swap_id not in active_on_server(url)  # forwarded to the real server
    assert all(k["swap_id"] != swap_id for k in local.get("/api/kernels").json()["active"])

    again = local.post("/api/kernels/rollback", json=body, headers=AUTH)  # the server's refusal, passed on
    assert again.status_code in (400, 409) and "not active" in again.json()["detail"]


def test_kernels_cli_lists_and_rolls_back(served: Managed, tmp_path: Path) -> None:
    url = served.info["url"]
    swap_id = swap_rms_norm(url)
    token = {"GPUYANTRA_ADMIN_TOKEN": ADMIN_TOKEN}
    listing = cli("kernels", "list", "--server", url, env=token)
    assert listing.returncode == 0, listing.stderr
    assert swap_id in listing.stdout and "rms_norm" in listing.stdout

    kept = tmp_path / "state"  # the token `up` keeps in <state>/admin-token is found too
    kept.mkdir()
    (kept / "admin-token").write_text(ADMIN_TOKEN)
    no_env = {"GPUYANTRA_ADMIN_TOKEN": ""}
    rolled = cli("kernels", "rollback", "rms_norm", "--server", url, "--state-dir", str(kept), env=no_env)
    assert rolled.returncode == 0, rolled.stderr
    assert f"rolled back {swap_id}" in rolled.stdout and swap_id not in active_on_server(url)

    nothing = cli("kernels", "rollback", "rms_norm", "--server", url, "--admin-token", ADMIN_TOKEN)
    assert nothing.returncode == 1 and nothing.stderr.startswith("gpuyantra kernels: no active kernel is op")
    assert len(nothing.stderr.strip().splitlines()) == 1


def test_skills_searchable_with_bandit_statistics(dashboards: dict[str, Dashboard]) -> None:
    local = dashboards["local"]
    body = local.get("/api/skills").json()
    assert body["status"]["ok"] and len(body["skills"]) == 3
    norms = local.get("/api/skills", params={"op": "rms", "hardware": "CPU"}).json()["skills"]
    assert {s["op"] for s in norms} == {"rms_norm"} and len(norms) == 2
    pulled = next(s for s in norms if s["pulls"])
    assert pulled["pulls"] == 2 and pulled["mean_reward"] == 2.0 and pulled["ucb"] is not None
    assert not pulled["unpulled"]
    unpulled = next(s for s in norms if not s["pulls"])
    assert unpulled["unpulled"] and unpulled["ucb"] is None and unpulled["mean_reward"] is None
    bound = local.get("/api/skills", params={"q": "launch-bound"}).json()["skills"]
    assert [s["id"] for s in bound] == [unpulled["id"]] and "launch-bound" in bound[0]["fingerprint"]


def test_loopback_dashboard_answers_loopback_names_only(dashboards: dict[str, Dashboard]) -> None:
    local = dashboards["local"]
    assert local.get("/api/status").status_code == 200  # no token needed on loopback
    assert local.get("/api/status", headers={"Host": "attacker.example"}).status_code == 403


def test_non_loopback_host_needs_the_token_to_read(dashboards: dict[str, Dashboard]) -> None:
    exposed = dashboards["open"]
    assert exposed.get("/").status_code == 200  # the page holds no data: it is where the token is typed
    for path in ("/api/status", "/api/campaigns", "/api/metrics", "/api/kernels", "/api/skills"):
        assert exposed.get(path).status_code == 401, path
        assert exposed.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401, path
        assert exposed.get(path, headers=AUTH).status_code == 200, path
    assert exposed.get("/api/status", headers=AUTH).json()["reads_need_token"] is True


def test_without_a_token_exposed_dashboard_and_kernels_refuse(tmp_path: Path) -> None:
    no_token = {"GPUYANTRA_ADMIN_TOKEN": ""}  # and an empty state folder: no kept token either
    exposed = cli("dashboard", "--host", "0.0.0.0", "--state-dir", str(tmp_path), env=no_token)
    lines = exposed.stderr.strip().splitlines()
    assert exposed.returncode == 2 and len(lines) == 1
    assert lines[0].startswith("gpuyantra dashboard: --host 0.0.0.0 is not a loopback address")
    listing = cli("kernels", "list", "--server", "http://127.0.0.1:1", "--state-dir", str(tmp_path), env=no_token)
    assert listing.returncode == 1 and listing.stderr.strip().splitlines() == [
        "gpuyantra kernels: no admin token: give --admin-token (or $GPUYANTRA_ADMIN_TOKEN, or keep it in "
        "<state>/admin-token)"
    ]


def test_unreachable_sources_give_one_status_line_each(dashboards: dict[str, Dashboard]) -> None:
    dead = dashboards["dead"]
    dead.get("/api/skills")  # skills are fetched on request

    def checked() -> dict | None:
        sources = dead.get("/api/status").json()["sources"]
        return sources if all(s["message"] != "not checked yet" for s in sources.values()) else None

    sources = wait_for(checked, 20, "a status line from every source")
    assert sources["temporal"]["message"].startswith("cannot reach Temporal at 127.0.0.1:1")
    assert sources["metrics"]["message"].startswith("server not reachable at http://127.0.0.1:1")
    assert sources["kernels"]["message"].startswith("server not reachable at http://127.0.0.1:1")
    assert sources["skills"]["message"].startswith("cannot reach Qdrant at http://127.0.0.1:1")
    for source in sources.values():
        assert not source["ok"] and "\n" not in source["message"] and "Traceback" not in source["message"]
    assert dead.get("/api/campaigns").json()["campaigns"] == []
    assert dead.get("/api/kernels").json()["active"] == []
    assert dead.get("/").status_code == 200  # the page still loads and says so
    assert dead.process.poll() is None and "Traceback" not in dead.log()
