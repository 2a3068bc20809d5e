"""The HTTP API of the serving process (docs/CONTRACTS.md section 5, ARCHITECTURE "Serving admin API").

Public: `POST /v1/completions` and `POST /v1/chat/completions` (OpenAI-compatible, streaming;
`serving/openai_api.py`), `GET /v1/models`, `/healthz`
(liveness), `/readyz` (model loaded, manifest re-applied, model thread running), `/metrics`.

Admin (bearer token): `GET /admin/kernels`, `POST /admin/swap`, `POST /admin/rollback`,
`POST /admin/profile`, `POST /admin/benchmark`. Without the token (or with a wrong one) they answer
401, before the body is even read; with no token configured they are disabled (401 too, saying so).
`/admin/swap` swaps only bytes the verifier accepted: it checks the request's `attestation` against
the SHA-256 of the bytes it would import and answers 403 otherwise (`--allow-unverified-swaps`
turns that into a logged warning).
Malformed bodies get 422 with `detail` (FastAPI's list) and `message` (one readable line).

Differences from OpenAI worth knowing: `temperature` defaults to 0 (greedy); `echo` is not
supported; each completions choice carries the generated `token_ids` (see `serving/openai_api.py`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpuyantra import attestation
from gpuyantra.swap import SwapError
from serving.engine import Engine, RequestError
from serving.metrics import Metrics
from serving.models import describe, load_model
from serving.openai_api import (
    ERROR_RESPONSES,
    ChatCompletionRequest,
    CompletionRequest,
    ValidationIssue,
    create_chat_completion,
    create_completion,
)

log = logging.getLogger("gpuyantra.serving")
RETRY_AFTER_S = "5"  # Retry-After (seconds) of a 503 while the model loads


@dataclass
class ServeConfig:
    model: str = "tiny-qwen2"
    random_weights: bool = False
    byte_tokenizer: bool = False  # serve a folder with ByteTokenizer instead of its own tokenizer
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    state_dir: str | None = None
    admin_token: str | None = None
    cuda_graphs: bool = False
    decode_attention: str = "auto"
    fuse_projections: str = "auto"
    max_batch: int = 8
    max_seq_len: int | None = None
    max_parity_shapes: int = 4
    graph_buckets: list[int] | None = None
    allow_unverified_swaps: bool = False  # swap without a valid attestation, with a warning each time

    def resolved_state_dir(self) -> Path:
        if self.state_dir:
            path = Path(self.state_dir).expanduser().resolve()
            path.mkdir(parents=True, exist_ok=True)
            return path
        from gpuyantra.config import state_dir

        return state_dir()


@dataclass
class ServerState:
    config: ServeConfig
    metrics: Metrics
    engine: Engine | None = None
    error: str | None = None
    loading: bool = True
    started_at: float = field(default_factory=time.time)
    reapplied: list[dict[str, Any]] = field(default_factory=list)
    description: dict[str, Any] = field(default_factory=dict)


# ====================================================================== request bodies
class Attestation(BaseModel):
    """The verifier's signed record of an accepted candidate: the verdict's `attestation`, as is."""

    model_config = ConfigDict(extra="forbid", strict=True)  # strict: JSON true or "5" is no integer

    digest: str = Field(
        ..., pattern="^[0-9a-f]{64}$", description="SHA-256 (hex) of the candidate file's bytes the verifier read"
    )
    op: str = Field(..., description="the candidate's OP, as the verifier read it")
    reward: int = Field(..., description="the verdict's reward; only +1 and above are swapped")
    device: str = Field(..., description="where it was verified (cpu or cuda); must be the server's device")
    signature: str = Field(
        ...,
        pattern="^[0-9a-f]{64}$",
        description="HMAC-SHA256 (hex), under the key shared by workers and server, of "
        "the canonical JSON of {digest, op, reward, device}",
    )


class SwapBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    source: str | None = Field(None, description="the candidate file's text")
    path: str | None = Field(None, description="absolute path of a candidate .py file")
    module_class: str | None = Field(None, description="restrict the swap to this class (name or dotted)")
    shapes: list[list[int]] | None = Field(
        None, description="input shapes to check parity on, instead of the shapes seen in live traffic"
    )
    attestation: Attestation | None = Field(
        None,
        description="the verdict's attestation of exactly these bytes; required unless the server runs "
        "with --allow-unverified-swaps",
    )

    @model_validator(mode="after")
    def _one_source(self):
        if (self.source is None) == (self.path is None):
            raise ValueError(
                "give exactly one of 'source' (the candidate file's text) or 'path' "
                "(an absolute path to a candidate .py file)"
            )
        if self.source is not None and not self.source.strip():
            raise ValueError("'source' is empty")
        if self.path is not None and not os.path.isabs(self.path):
            raise ValueError(f"'path' must be absolute, got {self.path!r}")
        if self.shapes is not None:
            if not self.shapes or len(self.shapes) > 16:
                raise ValueError("'shapes' takes 1 to 16 shapes")
            for s in self.shapes:
                if len(s) < 2 or any(d < 1 for d in s):
                    raise ValueError(f"each shape needs at least 2 positive dims (rows..., hidden), got {s}")
        return self


class SwapRefusalDetail(BaseModel):
    status: str = Field(..., description="forbidden, invalid_candidate, rejected or rolled_back")
    reason: str = Field(..., description="one line saying why nothing was swapped")
    swap_id: str | None = None
    parity: dict[str, Any] | None = None


class SwapRefusal(BaseModel):
    """Body of a swap the swap engine refused (403, 409; a candidate that does not load: 422)."""

    detail: SwapRefusalDetail


class RequestErrorBody(BaseModel):
    """422 of the admin routes: a body that failed validation (`detail`: FastAPI's list of issues) or a
    request that cannot be served as asked (`detail`: one line); `message`: one readable line."""

    detail: list[ValidationIssue] | str
    message: str


class SwapUnprocessable(BaseModel):
    """422 of /admin/swap: a body that failed validation (`detail`: the list, with `message`), or a candidate
    that does not load (`detail`: the swap engine's refusal, as in 403 and 409)."""

    detail: list[ValidationIssue] | SwapRefusalDetail
    message: str | None = None


UNPROCESSABLE: dict[int | str, dict[str, Any]] = {
    422: {"model": RequestErrorBody, "description": "invalid body, or a request that cannot be served"}
}


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    swap_id: str | None = Field(None, min_length=1)
    all: bool | None = None

    @model_validator(mode="after")
    def _one_target(self):
        if (self.swap_id is None) == (not self.all):
            raise ValueError("give either 'swap_id' or 'all': true (not both)")
        return self


class ProfileBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LogitsBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str | list[StrictInt] = Field(..., min_length=1)


class BenchmarkBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    max_tokens: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="tokens generated per generation; prompt_tokens + max_tokens must fit the context",
    )
    prompt_tokens: int = Field(default=8, ge=1, le=32768, description="prompt length of each generation")
    batch: int = Field(default=1, ge=1, le=1024, description="rows decoded together, at most the server's max_batch")
    repeats: int = Field(
        default=5,
        ge=1,
        le=20,
        description="timed repeats; the answer gives their median "
        "tokens/s and spread (tokens_per_s_min/_max, relative_spread = (max - min) / median, "
        "relative_mad)",
    )
    min_repeat_s: float = Field(
        default=0.25,
        ge=0.0,
        le=5.0,
        description="each repeat generates again until it "
        "has run this many seconds, so a repeat is not mostly timer and launch noise; the "
        "server serves nothing else for about repeats x min_repeat_s",
    )


# ====================================================================== helpers
def _error_message(errors: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        msg = str(e.get("msg", "invalid"))
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts) or "invalid request body"


# ====================================================================== the app
def create_app(config: ServeConfig | None = None) -> FastAPI:
    config = config or ServeConfig()
    if config.admin_token is None:
        config.admin_token = os.environ.get("GPUYANTRA_ADMIN_TOKEN") or None
    metrics = Metrics()
    state = ServerState(config=config, metrics=metrics)
    # Loaded (or created) now: a key problem stops the server at startup, not at the first swap.
    attestation_key = attestation.load_key(config.resolved_state_dir())
    if config.allow_unverified_swaps:
        log.warning(
            "UNVERIFIED SWAPS ALLOWED (--allow-unverified-swaps): /admin/swap will swap kernels the "
            "verifier did not attest; use only for development"
        )

    def build() -> None:
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
                graph_buckets=config.graph_buckets,
                observer=metrics,
                max_parity_shapes=config.max_parity_shapes,
            )
            metrics.bind_active_swaps(engine.swaps.active_ids)
            state.reapplied = engine.start(reapply=True)
            state.engine = engine
            log.info(
                "gpuyantra serve: %s ready on %s (%s), re-applied %s",
                loaded.name,
                loaded.device,
                state.description.get("dtype"),
                state.reapplied,
            )
        except Exception as exc:  # noqa: BLE001 - reported by /healthz and /readyz
            log.exception("loading the model failed")
            state.error = f"{type(exc).__name__}: {exc}"
        finally:
            state.loading = False

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loader = threading.Thread(target=build, name="gpuyantra-loader", daemon=True)
        loader.start()
        app.state.loader = loader
        try:
            yield
        finally:
            if state.engine is not None:
                state.engine.stop()

    app = FastAPI(title="gpuyantra serving", version="0.1.0", lifespan=lifespan)
    app.state.server = state

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        clean = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in errors]
        return JSONResponse(status_code=422, content={"detail": clean, "message": _error_message(errors)})

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # A body FastAPI cannot even decode (bytes that are not UTF-8 JSON) is a malformed body too: 422 with
        # the validation shape every route declares, not FastAPI's undeclared 400.
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            issue = {"loc": ["body"], "msg": "the body is not valid JSON", "type": "json_invalid"}
            return JSONResponse(
                status_code=422, content={"detail": [issue], "message": "body: the body is not valid JSON"}
            )
        return await http_exception_handler(request, exc)

    def engine_or_503() -> Engine:
        if state.engine is None:
            if state.error:
                raise HTTPException(503, state.error)
            raise HTTPException(503, "the model is still loading", headers={"Retry-After": RETRY_AFTER_S})
        return state.engine

    def admin_denial(authorization: str | None) -> str | None:
        """Why a request to /admin is refused (None: allowed)."""
        token = config.admin_token
        if not token:
            return "the admin API is disabled: start the server with --admin-token or GPUYANTRA_ADMIN_TOKEN"
        given = ""
        if authorization and authorization[:7].lower() == "bearer ":
            given = authorization[7:].strip()
        if not given or not hmac.compare_digest(given.encode(), token.encode()):
            return "missing or wrong bearer token"
        return None

    def require_admin(authorization: str | None = Header(default=None)) -> None:
        reason = admin_denial(authorization)
        if reason:
            raise HTTPException(401, reason, headers={"WWW-Authenticate": "Bearer"})

    class AdminAuth:
        """Checks the bearer token of /admin requests before the body is read or parsed."""

        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            path = scope.get("path", "")
            if scope["type"] == "http" and (path == "/admin" or path.startswith("/admin/")):
                auth = None
                for key, value in scope.get("headers", []):
                    if key == b"authorization":
                        auth = value.decode("latin-1")
                        break
                reason = admin_denial(auth)
                if reason:
                    response = JSONResponse(
                        status_code=401, content={"detail": reason}, headers={"WWW-Authenticate": "Bearer"}
                    )
                    await response(scope, receive, send)
                    return
            await self.app(scope, receive, send)

    app.add_middleware(AdminAuth)

    # ------------------------------------------------------------------ probes
    @app.get("/healthz")
    async def healthz():
        if state.error or (state.engine is not None and not state.engine.alive):
            return JSONResponse(
                status_code=503, content={"status": "error", "error": state.error or "the model thread stopped"}
            )
        return {"status": "ok", "loading": state.loading}

    @app.get("/readyz")
    async def readyz():
        engine = state.engine
        if engine is None or not engine.ready or not engine.alive:
            status = "error" if state.error else "loading"
            return JSONResponse(
                status_code=503,
                content={"status": status, "error": state.error},
                headers={"Retry-After": RETRY_AFTER_S} if status == "loading" else None,
            )
        return {
            "status": "ready",
            "model": engine.model_name,
            "device": str(engine.device),
            "active_swaps": engine.swaps.active_ids(),
            "reapplied": state.reapplied,
            "cuda_graphs": engine.graphs is not None,
            "decode_attention": "triton" if engine.decode_attention is not None else "sdpa",
            "fused_projection_groups": engine.fused_projections,
        }

    @app.get("/metrics")
    async def metrics_route():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        engine = engine_or_503()
        return {
            "object": "list",
            "data": [
                {
                    "id": engine.model_name,
                    "object": "model",
                    "created": int(state.started_at),
                    "owned_by": "gpuyantra",
                    "max_model_len": engine.usable_len,
                    **{k: v for k, v in state.description.items() if k != "name"},
                }
            ],
        }

    # ------------------------------------------------------------------ completions
    @app.post("/v1/completions", responses=ERROR_RESPONSES)
    async def completions(body: CompletionRequest):
        return await create_completion(engine_or_503(), body)

    @app.post("/v1/chat/completions", responses=ERROR_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest):
        return await create_chat_completion(engine_or_503(), body)

    # ------------------------------------------------------------------ admin
    @app.get("/admin/kernels", dependencies=[Depends(require_admin)])
    async def kernels():
        engine = engine_or_503()
        active = engine.swaps.active()
        history = engine.swaps.history()
        return {
            "model": engine.model_name,
            "active": active,
            "history": history,
            "fallbacks": sum(r.get("fallbacks", 0) for r in history),
            "graphs": engine.graphs.info() if engine.graphs is not None else None,
            "state_dir": str(engine.swaps.state_dir),
            "manifest": str(engine.swaps.manifest_path),
        }

    def admission(body: SwapBody, device: str) -> Callable[[bytes], str | None]:
        """The swap engine's check of the bytes it is about to import (see SwapEngine.swap)."""

        def admit(source: bytes) -> str | None:
            reason: str | None
            if body.attestation is None:
                reason = "no attestation: start the server with --allow-unverified-swaps to swap unverified kernels"
            else:
                reason = attestation.check(source, body.attestation.model_dump(), device, attestation_key)
            if reason and config.allow_unverified_swaps:
                log.warning("UNVERIFIED SWAP (--allow-unverified-swaps): %s", reason)
                return None
            return reason

        return admit

    @app.post(
        "/admin/swap",
        dependencies=[Depends(require_admin)],
        responses={
            403: {"model": SwapRefusal, "description": "no valid attestation of these bytes: nothing swapped"},
            422: {"model": SwapUnprocessable, "description": "invalid body, or a candidate that does not load"},
            409: {"model": SwapRefusal, "description": "parity failed or no module fits: nothing swapped"},
        },
    )
    async def swap(body: SwapBody):
        engine = engine_or_503()
        admit = admission(body, engine.device.type)
        fut = engine.call(
            lambda: engine.swaps.swap(
                body.path, source=body.source, module_class=body.module_class, live_shapes=body.shapes, admit=admit
            ),
            name="swap",
        )
        try:
            record = await asyncio.wrap_future(fut)
        except SwapError as exc:
            if exc.http_status == 403:
                metrics.swaps.labels(result="forbidden").inc()
            elif exc.http_status == 422:
                metrics.swaps.labels(result="invalid").inc()
            elif exc.status == "rejected":
                metrics.swaps.labels(result="rejected").inc()
            return JSONResponse(status_code=exc.http_status, content={"detail": exc.detail()})
        return {
            "swap_id": record.swap_id,
            "op": record.op,
            "module_class": record.module_class,
            "qualified_class": record.qualified_class,
            "modules": record.modules,
            "parity": record.parity,
            "status": record.status,
            "file": record.file,
            "digest": record.digest,
        }

    @app.post("/admin/rollback", dependencies=[Depends(require_admin)])
    async def rollback(body: RollbackBody):
        engine = engine_or_503()
        fut = engine.call(lambda: engine.swaps.rollback(body.swap_id, all=bool(body.all)), name="rollback")
        try:
            records = await asyncio.wrap_future(fut)
        except SwapError as exc:
            return JSONResponse(status_code=exc.http_status, content={"detail": exc.detail()})
        return {"rolled_back": [r.to_dict() for r in records], "active": engine.swaps.active()}

    @app.post("/admin/profile", dependencies=[Depends(require_admin)])
    async def profile(body: ProfileBody | None = None):
        engine = engine_or_503()
        return await asyncio.wrap_future(engine.call(engine.profile, exclusive=True, name="profile"))

    @app.post("/admin/logits", dependencies=[Depends(require_admin)], responses=UNPROCESSABLE)
    async def logits(body: LogitsBody):
        """Last-position logits of the live model for a prompt: parity checks from outside."""
        engine = engine_or_503()
        ids = engine.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        if not ids or any(not 0 <= i < engine.vocab_size for i in ids):
            message = f"prompt must encode to token ids in [0, {engine.vocab_size})"
            return JSONResponse(status_code=422, content={"detail": message, "message": message})
        values = await asyncio.wrap_future(engine.call(lambda: engine.last_logits(ids), exclusive=True, name="logits"))
        return {"model": engine.model_name, "tokens": len(ids), "logits": values}

    @app.post("/admin/benchmark", dependencies=[Depends(require_admin)], responses=UNPROCESSABLE)
    async def benchmark(body: BenchmarkBody | None = None):
        """Served decode speed of the live model, measured with traffic paused (`"measured": "benchmark"`):
        median tokens/s of the repeats with their spread."""
        engine = engine_or_503()
        body = body or BenchmarkBody()
        fut = engine.call(
            lambda: engine.benchmark(body.max_tokens, body.prompt_tokens, body.batch, body.repeats, body.min_repeat_s),
            exclusive=True,
            name="benchmark",
        )
        try:
            return await asyncio.wrap_future(fut)
        except RequestError as exc:
            return JSONResponse(status_code=422, content={"detail": str(exc), "message": str(exc)})

    return app
