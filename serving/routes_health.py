"""Probes and the model list: `GET /healthz` (liveness), `/readyz` (model loaded, manifest re-applied,
model thread running), `/metrics` (Prometheus) and `/v1/models`. Public: no token.
Routes declare no return type (FastAPI would filter the answer through it): their `responses` declare the
bodies in the OpenAPI schema."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from serving.responses import NOT_READY, RETRY_AFTER
from serving.state import RETRY_AFTER_S, State


# ====================================================================== answers
class Liveness(BaseModel):
    status: Literal["ok"]
    loading: bool = Field(..., description="the model is still loading (the process is alive meanwhile)")


class Readiness(BaseModel):
    status: Literal["ready"]
    model: str
    device: str
    active_swaps: list[str] = Field(..., description="swap ids bound now")
    reapplied: list[dict[str, Any]] = Field(..., description="the kept swaps re-applied at startup")
    cuda_graphs: bool
    decode_attention: str = Field(..., description="triton or sdpa")
    fused_projection_groups: int
    fused_residual_norms: int = Field(
        ..., description="decoder layers whose first residual add and norm run as one call"
    )
    mixed_prompt_tokens: int = Field(
        0, description="prompt tokens a request may bring into a running decode step (0: mixed steps off)"
    )


class ProbeFailure(BaseModel):
    status: Literal["loading", "error"]
    error: str | None = Field(..., description="why loading failed or the model thread stopped; null while loading")


class ServedModel(BaseModel):
    """The served model, with what `serving.models.describe` says of it (architecture, dtype, vocab_size, ...)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int = Field(..., description="the longest prompt + generation served")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ServedModel]


async def healthz(state: State):
    if state.error or (state.engine is not None and not state.engine.alive):
        return JSONResponse(
            status_code=503, content={"status": "error", "error": state.error or "the model thread stopped"}
        )
    return {"status": "ok", "loading": state.loading}


async def readyz(state: State):
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
        "fused_residual_norms": engine.fused_residual_norms,
        "mixed_prompt_tokens": engine.mixed_prompt_tokens,
    }


async def metrics_route(state: State):
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def models(state: State):
    engine = state.require_engine()
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


def add_routes(app: FastAPI) -> None:
    app.add_api_route(
        "/healthz",
        healthz,
        methods=["GET"],
        responses={
            200: {"model": Liveness},
            503: {"model": ProbeFailure, "description": "loading the model failed, or the model thread stopped"},
        },
    )
    app.add_api_route(
        "/readyz",
        readyz,
        methods=["GET"],
        responses={
            200: {"model": Readiness},
            503: {
                "model": ProbeFailure,
                "description": "loading (`Retry-After` says when to ask again) or loading failed",
                "headers": RETRY_AFTER,
            },
        },
    )
    app.add_api_route(
        "/metrics",
        metrics_route,
        methods=["GET"],
        response_class=Response,  # Prometheus text, not JSON
        responses={
            200: {
                "description": "Prometheus text exposition",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    app.add_api_route("/v1/models", models, methods=["GET"], responses={200: {"model": ModelList}, **NOT_READY})
