"""The HTTP API of the serving process (docs/CONTRACTS.md section 5, ARCHITECTURE "Serving admin API").

Public: `POST /v1/completions` and `POST /v1/chat/completions` (OpenAI-compatible, streaming;
`serving/openai_api.py`), `GET /v1/models`, `/healthz` (liveness), `/readyz` (model loaded, manifest
re-applied, model thread running), `/metrics` (`serving/routes_health.py`).

Admin (bearer token; `serving/routes_admin.py`): `GET /admin/kernels`, `POST /admin/swap`,
`POST /admin/rollback`, `POST /admin/profile`, `POST /admin/logits`, `POST /admin/benchmark`,
`POST /admin/compare`. Without the token (or with a wrong one) they answer 401, before the body is even
read; with no token configured they
are disabled (401 too, saying so) (`serving/auth.py`).
`/admin/swap` swaps only bytes the verifier accepted: it checks the request's `attestation` against
the SHA-256 of the bytes it would import and answers 403 otherwise (`--allow-unverified-swaps`
turns that into a logged warning).
Malformed bodies get 422 with `detail` (FastAPI's list) and `message` (one readable line).

Differences from OpenAI worth knowing: `temperature` defaults to 0 (greedy); `echo` is not
supported; each completions choice carries the generated `token_ids` (see `serving/openai_api.py`).

This module assembles the app: the state, the model loading in the background, the error handlers, the
admin authentication and the routes of `routes_health`, `openai_api` and `routes_admin`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuyantra import attestation
from serving import openai_api, routes_admin, routes_health
from serving.auth import AdminAuth, AdminAuthMiddleware
from serving.engine import Engine
from serving.limits import BodyLimitMiddleware, ClientLimitMiddleware
from serving.metrics import Metrics
from serving.models import describe, load_model
from serving.state import RETRY_AFTER_S, ServeConfig, ServerState

__all__ = ["RETRY_AFTER_S", "ServeConfig", "ServerState", "create_app"]

log = logging.getLogger("gpuyantra.serving")


def create_app(config: ServeConfig | None = None) -> FastAPI:
    config = config or ServeConfig()
    if config.admin_token is None:
        config.admin_token = os.environ.get("GPUYANTRA_ADMIN_TOKEN") or None
    # The key is loaded (or created) now: a key problem stops the server at startup, not at the first swap.
    state = ServerState(
        config=config, metrics=Metrics(), attestation_key=attestation.load_key(config.resolved_state_dir())
    )
    if config.allow_unverified_swaps:
        log.warning(
            "UNVERIFIED SWAPS ALLOWED (--allow-unverified-swaps): /admin/swap will swap kernels the "
            "verifier did not attest; use only for development"
        )
    app = FastAPI(title="gpuyantra serving", version="0.1.0", lifespan=_lifespan)
    app.state.server = state
    auth = AdminAuth(config.admin_token)
    app.state.admin_auth = auth  # what serving.auth.require_admin falls back on
    app.exception_handler(RequestValidationError)(_validation_error)
    app.exception_handler(StarletteHTTPException)(_http_error)
    # Added first, so it runs inside the admin check: an unauthenticated admin body is never read at all.
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    app.add_middleware(AdminAuthMiddleware, auth=auth)
    # Outermost: a client over its limit is refused before its body is read.
    app.add_middleware(ClientLimitMiddleware, max_requests=config.max_client_requests)
    # Added to the app itself, not included as routers: FastAPI (0.165) keeps an included router as one
    # lazy entry of `app.routes`, and the routes' paths are what tools and tests read there.
    for routes in (routes_health, openai_api, routes_admin):  # the order of the schema's paths
        routes.add_routes(app)
    return app


# ====================================================================== the model, loaded in the background
@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Load the model on a thread (the server answers /healthz and 503s meanwhile); stop the engine at exit."""
    state: ServerState = app.state.server
    loader = threading.Thread(target=_build, args=(state,), name="gpuyantra-loader", daemon=True)
    loader.start()
    app.state.loader = loader
    try:
        yield
    finally:
        if state.engine is not None:
            state.engine.stop()


def _build(state: ServerState) -> None:
    """Load the model, start the engine (re-applying the kept swaps); a failure is kept for the probes."""
    config = state.config
    try:
        loaded = load_model(
            config.model,
            random_weights=config.random_weights,
            device=config.device,
            dtype=config.dtype,
            seed=config.seed,
            byte_tokenizer=config.byte_tokenizer,
        )
        state.description = describe(loaded)
        engine = Engine(
            loaded,
            state_dir=config.resolved_state_dir(),
            max_batch=config.max_batch,
            max_seq_len=config.max_seq_len,
            cuda_graphs=config.cuda_graphs,
            decode_attention=config.decode_attention,
            fuse_projections=config.fuse_projections,
            fuse_norms=config.fuse_norms,
            graph_buckets=config.graph_buckets,
            run_ahead=config.run_ahead,
            prefill_graphs=config.prefill_graphs,
            mixed_prompt_tokens=config.mixed_prompt_tokens,
            observer=state.metrics,
            max_parity_shapes=config.max_parity_shapes,
        )
        state.metrics.bind_active_swaps(engine.swaps.active_ids)
        state.reapplied = engine.start(reapply=True)
        state.engine = engine
        for entry in state.reapplied:  # one line per kept swap the manifest brought back (or could not)
            log.info(
                "re-apply %s: %s%s",
                entry.get("swap_id"),
                entry.get("status"),
                f" ({entry['reason']})" if entry.get("reason") else "",
            )
        log.info(
            "gpuyantra serve: %s ready on %s (%s), re-applied %s",
            loaded.name,
            loaded.device,
            state.description.get("dtype"),
            state.reapplied,
        )
    except Exception as exc:  # noqa: BLE001 - reported by /healthz and /readyz, or stops `serve`
        state.error = load_failure_line(exc)
        if config.on_load_failure is None:
            log.exception("loading the model failed")
        else:  # the process stops with the cause in one line; the traceback only at debug level
            log.debug("loading the model failed", exc_info=True)
    finally:
        state.loading = False
    if state.error is not None and config.on_load_failure is not None:
        config.on_load_failure(state.error)


def load_failure_line(exc: BaseException) -> str:
    """The cause of a failed load in one line: the exception's type and the first line of its message."""
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__


# ====================================================================== error bodies
async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    errors = exc.errors()
    clean = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in errors]
    return JSONResponse(status_code=422, content={"detail": clean, "message": _error_message(errors)})


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    # A body FastAPI cannot even decode (bytes that are not UTF-8 JSON) is a malformed body too: 422 with
    # the validation shape every route declares, not FastAPI's undeclared 400.
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        issue = {"loc": ["body"], "msg": "the body is not valid JSON", "type": "json_invalid"}
        return JSONResponse(status_code=422, content={"detail": [issue], "message": "body: the body is not valid JSON"})
    return await http_exception_handler(request, exc)


def _error_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """FastAPI's validation issues as one line: 'field: problem; ...'."""
    parts = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        msg = str(e.get("msg", "invalid"))
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts) or "invalid request body"
