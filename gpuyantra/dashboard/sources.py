"""What the dashboard shows, refreshed in the background: campaigns from Temporal, served speed from
the server's /metrics, the kernels swapped in (admin API), and on request the skill library.

Each source has its own loop and its own one-line status, so a dead Temporal never delays the
metrics samples and no failure ever reaches the page as a traceback. Endpoints answer from what
the loops last fetched, at once, however many pages poll them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

import gpuyantra.dashboard.skills as skills
from gpuyantra.campaign_client import TemporalUnreachable, connect, list_campaigns, one_line
from gpuyantra.dashboard.metrics import Ring, charts, parse
from gpuyantra.report import render_html
from gpuyantra.server_client import (
    LIST_TIMEOUT_S,
    ROLLBACK_TIMEOUT_S,
    AdminClient,
    ServerError,
    active_kernels,
)

log = logging.getLogger("gpuyantra.dashboard")

CONNECT_WITHIN_S = 2.0  # Temporal connect, retried within this
LIST_WITHIN_S = 5.0  # one listing of campaigns with their progress queries
REPORT_WITHIN_S = 10.0  # one finished campaign's description and result
SCRAPE_WITHIN_S = 2.0  # one GET /metrics
NO_TOKEN = (
    "no admin token: give --admin-token (or $GPUYANTRA_ADMIN_TOKEN, or keep it in <state>/admin-token) "
    "to list and roll back kernels"
)
# What a kernel record keeps on the page (the full record also holds module names and parity).
KERNEL_FIELDS = (
    "swap_id",
    "op",
    "module_class",
    "modules",
    "status",
    "binding",
    "calls",
    "fallbacks",
    "last_error",
    "committed_at",
    "reapplied_at",
    "origin",
    "digest",
)


@dataclass
class Settings:
    server_url: str
    temporal_address: str
    namespace: str = "default"
    admin_token: str | None = None
    qdrant_url: str | None = None
    qdrant_path: str | None = None
    host: str = "127.0.0.1"
    interval_s: float = 2.0
    history: int = 900  # samples kept: 30 minutes at 2 s
    campaigns_limit: int = 50


class NoReport(Exception):
    """No report to show: `status` is the HTTP status the page gets (404 no such campaign, 409 not
    completed, 502 Temporal down), the message one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Status:
    """One source's state as one line: `ok` false means the line says what is wrong."""

    ok: bool
    message: str
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Sources:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.ring = Ring(settings.history)
        self.campaigns: list[dict[str, Any]] = []
        self.kernels: list[dict[str, Any]] = []
        self.status: dict[str, Status] = {
            name: Status(False, "not checked yet") for name in ("temporal", "metrics", "kernels", "skills")
        }
        self._temporal: Any = None  # the connected temporalio Client, dropped after a failure
        self._skills_lock = asyncio.Lock()  # one Qdrant open at a time: local mode locks its folder

    # ------------------------------------------------------------------ background loops

    async def run(self) -> None:
        """Every loop until cancelled (the app's lifespan cancels it on shutdown)."""
        async with httpx.AsyncClient(timeout=SCRAPE_WITHIN_S) as http:
            await asyncio.gather(
                self._every("temporal", self.refresh_campaigns),
                self._every("metrics", lambda: self.sample_metrics(http)),
                self._every("kernels", self.refresh_kernels),
            )

    async def _every(self, source: str, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            started = time.monotonic()
            try:
                await step()
            except Exception as exc:  # noqa: BLE001 - a loop outlives any failure the step did not expect
                log.exception("dashboard: refreshing %s failed", source)
                self.status[source] = Status(False, f"refresh failed: {one_line(exc)}")
            await asyncio.sleep(max(self.settings.interval_s - (time.monotonic() - started), 0.1))

    async def refresh_campaigns(self) -> None:
        address = self.settings.temporal_address
        try:
            if self._temporal is None:
                self._temporal = await connect(address, CONNECT_WITHIN_S, self.settings.namespace)
            rows = await asyncio.wait_for(list_campaigns(self._temporal, self.settings.campaigns_limit), LIST_WITHIN_S)
        except Exception as exc:  # noqa: BLE001 - down, a dropped connection, a namespace that does not exist
            # Nothing stale on the page: what it lists is what Temporal said last time it answered.
            self._temporal, self.campaigns = None, []
            unreachable = isinstance(exc, TemporalUnreachable)
            why = str(exc) if unreachable else f"cannot list campaigns at {address}: {one_line(exc)}"
            self.status["temporal"] = Status(False, why)
            return
        self.campaigns = rows
        running = sum(1 for row in rows if row["status"] == "running")
        self.status["temporal"] = Status(
            True, f"{address} ({self.settings.namespace}): {running} running, {len(rows) - running} past"
        )

    async def sample_metrics(self, http: httpx.AsyncClient) -> None:
        url = f"{self.settings.server_url.rstrip('/')}/metrics"
        now = time.time()
        try:
            response = await http.get(url)
            response.raise_for_status()
            scrape = parse(response.text)
        except httpx.TransportError as exc:
            self.ring.gap(now)
            why = f"server not reachable at {self.settings.server_url}: {_why(exc)}"
            self.status["metrics"] = Status(False, f"{why}; start it with `gpuyantra serve` or fix --server")
            return
        except (httpx.HTTPStatusError, ValueError) as exc:
            self.ring.gap(now)
            self.status["metrics"] = Status(False, f"{url} gave no Prometheus text: {one_line(exc)}")
            return
        sample = self.ring.add(now, scrape)
        speed = "–" if sample.tokens_per_s is None else f"{sample.tokens_per_s:.1f}"
        self.status["metrics"] = Status(True, f"{self.settings.server_url}: {speed} tokens/s")

    async def refresh_kernels(self) -> None:
        if not self.settings.admin_token:
            self.status["kernels"] = Status(False, NO_TOKEN)
            return
        try:
            records = await asyncio.to_thread(active_kernels, self._admin(LIST_TIMEOUT_S))
        except ServerError as exc:
            self.kernels = []  # no rollback button for a swap the server may no longer have
            self.status["kernels"] = Status(False, str(exc).splitlines()[0])
            return
        self.kernels = [{key: getattr(record, key) for key in KERNEL_FIELDS} for record in records]
        self.status["kernels"] = Status(True, f"{len(records)} kernel(s) swapped in")

    # ------------------------------------------------------------------ on request

    def metrics_view(self) -> dict[str, Any]:
        samples = self.ring.samples()
        latest = next((s for s in reversed(samples) if s.tokens_per_s is not None), None)
        return {
            "status": self.status["metrics"].to_dict(),
            "interval_s": self.settings.interval_s,
            "samples": [s.to_dict() for s in samples],
            "latest": latest.to_dict() if latest else None,
            "charts": charts(samples, time.time()),
        }

    async def rollback(self, swap_id: str) -> dict[str, Any]:
        """Forward one rollback to the server with the admin token; ServerError as the server answered."""
        if not self.settings.admin_token:
            raise ServerError("Unauthorized", NO_TOKEN)
        answer = await asyncio.to_thread(self._admin(ROLLBACK_TIMEOUT_S).post, "/admin/rollback", {"swap_id": swap_id})
        await self.refresh_kernels()  # the page shows the new list at once, not one interval later
        return answer

    async def search_skills(self, op: str, hardware: str, text: str) -> dict[str, Any]:
        """The matching skills with the library's status line; the rows are empty when it failed."""
        settings = self.settings
        async with self._skills_lock:
            try:
                rows = await asyncio.wait_for(
                    asyncio.to_thread(skills.search, settings.qdrant_url, settings.qdrant_path, op, hardware, text),
                    skills.QDRANT_WITHIN_S * 3,
                )
                self.status["skills"] = Status(True, f"{self._library()}: {len(rows)} skill(s) match")
            except Exception as exc:  # noqa: BLE001 - an unreachable server, a busy folder: one line
                rows = []
                self.status["skills"] = Status(False, self._skills_problem(exc))
        return {"status": self.status["skills"].to_dict(), "skills": rows}

    async def report(self, campaign_id: str) -> str:
        """A completed campaign's report, the page `gpuyantra report` writes (gpuyantra/report/),
        from its result in Temporal; NoReport when there is none."""
        from temporalio.client import WorkflowExecutionStatus
        from temporalio.service import RPCError, RPCStatusCode

        address = self.settings.temporal_address
        try:
            client = self._temporal or await connect(address, CONNECT_WITHIN_S, self.settings.namespace)
            handle = client.get_workflow_handle(campaign_id)
            status = (await asyncio.wait_for(handle.describe(), REPORT_WITHIN_S)).status
            if status != WorkflowExecutionStatus.COMPLETED:
                name = status.name.lower() if status is not None else "unknown"
                raise NoReport(409, f"campaign {campaign_id} is {name}, not completed: no report yet")
            result = await asyncio.wait_for(handle.result(), REPORT_WITHIN_S)
        except TemporalUnreachable as exc:
            raise NoReport(502, str(exc)) from None
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise NoReport(404, f"no campaign {campaign_id} in {self.settings.namespace}") from None
            raise NoReport(502, f"cannot read campaign {campaign_id} at {address}: {one_line(exc)}") from None
        except TimeoutError:
            raise NoReport(502, f"Temporal at {address} did not answer within {REPORT_WITHIN_S:g} s") from None
        return await asyncio.to_thread(render_html, result)  # matplotlib: off the event loop

    # ------------------------------------------------------------------ helpers

    def _admin(self, timeout_s: float) -> AdminClient:
        return AdminClient(self.settings.server_url, self.settings.admin_token, timeout_s=timeout_s)

    def _library(self) -> str:
        return self.settings.qdrant_url or str(self.settings.qdrant_path or "the default Qdrant folder")

    def _skills_problem(self, exc: BaseException) -> str:
        from qdrant_client.http.exceptions import ResponseHandlingException

        if isinstance(exc, ResponseHandlingException):
            return f"cannot reach Qdrant at {self.settings.qdrant_url}: start it, or drop --qdrant-url"
        if isinstance(exc, TimeoutError):
            return f"the skill library {self._library()} stayed busy (a worker holds it); trying again"
        return f"skill library {self._library()}: {one_line(exc)}"


def _why(exc: BaseException) -> str:
    """httpx's transport errors often have an empty message: name the type then."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
