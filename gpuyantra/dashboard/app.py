"""The dashboard's HTTP app: one page (`GET /`) and the JSON it polls (`/api/...`, docs/CONTRACTS.md
section 7).

Access: actions (rollback) always need the admin token (`Authorization: Bearer TOKEN`, compared
with hmac.compare_digest). Reads need it too unless the dashboard is bound to a loopback address;
there, requests must also name a loopback host, so a web page elsewhere cannot read it through DNS
rebinding. The page itself holds no data and loads without a token: it is where the token is typed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuyantra.dashboard.page import PAGE
from gpuyantra.dashboard.sources import NO_TOKEN, NoReport, Settings, Sources
from gpuyantra.server_client import ServerError

# The report holds no script and fetches nothing: its page may only draw itself (inline CSS and SVG).
REPORT_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

# How a server's refusal of a forwarded rollback reaches the page.
FORWARDED_STATUS = {"BadRequest": 400, "Conflict": 409, "Unauthorized": 502, "ServerUnreachable": 502}


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or the name localhost."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host of a Host header, without its port: `127.0.0.1:8300` -> `127.0.0.1`, `[::1]:80` -> `::1`."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def token_denial(expected: str | None, authorization: str | None) -> tuple[int, str] | None:
    """(status, why) when the request does not carry the admin token; None when it does."""
    if not expected:
        return 403, NO_TOKEN
    given = authorization[7:].strip() if authorization and authorization[:7].lower() == "bearer " else ""
    if not given or not hmac.compare_digest(given.encode(), expected.encode()):
        return 401, "missing or wrong admin token: send it as Authorization: Bearer TOKEN"
    return None


class LoopbackHostOnly:
    """Bound to loopback, answer only requests that name a loopback host (DNS-rebinding guard)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if not is_loopback(host_of(host)):
                response = JSONResponse(
                    status_code=403,
                    content={"detail": f"host {host!r} refused: this dashboard answers loopback names only"},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    swap_id: str = Field(..., min_length=1, description="the swap to roll back (GET /api/kernels `swap_id`)")


def create_app(settings: Settings, sources: Sources | None = None) -> FastAPI:
    sources = sources or Sources(settings)
    reads_need_token = not is_loopback(settings.host)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(sources.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # No /docs or /openapi.json: the API is documented in docs/CONTRACTS.md section 7, and a page
    # served without a token should hold nothing but the dashboard itself.
    app = FastAPI(
        title="gpuyantra dashboard", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.sources = sources
    if not reads_need_token:
        app.add_middleware(LoopbackHostOnly)

    def require(need: bool, authorization: str | None) -> None:
        denial = token_denial(settings.admin_token, authorization) if need else None
        if denial:
            raise HTTPException(denial[0], denial[1], headers={"WWW-Authenticate": "Bearer"})

    def can_read(authorization: str | None = Header(default=None)) -> None:
        require(reads_need_token, authorization)

    def can_act(authorization: str | None = Header(default=None)) -> None:
        require(True, authorization)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE, headers={"Cache-Control": "no-store"})

    @app.get("/api/status", dependencies=[Depends(can_read)])
    async def status() -> dict[str, Any]:
        return {
            "sources": {name: s.to_dict() for name, s in sources.status.items()},
            "server": settings.server_url,
            "temporal": settings.temporal_address,
            "namespace": settings.namespace,
            "reads_need_token": reads_need_token,
            "actions_enabled": bool(settings.admin_token),
        }

    @app.get("/api/campaigns", dependencies=[Depends(can_read)])
    async def campaigns() -> dict[str, Any]:
        return {"status": sources.status["temporal"].to_dict(), "campaigns": sources.campaigns}

    @app.get("/api/campaigns/{campaign_id}/report", dependencies=[Depends(can_read)], response_class=HTMLResponse)
    async def report(campaign_id: str) -> Any:
        try:
            page = await sources.report(campaign_id)
        except NoReport as exc:
            return JSONResponse(status_code=exc.status, content={"detail": str(exc)})
        return HTMLResponse(page, headers={"Cache-Control": "no-store", "Content-Security-Policy": REPORT_POLICY})

    @app.get("/api/metrics", dependencies=[Depends(can_read)])
    async def metrics() -> dict[str, Any]:
        return sources.metrics_view()

    @app.get("/api/kernels", dependencies=[Depends(can_read)])
    async def kernels() -> dict[str, Any]:
        return {"status": sources.status["kernels"].to_dict(), "active": sources.kernels}

    @app.post("/api/kernels/rollback", dependencies=[Depends(can_act)])
    async def rollback(body: RollbackBody) -> Any:
        try:
            return await sources.rollback(body.swap_id)
        except ServerError as exc:
            code = FORWARDED_STATUS.get(exc.kind, 502)
            return JSONResponse(status_code=code, content={"detail": str(exc).splitlines()[0]})

    @app.get("/api/skills", dependencies=[Depends(can_read)])
    async def skill_library(op: str = "", hardware: str = "", q: str = "") -> dict[str, Any]:
        return await sources.search_skills(op, hardware, q)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # One line for the page, never a traceback in the body.
        return JSONResponse(status_code=500, content={"detail": f"{type(exc).__name__}: {exc}".splitlines()[0]})

    return app
