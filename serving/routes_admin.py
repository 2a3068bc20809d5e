"""The admin API (bearer token; docs/CONTRACTS.md section 5): `GET /admin/kernels`, `POST /admin/swap`,
`/admin/rollback`, `/admin/profile`, `/admin/logits`, `/admin/benchmark`, `/admin/compare` and
`/admin/attestation-check`.

`add_routes` puts every route here behind `serving.auth.require_admin`; the token itself is checked by
`serving.auth.AdminAuthMiddleware` before the body is read. Work on the model runs on the engine's thread
(`engine.call`), between forward passes; `exclusive=True` pauses traffic while it runs.
Routes declare no return type (FastAPI would filter the answer through it): their `responses` declare the
bodies in the OpenAPI schema, each route's own and the 401 and 503 every admin route can answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from gpuyantra import attestation
from gpuyantra.swap.records import SwapError, SwapRecord
from serving.admin_schema import (
    INVALID_BODY,
    UNPROCESSABLE,
    AttestationCheckAnswer,
    AttestationCheckBody,
    BenchmarkBody,
    CompareBody,
    KernelsAnswer,
    LogitsAnswer,
    LogitsBody,
    ProfileBody,
    RequestErrorBody,
    RollbackAnswer,
    RollbackBody,
    SwapAnswer,
    SwapBody,
    SwapRefusal,
    SwapUnprocessable,
)
from serving.auth import ADMIN_PREFIX, UNAUTHORIZED, require_admin
from serving.metrics import Metrics
from serving.request import RequestError
from serving.responses import NOT_READY
from serving.state import ServerState, State

log = logging.getLogger("gpuyantra.serving")

SWAP_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": SwapAnswer},
    403: {"model": SwapRefusal, "description": "no valid attestation of these bytes: nothing swapped"},
    422: {"model": SwapUnprocessable, "description": "invalid body, or a candidate that does not load"},
    409: {"model": SwapRefusal, "description": "parity failed or no module fits: nothing swapped"},
}
ROLLBACK_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": RollbackAnswer},
    **INVALID_BODY,
    404: {"model": SwapRefusal, "description": "no swap has this id"},
    409: {"model": SwapRefusal, "description": "the swap is not active (rolled back or superseded)"},
}
BENCHMARK_RESPONSES: dict[int | str, dict[str, Any]] = {
    **UNPROCESSABLE,
    409: {"model": RequestErrorBody, "description": "`mode: live` and too little live traffic to measure"},
}


def request_error(status: int, message: str) -> JSONResponse:
    """A request that cannot be served as asked: `detail` and `message`, both the one line."""
    return JSONResponse(status_code=status, content={"detail": message, "message": message})


# ---------------------------------------------------------------------- kernels
def graphs_info(engine: Any) -> dict[str, Any] | None:
    """The decode graphs and, under `prefill`, the prefill graphs (buckets captured, and why any runs eagerly)."""
    if engine.graphs is None:
        return None
    prefill = engine.prefill_graphs.info() if engine.prefill_graphs is not None else None
    return {
        **engine.graphs.info(),
        "prefill": prefill,
        "mixed": engine.mixed_info(),
        "decode_timing": engine.decode_timing(),
    }


async def kernels(state: State):
    engine = state.require_engine()
    active = engine.swaps.active()
    history = engine.swaps.history()
    return {
        "model": engine.model_name,
        "active": active,
        "history": history,
        "fallbacks": sum(r.get("fallbacks", 0) for r in history),
        "graphs": graphs_info(engine),
        "state_dir": str(engine.swaps.state_dir),
        "manifest": str(engine.swaps.manifest_path),
    }


# ---------------------------------------------------------------------- swap and rollback
def admission(state: ServerState, body: SwapBody, device: str) -> Callable[[bytes], str | None]:
    """The swap engine's check of the bytes it is about to import (see SwapEngine.swap): they must be
    what the body's attestation signed, unless the server allows unverified swaps (then: a warning)."""

    def admit(source: bytes) -> str | None:
        reason: str | None
        if body.attestation is None:
            reason = "no attestation: start the server with --allow-unverified-swaps to swap unverified kernels"
        else:
            reason = attestation.check(source, body.attestation.model_dump(), device, state.attestation_key)
        if reason and state.config.allow_unverified_swaps:
            log.warning("UNVERIFIED SWAP (--allow-unverified-swaps): %s", reason)
            return None
        return reason

    return admit


def count_refusal(metrics: Metrics, exc: SwapError) -> None:
    """gpuyantra_swaps_total of a refused swap (a swap rolled back after parity counts as swapped)."""
    if exc.http_status == 403:
        metrics.swaps.labels(result="forbidden").inc()
    elif exc.http_status == 422:
        metrics.swaps.labels(result="invalid").inc()
    elif exc.status == "rejected":
        metrics.swaps.labels(result="rejected").inc()


def swap_answer(record: SwapRecord) -> dict[str, Any]:
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
        "rows_gate": record.rows_gate,
    }


async def swap(body: SwapBody, state: State):
    engine = state.require_engine()
    admit = admission(state, body, engine.device.type)
    fut = engine.call(
        lambda: engine.swaps.swap(
            body.path,
            source=body.source,
            module_class=body.module_class,
            live_shapes=body.shapes,
            admit=admit,
            param_shapes=body.param_shapes,
            rows_gate=body.rows_gate.model_dump() if body.rows_gate else None,
        ),
        name="swap",
    )
    try:
        record = await asyncio.wrap_future(fut)
    except SwapError as exc:
        count_refusal(state.metrics, exc)
        log.warning("swap refused (%d %s): %s", exc.http_status, exc.status, exc.reason)
        return JSONResponse(status_code=exc.http_status, content={"detail": exc.detail()})
    log.info(
        "swap %s: %s into %d %s module(s), %s",
        record.swap_id,
        record.op,
        record.modules,
        record.module_class,
        record.status,
    )
    return swap_answer(record)


async def rollback(body: RollbackBody, state: State):
    engine = state.require_engine()
    fut = engine.call(lambda: engine.swaps.rollback(body.swap_id, all=bool(body.all)), name="rollback")
    try:
        records = await asyncio.wrap_future(fut)
    except SwapError as exc:
        log.warning("rollback refused (%d %s): %s", exc.http_status, exc.status, exc.reason)
        return JSONResponse(status_code=exc.http_status, content={"detail": exc.detail()})
    for record in records:
        log.info(
            "rollback %s: %s restored to its original forward in %d module(s)",
            record.swap_id,
            record.op,
            record.modules,
        )
    return {"rolled_back": [r.to_dict() for r in records], "active": engine.swaps.active()}


ATTESTATION_CHECK_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": AttestationCheckAnswer},
    403: {"model": AttestationCheckAnswer, "description": "the signature is not this server's key's: swaps would fail"},
    **INVALID_BODY,
}


async def attestation_check(body: AttestationCheckBody, state: State):
    """Whether a swap attested with the sender's key would pass this server's check: the nonce's
    signature under the server's key. Needs no model, so it answers while the model loads."""
    key = state.attestation_key
    source = attestation.key_source(state.config.resolved_state_dir())
    answer = {
        "accepted": attestation.nonce_signed_with(body.nonce, body.signature, key),
        "key": attestation.fingerprint(key),
        "key_source": source,
        "unverified_swaps_allowed": state.config.allow_unverified_swaps,
    }
    if answer["accepted"] or state.config.allow_unverified_swaps:  # the swap would go through either way
        return answer
    sender = f"key {body.key}" if body.key else "a different key"
    detail = (
        f"attestation signature invalid: this server checks attestations with key {answer['key']} "
        f"({source}); the nonce was signed with {sender}"
    )
    return JSONResponse(status_code=403, content={"detail": detail, **answer})


# ---------------------------------------------------------------------- measurements
async def profile(state: State, body: ProfileBody | None = None):
    engine = state.require_engine()
    return await asyncio.wrap_future(engine.call(engine.profile, exclusive=True, name="profile"))


async def logits(body: LogitsBody, state: State):
    """Last-position logits of the live model for a prompt: parity checks from outside."""
    engine = state.require_engine()
    ids = engine.tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
    if not ids or any(not 0 <= i < engine.vocab_size for i in ids):
        return request_error(422, f"prompt must encode to token ids in [0, {engine.vocab_size})")
    values = await asyncio.wrap_future(engine.call(lambda: engine.last_logits(ids), exclusive=True, name="logits"))
    return {"model": engine.model_name, "tokens": len(ids), "logits": values}


async def benchmark(state: State, body: BenchmarkBody | None = None):
    """Served decode speed of the live model: from live traffic when it is decoding at `batch` rows
    (`"measured": "live"`, nothing paused), else with traffic paused for a bounded generation
    (`"measured": "benchmark"`): median tokens/s of the repeats with their spread."""
    engine = state.require_engine()
    asked = body or BenchmarkBody()
    if asked.mode != "benchmark":
        # Off the event loop: observing live traffic waits up to live_window_s.
        live = await asyncio.to_thread(
            engine.live_speed, asked.batch, asked.live_window_s, asked.min_live_steps, asked.repeats
        )
        if live.get("measured") == "live":
            return live
        if asked.mode == "live":
            return request_error(409, live["reason"])
    fut = engine.call(
        lambda: engine.benchmark(asked.max_tokens, asked.prompt_tokens, asked.batch, asked.repeats, asked.min_repeat_s),
        exclusive=True,
        name="benchmark",
    )
    try:
        return await asyncio.wrap_future(fut)
    except RequestError as exc:
        return request_error(422, str(exc))


COMPARE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **UNPROCESSABLE,
    404: {"model": SwapRefusal, "description": "no swap has this id"},
    409: {"model": SwapRefusal, "description": "the swap is not active (rolled back or superseded)"},
}


async def compare(body: CompareBody, state: State):
    """Served decode speed with one active swap turned off and on in alternating phases (traffic
    paused, CUDA graphs re-captured at each turn): per batch, tokens/s with and without it and each
    round's paired drop. The swap is on again at the end; nothing is rolled back."""
    engine = state.require_engine()
    fut = engine.call(
        lambda: engine.compare_swap(
            body.swap_id,
            sorted(set(body.batches)),
            body.rounds,
            body.max_tokens,
            body.prompt_tokens,
            body.repeats,
            body.min_repeat_s,
        ),
        exclusive=True,
        name="compare",
    )
    try:
        return await asyncio.wrap_future(fut)
    except SwapError as exc:
        return JSONResponse(status_code=exc.http_status, content={"detail": exc.detail()})
    except RequestError as exc:
        return request_error(422, str(exc))


# ---------------------------------------------------------------------- registration
def add_routes(app: FastAPI) -> None:
    """The admin routes, each behind the token, in the order the OpenAPI schema lists them."""

    def admin(method: str, path: str, endpoint: Callable[..., Any], responses: dict[int | str, dict[str, Any]]) -> None:
        app.add_api_route(
            ADMIN_PREFIX + path,
            endpoint,
            methods=[method],
            dependencies=[Depends(require_admin)],
            responses={**responses, **UNAUTHORIZED, **NOT_READY},
        )

    admin("GET", "/kernels", kernels, {200: {"model": KernelsAnswer}})
    admin("POST", "/swap", swap, SWAP_RESPONSES)
    admin("POST", "/rollback", rollback, ROLLBACK_RESPONSES)
    admin("POST", "/profile", profile, INVALID_BODY)
    admin("POST", "/logits", logits, {200: {"model": LogitsAnswer}, **UNPROCESSABLE})
    admin("POST", "/benchmark", benchmark, BENCHMARK_RESPONSES)
    admin("POST", "/compare", compare, COMPARE_RESPONSES)
    admin("POST", "/attestation-check", attestation_check, ATTESTATION_CHECK_RESPONSES)
