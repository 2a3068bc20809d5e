"""The dashboard page in a real headless Chromium, used as a user would, against real parts (the
Temporal dev server, CPU/GPU workers, a uvicorn serving process, `gpuyantra dashboard`):

1. a campaign waiting at approval shows on the page; approved by signal, its stage and status change
   on the page without a reload until it completes;
2. its report opens from the page's link in a new tab;
3. rolling back the kernel it deployed needs the token: without it, and with a wrong one, the page
   shows a refusal and the server keeps the kernel; with the admin token typed in, it is rolled back.

Screenshots of each step go to <tmp_path>/screenshots and, when $GPUYANTRA_TEST_ARTIFACTS is set,
are copied to $GPUYANTRA_TEST_ARTIFACTS/dashboard-browser. Skipped where Chromium is not installed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from gpuyantra.campaign.records import CampaignInput
from gpuyantra.config import CONTROL_TASK_QUEUE
from gpuyantra.processes import Managed
from tests.dashboard.browser import CHROMIUM, Chromium, Page
from tests.dashboard.conftest import ADMIN_TOKEN, Dashboard

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)),
        reason=f"no Chromium at {CHROMIUM} (apt-get install chromium, or set GPUYANTRA_CHROMIUM): "
        "the page is not tested in a browser",
    ),
]

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
AWAITING_WITHIN_S = 120.0  # profile, benchmark, write, verify on the CPU: 15-45 s here
FINISH_WITHIN_S = 90.0  # deploy, served-speed check, e2e-after: 15-30 s here
PAGE_WITHIN_S = 15.0  # what the page shows follows its source within two 2 s polls

# The cells of one row by header (the kernels' and report's columns have an empty header), or null.
ROW = """((table, key) => {
  const t = document.getElementById(table);
  const row = t.querySelector("tbody tr[data-key='" + CSS.escape(key) + "']");
  if (!row || t.style.display === "none") return null;
  const heads = [...t.tHead.rows[0].cells].map((c, i) => c.textContent || "column" + i);
  return Object.fromEntries(heads.map((h, i) => [h, row.cells[i].innerText]));
})"""


async def _campaign(address: str, workflow_id: str, action: str, arg: Any = None) -> None:
    client = await Client.connect(address)
    if action == "start":
        await client.start_workflow("OptimizeCampaign", arg, id=workflow_id, task_queue=CONTROL_TASK_QUEUE)
    elif action == "approve":
        await client.get_workflow_handle(workflow_id).signal("approve", arg)
    else:
        try:
            await client.get_workflow_handle(workflow_id).terminate("dashboard browser test done")
        except Exception:  # noqa: BLE001 - it completed
            pass


@pytest.fixture(scope="module")
def dashboard(
    tmp_path_factory: pytest.TempPathFactory,
    temporal: Managed,
    workers: list[Managed],
    served: Managed,
    skills_folder: Path,
) -> Iterator[Dashboard]:
    logs = tmp_path_factory.mktemp("dashboard-browser-logs")
    started = Dashboard(
        logs,
        *("--server", served.info["url"], "--temporal", temporal.info["address"], "--admin-token", ADMIN_TOKEN),
        *("--qdrant-path", str(skills_folder)),
    )
    try:
        yield started.wait_ready()
    finally:
        started.stop()


@pytest.fixture
def shots(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "screenshots"
    folder.mkdir()
    yield folder
    artifacts = os.environ.get("GPUYANTRA_TEST_ARTIFACTS")
    if artifacts:  # failed runs too: the last screenshot shows where it stopped
        shutil.copytree(folder, Path(artifacts) / "dashboard-browser", dirs_exist_ok=True)


def row(page: Page, table: str, key: str) -> dict[str, str] | None:
    return page.eval(f"{ROW}({json.dumps(table)}, {json.dumps(key)})")


def active_on_server(url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/admin/kernels", headers=AUTH, timeout=30).json()["active"]


def test_follow_approve_report_and_roll_back_in_the_page(
    dashboard: Dashboard, temporal: Managed, served: Managed, tmp_path: Path, shots: Path
) -> None:
    address, server = temporal.info["address"], served.info["url"]
    campaign = f"dash-browser-{uuid.uuid4().hex[:6]}"
    params = CampaignInput(server_url=server, ops=["rms_norm"], min_reward=1, max_iterations=1, require_approval=True)
    asyncio.run(_campaign(address, campaign, "start", params))
    try:
        with Chromium(tmp_path / "chromium") as browser:
            page = browser.open(dashboard.url + "/")
            page.eval("window.loadedOnce = 'no reload since'")  # gone if the page ever reloads
            try:
                started = time.monotonic()
                follow_and_approve(page, address, campaign, shots)
                print(f"campaign followed to completion: {time.monotonic() - started:.1f} s")
                open_the_report(browser, page, campaign, shots)
                print(f"report opened: {time.monotonic() - started:.1f} s")
                roll_back_with_the_token(browser, page, server, shots)
                print(f"rolled back: {time.monotonic() - started:.1f} s")
            except BaseException:
                page.screenshot(shots / "99-failed.png")
                raise
            assert page.eval("window.loadedOnce") == "no reload since"
    finally:
        asyncio.run(_campaign(address, campaign, "terminate"))


def follow_and_approve(page: Page, address: str, campaign: str, shots: Path) -> None:
    """The campaign's row changes on the page, with no reload: awaiting approval, then approved, on to
    completed."""
    waiting = page.wait(
        lambda: (r := row(page, "campaigns", campaign)) and "awaiting-approval" in r["targets"] and r,
        AWAITING_WITHIN_S,
        "the campaign awaiting approval on the page",
    )
    assert waiting["status"] == "running" and waiting["stage"] == "targets" and waiting["model"] == "tiny-qwen2"
    assert waiting["targets"].startswith("rms_norm:") and "(iteration 1), best +1" in waiting["targets"]
    assert waiting["best reward"] == "+1" and waiting["column9"] == "\u2013"  # no report while it runs
    assert (page.text("#src-temporal") or "").startswith(f"Temporal: {address} (default): ")
    page.screenshot(shots / "01-awaiting-approval.png")
    print(f"awaiting approval on the page after {waiting['elapsed']}")

    asyncio.run(_campaign(address, campaign, "approve", "rms_norm"))
    seen: list[tuple[str, str, str]] = []
    deadline = time.monotonic() + FINISH_WITHIN_S
    while time.monotonic() < deadline:
        now = row(page, "campaigns", campaign)
        shown = (now["status"], now["stage"], now["targets"]) if now else ("", "", "")
        if not seen or seen[-1] != shown:
            seen.append(shown)
            if shown[0] == "running" and "awaiting-approval" not in shown[2]:
                page.screenshot(shots / f"02-progress-{len(seen):02d}.png")
        if shown[0] == "completed":
            break
        time.sleep(0.25)
    assert seen and seen[-1][0] == "completed", f"the page showed {seen}"
    progressing = [targets for status, _, targets in seen if status == "running" and "awaiting-approval" not in targets]
    assert progressing, f"the page never showed the approved campaign at work: {seen}"  # each benchmark takes > 4 s
    print("after approval the page showed:", *progressing, "completed", sep="\n  ")
    done = row(page, "campaigns", campaign)
    assert done is not None
    assert done["stage"] == "\u2013" and done["targets"] == "\u2013"  # a closed campaign shows its result, not progress
    assert done["deployed"] == "1" and done["column9"] == "report"
    assert page.eval("window.loadedOnce") == "no reload since"
    page.screenshot(shots / "03-completed.png")


def open_the_report(browser: Chromium, page: Page, campaign: str, shots: Path) -> None:
    """The row's report link opens the campaign's report (gpuyantra/report.py's page) in a new tab."""
    tabs_before = {t["targetId"] for t in browser.tabs()}
    page.click(f"#campaigns tbody tr[data-key='{campaign}'] a")
    report = browser.wait_for_tab(
        lambda t: t["targetId"] not in tabs_before and t["url"].startswith("blob:"), PAGE_WITHIN_S, "the report tab"
    )
    title = report.wait(lambda: report.text("h1"), PAGE_WITHIN_S, "the report's title")
    assert title == f"gpuyantra campaign {campaign}"
    target = report.text("h3#rms_norm") or ""
    assert target.startswith("rms_norm (") and target.endswith(": deployed")
    assert "Verified on a CPU: speed is not judged" in report.eval("document.body.innerText")
    report.screenshot(shots / "04-report.png")
    assert page.text("#report-state") == f"Opened the report of {campaign} in a new tab."
    report.close()


def roll_back_with_the_token(browser: Chromium, page: Page, server: str, shots: Path) -> None:
    """Roll back the kernel the campaign deployed: refused without the token and with a wrong one (the
    kernel stays on the server), done once the admin token is typed into the page."""
    [kernel] = [k for k in active_on_server(server) if k["op"] == "rms_norm"]
    swap_id = kernel["swap_id"]
    listed = page.wait(lambda: row(page, "kernels", swap_id), PAGE_WITHIN_S, "the deployed kernel on the page")
    assert listed["op"] == "rms_norm" and listed["column8"] == "Roll back"
    assert page.text("#token-state") == "no token"
    button = f"#kernels tbody tr[data-key='{swap_id}'] button"

    def roll_back(expected: str) -> str:
        page.eval("document.getElementById('action').textContent = ''")
        asked = len(browser.dialogs)
        page.click(button)
        shown = page.wait(lambda: page.text("#action"), PAGE_WITHIN_S, f"the page's answer ({expected})")
        assert browser.dialogs[asked:] == [f"Roll back rms_norm ({swap_id})?"]  # the page asked first
        return shown

    assert roll_back("no token") == "Type the admin token first."
    assert swap_id in [k["swap_id"] for k in active_on_server(server)]
    assert row(page, "kernels", swap_id) is not None
    page.screenshot(shots / "05-rollback-without-token.png")

    use_token(page, "not-the-token")
    refused = roll_back("wrong token")
    assert refused == "Rollback refused: missing or wrong admin token: send it as Authorization: Bearer TOKEN"
    assert swap_id in [k["swap_id"] for k in active_on_server(server)]
    assert row(page, "kernels", swap_id) is not None
    page.screenshot(shots / "06-rollback-wrong-token.png")

    use_token(page, ADMIN_TOKEN)
    assert roll_back("admin token") == f"Rolled back {swap_id} (rms_norm)"
    assert swap_id not in [k["swap_id"] for k in active_on_server(server)]
    page.wait(
        lambda: row(page, "kernels", swap_id) is None and page.text("#kernels-empty") == "None.",
        PAGE_WITHIN_S,
        "the kernel gone from the page",
    )
    assert page.text("#src-kernels") == "Kernels: 0 kernel(s) swapped in"
    page.screenshot(shots / "07-rolled-back.png")


def use_token(page: Page, token: str) -> None:
    """Type the token into the page's field and press Use: the field is cleared, the tab keeps it."""
    page.type("#token", token)
    page.click("#token-form button")
    page.wait(lambda: page.eval("document.getElementById('token').value === ''"), PAGE_WITHIN_S, "the field cleared")
    assert page.text("#token-state") == "token set for this tab"
    assert page.eval("sessionStorage.getItem('gpuyantra-admin-token')") == token
