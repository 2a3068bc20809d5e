"""HTTP client for the serving process's admin API, with errors a user can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Required, TypedDict, cast

import httpx

from gpuyantra import config

if TYPE_CHECKING:  # gpuyantra.swap's package imports torch: activities (and so workflows) import this module
    from gpuyantra.swap.records import SwapRecord

# A JSON object sent to an admin route or answered by one. Each answer has one typed owner that reads
# it: SwapRecord here, ServerProfile, SwapAnswer, RollbackAnswer in gpuyantra/campaign/records.py,
# Measurement and PairedAnswer in gpuyantra/served_speed.py.
JsonObject = dict[str, Any]


class ServerError(RuntimeError):
    """The serving process could not do what was asked. `kind` names why."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # ServerUnreachable | Unauthorized | BadRequest | Conflict | ServerFailure


class AdminClient:
    def __init__(self, server_url: str, token: str | None = None, timeout_s: float = 600.0) -> None:
        self.server_url = server_url.rstrip("/")
        self.token = token if token is not None else config.admin_token()
        self.timeout_s = timeout_s

    def get(self, path: str) -> JsonObject:
        return self._request("GET", path, None)

    def post(self, path: str, body: JsonObject | None = None) -> JsonObject:
        return self._request("POST", path, body or {})

    def _request(self, method: str, path: str, body: JsonObject | None) -> JsonObject:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        url = f"{self.server_url}{path}"
        try:
            response = httpx.request(method, url, json=body, headers=headers, timeout=self.timeout_s)
        except httpx.TransportError as exc:
            raise ServerError("ServerUnreachable", f"server not reachable at {self.server_url}: {exc}") from exc
        if response.status_code == 401:
            raise ServerError(
                "Unauthorized",
                f"{url} rejected the admin token (401): set GPUYANTRA_ADMIN_TOKEN "
                "to the token the server was started with",
            )
        if response.status_code == 409:
            raise ServerError("Conflict", f"{url}: {_detail(response)}")
        if 400 <= response.status_code < 500:
            raise ServerError("BadRequest", f"{url} answered {response.status_code}: {_detail(response)}")
        if response.status_code >= 500:
            raise ServerError("ServerFailure", f"{url} answered {response.status_code}: {_detail(response)}")
        return response.json()


def check_reachable(server_url: str, timeout_s: float = 5.0) -> None:
    """Raise ServerError unless GET /healthz answers 200."""
    try:
        response = httpx.get(f"{server_url.rstrip('/')}/healthz", timeout=timeout_s)
    except httpx.TransportError as exc:
        raise ServerError("ServerUnreachable", f"server not reachable at {server_url}: {exc}") from exc
    if response.status_code != 200:
        raise ServerError("ServerFailure", f"{server_url}/healthz answered {response.status_code}")


def served_model(server_url: str, timeout_s: float = 5.0) -> str | None:
    """The model id the server answers on GET /v1/models, or None when it does not say."""
    try:
        response = httpx.get(f"{server_url.rstrip('/')}/v1/models", timeout=timeout_s)
        return str(response.json()["data"][0]["id"]) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, LookupError, TypeError):
        return None


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return detail if isinstance(detail, str) else str(detail)[:1000]


# ------------------------------------------------------------------------------- kernels and health

LIST_TIMEOUT_S = 5.0  # listing answers at once; a rollback may wait behind a benchmark on the engine thread
ROLLBACK_TIMEOUT_S = 120.0


def active_kernels(client: AdminClient) -> list[SwapRecord]:
    """The swaps bound in the live model now (GET /admin/kernels `active`: the server's own records)."""
    return swap_records(client.get("/admin/kernels").get("active"))


def rollback(client: AdminClient, target: str) -> list[SwapRecord]:
    """Roll back the active swap with id `target`, or every active swap of op `target`; the records
    rolled back. BadRequest naming what is active when nothing matches."""
    active = active_kernels(client)
    ids = [k.swap_id for k in active if target in (k.swap_id, k.op)]
    if not ids:
        now = ", ".join(f"{k.op} ({k.swap_id})" for k in active) or "none"
        raise ServerError("BadRequest", f"no active kernel is op or swap id {target!r}; active: {now}")
    done: list[SwapRecord] = []
    for swap_id in ids:
        done += swap_records(client.post("/admin/rollback", {"swap_id": swap_id}).get("rolled_back"))
    return done


def swap_records(answer: Any) -> list[SwapRecord]:
    """The swap records of an /admin/kernels or /admin/rollback list (none when it is not a list)."""
    from gpuyantra.swap.records import SwapRecord  # the server's own record of a swap

    return [SwapRecord.from_dict(record) for record in answer or [] if isinstance(record, dict)]


class Readiness(TypedDict, total=False):
    """GET /readyz's answer: `ready` (200) with the served model, or `loading`/`error` (503) with
    `error` (serving/routes_health.py declares both: Readiness, ProbeFailure; one key list, checked
    by tests/campaign/test_records.py)."""

    status: Required[str]  # ready, loading or error
    error: str | None  # why loading failed or the model thread stopped
    model: str
    device: str
    active_swaps: list[str]  # swap ids bound now
    reapplied: list[dict[str, Any]]  # the kept swaps re-applied at startup
    cuda_graphs: bool
    decode_attention: str  # triton or sdpa
    fused_projection_groups: int
    fused_residual_norms: int
    mixed_prompt_tokens: int


def readiness(server_url: str, timeout_s: float = LIST_TIMEOUT_S) -> Readiness:
    """GET /readyz's answer (ready or still loading, both as JSON); ServerError when it does not answer."""
    try:
        response = httpx.get(f"{server_url.rstrip('/')}/readyz", timeout=timeout_s)
        return cast(Readiness, dict(response.json()))  # its readers .get() every key but status
    except httpx.TransportError as exc:
        raise ServerError("ServerUnreachable", f"server not reachable at {server_url}: {exc}") from exc
    except ValueError as exc:
        raise ServerError("ServerFailure", f"{server_url}/readyz answered no JSON: {exc}") from exc
