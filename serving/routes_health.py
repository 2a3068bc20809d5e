"""Probes and the model list: `GET /healthz` (liveness), `/readyz` (model loaded, manifest re-applied,
model thread running), `/metrics` (Prometheus) and `/v1/models`. Public: no token.
Routes declare no return type: FastAPI would publish it as a response schema."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serving.state import RETRY_AFTER_S, State


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
    app.add_api_route("/healthz", healthz, methods=["GET"])
    app.add_api_route("/readyz", readyz, methods=["GET"])
    app.add_api_route("/metrics", metrics_route, methods=["GET"])
    app.add_api_route("/v1/models", models, methods=["GET"])
