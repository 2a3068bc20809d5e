"""Answers every route can give, as the OpenAPI schema declares them: a refusal with one line (`DetailBody`,
the body of FastAPI's HTTPException) and the 503 of a route that needs the model while it loads or after
loading failed (`NOT_READY`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class DetailBody(BaseModel):
    """A refusal: `detail`, one line saying why."""

    detail: str


RETRY_AFTER: dict[str, Any] = {
    "Retry-After": {"description": "seconds, while the model loads", "schema": {"type": "string"}}
}
NOT_READY: dict[int | str, dict[str, Any]] = {
    503: {
        "model": DetailBody,
        "description": "the model is still loading (`Retry-After` says when to ask again) or failed to load",
        "headers": RETRY_AFTER,
    }
}
