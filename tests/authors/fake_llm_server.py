"""A real local HTTP server (FastAPI under uvicorn, in a thread) that speaks just enough of the
OpenAI chat-completions API and the Gemini generateContent REST API for the author tests.

Each test scripts the replies (`FakeLLM.script(...)`) and reads back what the server received
(`FakeLLM.requests`).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


@dataclass
class Reply:
    status: int = 200
    text: str | None = None  # the model's reply text (wrapped in the API's envelope)
    body: Any = None  # a raw body instead (error replies)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Received:
    api: str  # "openai" | "gemini" | "models"
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class FakeLLM:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._script: list[Reply] = []
        self._default = Reply(status=500, body={"error": "no reply scripted"})
        self._lock = threading.Lock()
        self.app = self._build_app()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # --- scripting ---------------------------------------------------------------------------
    def script(self, *replies: Reply, default: Reply | None = None) -> None:
        """Replies to give in order; after them, `default` (or the last one) for every request."""
        with self._lock:
            self.requests.clear()
            self._script = list(replies)
            self._default = default or (replies[-1] if replies else Reply(status=500, body={}))

    def _next(self) -> Reply:
        with self._lock:
            return self._script.pop(0) if self._script else self._default

    def _record(self, api: str, request: Request, body: Any) -> None:
        with self._lock:
            self.requests.append(
                Received(
                    api, request.method, request.url.path, {k.lower(): v for k, v in request.headers.items()}, body
                )
            )

    # --- the app -----------------------------------------------------------------------------
    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models(request: Request) -> Any:
            self._record("models", request, None)
            return {"object": "list", "data": [{"id": "fake-coder", "object": "model", "owned_by": "test"}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            self._record("openai", request, body)
            reply = self._next()
            if reply.body is not None or reply.text is None:
                return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
            return JSONResponse(
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model"),
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply.text}}
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                },
                status_code=reply.status,
                headers=reply.headers,
            )

        @app.post("/{version}/models/{model}:generateContent")
        async def generate(version: str, model: str, request: Request) -> Any:
            body = await request.json()
            self._record("gemini", request, body)
            reply = self._next()
            if reply.body is not None or reply.text is None:
                return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
            return JSONResponse(
                {
                    "candidates": [
                        {
                            "content": {"role": "model", "parts": [{"text": reply.text}]},
                            "finishReason": "STOP",
                            "index": 0,
                        }
                    ],
                    "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 10, "totalTokenCount": 20},
                    "modelVersion": model,
                },
                status_code=reply.status,
                headers=reply.headers,
            )

        return app

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> FakeLLM:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fake-llm-server", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake LLM server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)


def reply_json(
    source: str, adapter: list[dict[str, str]], name: str = "fake-strategy", notes: str = "returned by the fake server"
) -> str:
    return json.dumps({"strategy": {"name": name, "notes": notes}, "source": source, "adapter": adapter})
