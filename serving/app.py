"""The HTTP API of the serving process (CONTRACTS section 4, ARCHITECTURE "Serving admin API").

Public: `POST /v1/completions` (OpenAI-compatible, streaming), `GET /v1/models`, `/healthz`
(liveness), `/readyz` (model loaded, manifest re-applied, model thread running), `/metrics`.

Admin (bearer token): `GET /admin/kernels`, `POST /admin/swap`, `POST /admin/rollback`,
`POST /admin/profile`, `POST /admin/benchmark`. Without the token (or with a wrong one) they answer
401, before the body is even read; with no token configured they are disabled (401 too, saying so).
`/admin/swap` swaps only bytes the verifier accepted: it checks the request's `attestation` against
the SHA-256 of the bytes it would import and answers 403 otherwise (`--allow-unverified-swaps`
turns that into a logged warning).
Malformed bodies get 422 with `detail` (FastAPI's list) and `message` (one readable line).

Differences from OpenAI worth knowing: `temperature` defaults to 0 (greedy); `n` must be 1;
`echo`/`logprobs` are not supported; each choice carries the generated `token_ids`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuyantra import attestation
from gpuyantra.swap import SwapError
from serving.engine import Engine, GenRequest, RequestError
from serving.metrics import Metrics
from serving.models import describe, load_model

log = logging.getLogger("gpuyantra.serving")


@dataclass
class ServeConfig:
    model: str = "tiny-qwen2"
    random_weights: bool = False
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
class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=1, le=1_000_000)
    temperature: float = Field(0.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    echo: bool = False
    logprobs: int | None = None
    stream_options: dict[str, Any] | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be an empty list")
        if isinstance(v, list) and any(isinstance(p, list) and not p for p in v):
            raise ValueError("token-id prompts must not be empty")
        return v

    @field_validator("n")
    @classmethod
    def _only_one(cls, v):
        if v != 1:
            raise ValueError("only n = 1 is supported")
        return v

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v):
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v):
        if v:
            raise ValueError("logprobs are not supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if isinstance(v, str):
            v = [v]
        if v is not None and (len(v) > 4 or any(not s for s in v)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return v


class Attestation(BaseModel):
    """The verifier's signed record of an accepted candidate: the verdict's `attestation`, as is."""

    model_config = ConfigDict(extra="forbid")

    digest: str = Field(..., pattern="^[0-9a-f]{64}$",
                        description="SHA-256 (hex) of the candidate file's bytes the verifier read")
    op: str = Field(..., description="the candidate's OP, as the verifier read it")
    reward: int = Field(..., description="the verdict's reward; only +1 and above are swapped")
    device: str = Field(..., description="where it was verified (cpu or cuda); must be the server's device")
    signature: str = Field(..., pattern="^[0-9a-f]{64}$",
                           description="HMAC-SHA256 (hex), under the key shared by workers and server, of "
                                       "the canonical JSON of {digest, op, reward, device}")


class SwapBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str | None = Field(None, description="the candidate file's text")
    path: str | None = Field(None, description="absolute path of a candidate .py file")
    module_class: str | None = Field(None, description="restrict the swap to this class (name or dotted)")
    shapes: list[list[int]] | None = Field(
        None, description="input shapes to check parity on, instead of the shapes seen in live traffic")
    attestation: Attestation | None = Field(
        None, description="the verdict's attestation of exactly these bytes; required unless the server runs "
                          "with --allow-unverified-swaps")

    @model_validator(mode="after")
    def _one_source(self):
        if (self.source is None) == (self.path is None):
            raise ValueError("give exactly one of 'source' (the candidate file's text) or 'path' "
                             "(an absolute path to a candidate .py file)")
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


class RollbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

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
    model_config = ConfigDict(extra="forbid")

    prompt: str | list[int] = Field(..., min_length=1)


class BenchmarkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(16, ge=1, le=4096)
    prompt_tokens: int = Field(8, ge=1, le=32768)
    batch: int = Field(1, ge=1, le=1024)
    repeats: int = Field(1, ge=1, le=20)


# ====================================================================== helpers
def _error_message(errors: list[dict[str, Any]]) -> str:
    parts = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        msg = str(e.get("msg", "invalid"))
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts) or "invalid request body"


def _openai_error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status},
                                                     "detail": message})


class IncrementalText:
    """Text deltas of a growing token list; holds back a trailing incomplete UTF-8 sequence."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids).rstrip("\ufffd")
        if text.startswith(self.emitted) and len(text) > len(self.emitted):
            delta = text[len(self.emitted):]
            self.emitted = text
            return delta
        return ""

    def flush(self, final_text: str) -> str:
        if final_text.startswith(self.emitted):
            delta = final_text[len(self.emitted):]
            self.emitted = final_text
            return delta
        return ""


def _stop_overlap(text: str, stops: list[str] | None) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    best = 0
    for stop in stops or ():
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                best = max(best, k)
                break
    return best


def _truncate_at_stop(text: str, stops: list[str] | None) -> tuple[str, bool]:
    if not stops:
        return text, False
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


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
        log.warning("UNVERIFIED SWAPS ALLOWED (--allow-unverified-swaps): /admin/swap will swap kernels the "
                    "verifier did not attest; use only for development")

    def build() -> None:
        try:
            loaded = load_model(config.model, random_weights=config.random_weights, device=config.device,
                                dtype=config.dtype, seed=config.seed)
            state.description = describe(loaded)
            engine = Engine(loaded, state_dir=config.resolved_state_dir(), max_batch=config.max_batch,
                            max_seq_len=config.max_seq_len, cuda_graphs=config.cuda_graphs,
                            decode_attention=config.decode_attention, fuse_projections=config.fuse_projections,
                            graph_buckets=config.graph_buckets, observer=metrics,
                            max_parity_shapes=config.max_parity_shapes)
            metrics.bind_active_swaps(engine.swaps.active_ids)
            state.reapplied = engine.start(reapply=True)
            state.engine = engine
            log.info("gpuyantra serve: %s ready on %s (%s), re-applied %s", loaded.name, loaded.device,
                     state.description.get("dtype"), state.reapplied)
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

    def engine_or_503() -> Engine:
        if state.engine is None:
            raise HTTPException(503, state.error or "the model is still loading")
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
            if scope["type"] == "http" and (scope.get("path") == "/admin" or scope.get("path", "").startswith("/admin/")):
                auth = None
                for key, value in scope.get("headers", []):
                    if key == b"authorization":
                        auth = value.decode("latin-1")
                        break
                reason = admin_denial(auth)
                if reason:
                    response = JSONResponse(status_code=401, content={"detail": reason},
                                            headers={"WWW-Authenticate": "Bearer"})
                    await response(scope, receive, send)
                    return
            await self.app(scope, receive, send)

    app.add_middleware(AdminAuth)

    # ------------------------------------------------------------------ probes
    @app.get("/healthz")
    async def healthz():
        if state.error or (state.engine is not None and not state.engine.alive):
            return JSONResponse(status_code=503, content={"status": "error", "error": state.error or
                                                          "the model thread stopped"})
        return {"status": "ok", "loading": state.loading}

    @app.get("/readyz")
    async def readyz():
        engine = state.engine
        if engine is None or not engine.ready or not engine.alive:
            status = "error" if state.error else "loading"
            return JSONResponse(status_code=503, content={"status": status, "error": state.error})
        return {"status": "ready", "model": engine.model_name, "device": str(engine.device),
                "active_swaps": engine.swaps.active_ids(), "reapplied": state.reapplied,
                "cuda_graphs": engine.graphs is not None,
                "decode_attention": "triton" if engine.decode_attention is not None else "sdpa",
                "fused_projection_groups": engine.fused_projections}

    @app.get("/metrics")
    async def metrics_route():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        engine = engine_or_503()
        return {"object": "list", "data": [{
            "id": engine.model_name, "object": "model", "created": int(state.started_at), "owned_by": "gpuyantra",
            "max_model_len": engine.usable_len, **{k: v for k, v in state.description.items() if k != "name"},
        }]}

    # ------------------------------------------------------------------ completions
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        engine = engine_or_503()
        if body.model not in (None, "", engine.model_name):
            return _openai_error(404, f"model {body.model!r} is not served here (serving {engine.model_name!r})",
                                 "model_not_found")
        tok = engine.tokenizer
        prompts: list[list[int]]
        p = body.prompt
        if isinstance(p, str):
            prompts = [tok.encode(p)]
        elif all(isinstance(x, int) for x in p):
            prompts = [list(p)]  # type: ignore[arg-type]
        elif all(isinstance(x, str) for x in p):
            prompts = [tok.encode(x) for x in p]  # type: ignore[union-attr]
        else:
            prompts = [list(x) for x in p]  # type: ignore[arg-type]
        bos = getattr(tok, "bos_token_id", None)
        prompts = [ids if ids else ([bos] if bos is not None else []) for ids in prompts]
        stops: list[str] | None = body.stop  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        reqs: list[GenRequest] = []
        for index, ids in enumerate(prompts):
            def on_token(token: int, index=index):
                loop.call_soon_threadsafe(queue.put_nowait, (index, "token", token))

            def on_finish(req: GenRequest, index=index):
                loop.call_soon_threadsafe(queue.put_nowait, (index, "finish", req))

            req = GenRequest(prompt_ids=ids, max_tokens=body.max_tokens, temperature=body.temperature,
                             top_p=body.top_p, seed=body.seed, stop_token_ids=frozenset(tok.eos_token_ids),
                             on_token=on_token if (body.stream or stops) else None, on_finish=on_finish)
            try:
                engine.validate(req)
            except RequestError as exc:
                return _openai_error(400, str(exc))
            reqs.append(req)
        for req in reqs:
            engine.submit(req)
        created = int(time.time())
        cid = f"cmpl-{uuid.uuid4().hex[:24]}"

        def finish_reason(req: GenRequest, stopped: bool) -> str:
            if stopped:
                return "stop"
            return req.finish_reason if req.finish_reason in ("stop", "length") else "stop"

        if not body.stream:
            texts: dict[int, str] = {}
            stopped: dict[int, bool] = {}
            monitors = [IncrementalText(tok) for _ in reqs]
            remaining = len(reqs)
            try:
                while remaining:
                    index, kind, value = await queue.get()
                    if kind == "token":
                        if stops and not stopped.get(index):
                            monitors[index].push(value)
                            _, hit = _truncate_at_stop(monitors[index].emitted, stops)
                            if hit:
                                stopped[index] = True
                                reqs[index].cancel()
                        continue
                    remaining -= 1
            finally:
                for req in reqs:
                    if not req.done.is_set():
                        req.cancel()
            errors = [r.error for r in reqs if r.finish_reason == "error"]
            if errors:
                return _openai_error(500, f"generation failed: {errors[0]}", "server_error")
            choices = []
            for index, req in enumerate(reqs):
                text, hit = _truncate_at_stop(tok.decode(req.output_ids), stops)
                texts[index] = text
                choices.append({"index": index, "text": text, "logprobs": None,
                                "finish_reason": finish_reason(req, hit or stopped.get(index, False)),
                                "token_ids": list(req.output_ids)})
            prompt_tokens = sum(len(r.prompt_ids) for r in reqs)
            completion_tokens = sum(len(r.output_ids) for r in reqs)
            return {"id": cid, "object": "text_completion", "created": created, "model": engine.model_name,
                    "choices": choices, "usage": {"prompt_tokens": prompt_tokens,
                                                  "completion_tokens": completion_tokens,
                                                  "total_tokens": prompt_tokens + completion_tokens}}

        include_usage = bool((body.stream_options or {}).get("include_usage"))

        def chunk(index: int, text: str, reason: str | None, token_ids: list[int]) -> str:
            payload = {"id": cid, "object": "text_completion", "created": created, "model": engine.model_name,
                       "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": reason,
                                    "token_ids": token_ids}]}
            return f"data: {json.dumps(payload)}\n\n"

        async def events() -> AsyncIterator[str]:
            decoders = [IncrementalText(tok) for _ in reqs]
            sent = [""] * len(reqs)
            done: set[int] = set()
            stopped: set[int] = set()
            try:
                while len(done) < len(reqs):
                    index, kind, value = await queue.get()
                    if index in done:
                        continue
                    if kind == "token":
                        if index in stopped:
                            continue
                        decoders[index].push(value)
                        text, hit = _truncate_at_stop(decoders[index].emitted, stops)
                        if hit:
                            stopped.add(index)
                            reqs[index].cancel()
                            safe = len(text)
                        else:
                            safe = len(text) - _stop_overlap(text, stops)
                        delta = text[len(sent[index]):safe] if safe > len(sent[index]) else ""
                        if delta or not stops:
                            sent[index] += delta
                            yield chunk(index, delta, None, [value])
                        continue
                    req: GenRequest = value
                    done.add(index)
                    if req.finish_reason == "error":
                        err = {"error": {"message": f"generation failed: {req.error}", "type": "server_error"}}
                        yield f"data: {json.dumps(err)}\n\n"
                        continue
                    full, hit = _truncate_at_stop(tok.decode(req.output_ids), stops)
                    tail = full[len(sent[index]):] if full.startswith(sent[index]) else ""
                    sent[index] += tail
                    yield chunk(index, tail, finish_reason(req, hit or index in stopped), [])
                if include_usage:
                    pt = sum(len(r.prompt_ids) for r in reqs)
                    ct = sum(len(r.output_ids) for r in reqs)
                    usage = {"id": cid, "object": "text_completion", "created": created, "model": engine.model_name,
                             "choices": [], "usage": {"prompt_tokens": pt, "completion_tokens": ct,
                                                      "total_tokens": pt + ct}}
                    yield f"data: {json.dumps(usage)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                for req in reqs:
                    if not req.done.is_set():
                        req.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    # ------------------------------------------------------------------ admin
    @app.get("/admin/kernels", dependencies=[Depends(require_admin)])
    async def kernels():
        engine = engine_or_503()
        active = engine.swaps.active()
        history = engine.swaps.history()
        return {"model": engine.model_name, "active": active, "history": history,
                "fallbacks": sum(r.get("fallbacks", 0) for r in history),
                "graphs": engine.graphs.info() if engine.graphs is not None else None,
                "state_dir": str(engine.swaps.state_dir), "manifest": str(engine.swaps.manifest_path)}

    def admission(body: SwapBody, device: str) -> Callable[[bytes], str | None]:
        """The swap engine's check of the bytes it is about to import (see SwapEngine.swap)."""
        def admit(source: bytes) -> str | None:
            if body.attestation is None:
                reason = "no attestation: start the server with --allow-unverified-swaps to swap unverified kernels"
            else:
                reason = attestation.check(source, body.attestation.model_dump(), device, attestation_key)
            if reason and config.allow_unverified_swaps:
                log.warning("UNVERIFIED SWAP (--allow-unverified-swaps): %s", reason)
                return None
            return reason
        return admit

    @app.post("/admin/swap", dependencies=[Depends(require_admin)], responses={
        403: {"model": SwapRefusal, "description": "no valid attestation of these bytes: nothing swapped"},
        409: {"model": SwapRefusal, "description": "parity failed or no module fits: nothing swapped"}})
    async def swap(body: SwapBody):
        engine = engine_or_503()
        admit = admission(body, engine.device.type)
        fut = engine.call(lambda: engine.swaps.swap(body.path, source=body.source, module_class=body.module_class,
                                                    live_shapes=body.shapes, admit=admit), name="swap")
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
        return {"swap_id": record.swap_id, "op": record.op, "module_class": record.module_class,
                "qualified_class": record.qualified_class, "modules": record.modules, "parity": record.parity,
                "status": record.status, "file": record.file, "digest": record.digest}

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

    @app.post("/admin/logits", dependencies=[Depends(require_admin)])
    async def logits(body: LogitsBody):
        """Last-position logits of the live model for a prompt: parity checks from outside."""
        engine = engine_or_503()
        ids = engine.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        if not ids or any(not 0 <= i < engine.vocab_size for i in ids):
            return JSONResponse(status_code=422, content={"detail": "prompt must encode to token ids in "
                                                                    f"[0, {engine.vocab_size})"})
        values = await asyncio.wrap_future(engine.call(lambda: engine.last_logits(ids), exclusive=True,
                                                       name="logits"))
        return {"model": engine.model_name, "tokens": len(ids), "logits": values}

    @app.post("/admin/benchmark", dependencies=[Depends(require_admin)])
    async def benchmark(body: BenchmarkBody | None = None):
        engine = engine_or_503()
        body = body or BenchmarkBody()
        fut = engine.call(lambda: engine.benchmark(body.max_tokens, body.prompt_tokens, body.batch, body.repeats),
                          exclusive=True, name="benchmark")
        try:
            return await asyncio.wrap_future(fut)
        except RequestError as exc:
            return JSONResponse(status_code=422, content={"detail": str(exc), "message": str(exc)})

    return app
