"""What one request may ask of the server, and the machinery that keeps a request from holding it.

- `RequestLimits`: body bytes, choices (prompts x n) and prompt tokens per request (`gpuyantra serve
  --max-body-bytes / --max-choices / --max-prompt-tokens`).
- `ClientLimitMiddleware`: a 429 for a completions request from a client (its address) that already has
  `--max-client-requests` in flight, before its body is read.
- `BodyLimitMiddleware`: a 413 for a body over the limit, before the app reads it: from its
  Content-Length when it declares one, else counted while the body streams in (it is buffered, so at
  most the limit is ever held).
- `OffLoopJSONRoute`: the route class of the OpenAI routes; a large body is parsed as JSON on a worker
  thread, so /healthz and the streams of other clients keep answering meanwhile.
- `until_disconnected`: a request's work, cancelled when its client goes away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

T = TypeVar("T")

# Defaults a serving deployment would pick for a public completions API: a 4 MiB body holds a
# 32k-token prompt as text or as token ids several times over; 128 choices is OpenAI's own `n` bound
# (one prompt, n=128), and every choice is an engine request holding a cache slot's turn.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_CHOICES = 128
DEFAULT_MAX_PROMPT_TOKENS = 32_768
# Requests one client address may have in flight on the completions routes: four times the default
# --max-batch, so a client that pipelines keeps every slot busy, while a flood of connections from
# one address is refused before its bodies are read or tokenized. Behind a proxy every client shares
# its address: raise it there, or 0 (off).
DEFAULT_MAX_CLIENT_REQUESTS = 32
LIMITED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
RETRY_AFTER_429_S = "1"
# Bodies and prompt text above this are parsed and tokenized on a worker thread: a thread hop costs
# ~50 us, parsing 64 KiB on the loop about as much as a decode step of a small model.
OFF_LOOP_BYTES = 64 * 1024
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there


@dataclass(frozen=True)
class RequestLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_choices: int = DEFAULT_MAX_CHOICES
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    max_client_requests: int = DEFAULT_MAX_CLIENT_REQUESTS  # 0: no limit


def too_large_response(limit: int) -> Response:
    """413 in the OpenAI error shape the completions routes answer every refusal in."""
    message = f"the request body is larger than this server's limit of {limit} bytes (gpuyantra serve --max-body-bytes)"
    body = {"error": {"message": message, "type": "invalid_request_error", "code": 413}, "detail": message}
    return Response(json.dumps(body), status_code=413, media_type="application/json", headers={"Connection": "close"})


def too_many_response(limit: int) -> Response:
    """429 in the OpenAI error shape, with Retry-After."""
    message = (
        f"this client already has {limit} requests in flight, this server's limit per client address "
        "(gpuyantra serve --max-client-requests); retry once one has finished"
    )
    body = {"error": {"message": message, "type": "rate_limit_exceeded", "code": 429}, "detail": message}
    headers = {"Retry-After": RETRY_AFTER_429_S, "Connection": "close"}
    return Response(json.dumps(body), status_code=429, media_type="application/json", headers=headers)


def client_address(request: Request | None) -> str | None:
    """The address a request came from (None in-process): what per-client limits and fair admission key on."""
    client = request.client if request is not None else None
    return client.host if client is not None else None


class ClientLimitMiddleware:
    """ASGI middleware: at most `max_requests` completions requests in flight per client address
    (counted until the answer, a stream included, has been sent); over it a 429, body unread.
    0: no limit. One event loop updates the counts, so they need no lock."""

    def __init__(self, app: ASGIApp, max_requests: int) -> None:
        self.app = app
        self.max_requests = max_requests
        self.in_flight: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.max_requests or scope.get("path") not in LIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        client = (scope.get("client") or ("unknown",))[0]
        if self.in_flight.get(client, 0) >= self.max_requests:
            await too_many_response(self.max_requests)(scope, receive, send)
            return
        self.in_flight[client] = self.in_flight.get(client, 0) + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self.in_flight.pop(client) - 1
            if left:
                self.in_flight[client] = left


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimitMiddleware:
    """ASGI middleware: a body over `max_bytes` is a 413 and is never read whole."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            await too_large_response(self.max_bytes)(scope, receive, send)
            return
        body = await self._read_body(receive)
        if body is None:  # over the limit while streaming in
            await too_large_response(self.max_bytes)(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it exceeds the limit (a disconnect ends it as it stands)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the buffered body once, then the real one (disconnects)."""
    delivered = False

    async def replayed() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


class OffLoopJSONRequest(Request):
    """A request whose large JSON body is parsed on a worker thread."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = await asyncio.to_thread(json.loads, body) if len(body) > OFF_LOOP_BYTES else json.loads(body)
        return self._json


class OffLoopJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def off_loop_handler(request: Request) -> Response:
            return await handler(OffLoopJSONRequest(request.scope, request.receive))

        return off_loop_handler


async def off_loop(size: int, work: Callable[[], T]) -> T:
    """`work()` on a worker thread when `size` (bytes or characters of input) is large, else here."""
    return await asyncio.to_thread(work) if size > OFF_LOOP_BYTES else work()


async def until_disconnected(request: Request, work: Awaitable[T], on_gone: Callable[[], None]) -> T | None:
    """`work`'s result, or None (after `on_gone()` and cancelling it) once the client has gone away."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                on_gone()
                task.cancel()
                return None
    finally:
        if not task.done():  # this handler itself was cancelled (server shutdown)
            on_gone()
            task.cancel()
