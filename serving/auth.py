"""Bearer-token authentication of the admin API (`/admin` and everything under it).

`AdminAuth.denial` is the one place the token is compared (`hmac.compare_digest`), once per request:
- `AdminAuthMiddleware` calls it before FastAPI reads the body, so an unauthenticated request is a
  401 even when its body is malformed (FastAPI parses bodies before any dependency runs), and marks
  the request as checked;
- `require_admin`, the dependency of every admin route, declares the bearer scheme in the OpenAPI
  schema (`ADMIN_BEARER`, with the 401 it answers: `UNAUTHORIZED`) and lets a checked request through;
  it compares the token itself only for a request the middleware did not see (a router mounted on an
  app without it), so it never fails open.
With no token configured the admin API is disabled: every admin request is a 401 saying so.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

from serving.responses import DetailBody

ADMIN_PREFIX = "/admin"
CHALLENGE = {"WWW-Authenticate": "Bearer"}
_CHECKED = "admin_token_checked"  # request.state flag the middleware sets on an authenticated request

# The scheme as the OpenAPI schema declares it (a security requirement, not a header parameter, so clients
# and fuzzers know where the token goes); it never refuses by itself: `AdminAuth.denial` decides.
ADMIN_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="adminToken",
    description="the admin token: `gpuyantra serve --admin-token` or $GPUYANTRA_ADMIN_TOKEN",
)
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {
        "model": DetailBody,
        "description": "no token, a wrong one, or a server without a token (the admin API is disabled)",
        "headers": {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    }
}


class AdminAuth:
    def __init__(self, token: str | None) -> None:
        self._token = token

    def denial(self, authorization: str | None) -> str | None:
        """Why a request with this `Authorization` header is refused (None: allowed)."""
        if not self._token:
            return "the admin API is disabled: start the server with --admin-token or GPUYANTRA_ADMIN_TOKEN"
        given = ""
        if authorization and authorization[:7].lower() == "bearer ":
            given = authorization[7:].strip()
        if not given or not hmac.compare_digest(given.encode(), self._token.encode()):
            return "missing or wrong bearer token"
        return None


def is_admin_path(path: str) -> bool:
    return path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/")


class AdminAuthMiddleware:
    """ASGI middleware: a 401 for an admin request without the token, before anything reads its body.
    It checks every path under /admin, routed or not: without the token an unknown one is a 401 too."""

    def __init__(self, app: ASGIApp, auth: AdminAuth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_admin_path(scope.get("path", "")):
            reason = self.auth.denial(_authorization(scope))
            if reason:
                response = JSONResponse(status_code=401, content={"detail": reason}, headers=CHALLENGE)
                await response(scope, receive, send)
                return
            scope.setdefault("state", {})[_CHECKED] = True  # what request.state reads
        await self.app(scope, receive, send)


def _authorization(scope: Scope) -> str | None:
    for key, value in scope.get("headers", []):
        if key == b"authorization":
            return bytes(value).decode("latin-1")
    return None


def require_admin(
    request: Request, _declared: Annotated[HTTPAuthorizationCredentials | None, Depends(ADMIN_BEARER)]
) -> None:
    """Dependency of every admin route (see the module docstring)."""
    if getattr(request.state, _CHECKED, False):
        return
    auth: AdminAuth = request.app.state.admin_auth  # set by serving.app.create_app
    reason = auth.denial(request.headers.get("authorization"))
    if reason:
        raise HTTPException(401, reason, headers=CHALLENGE)
