"""What one request may ask of the server (serving/limits.py): choices, prompt tokens and body bytes per
request, text that is not valid Unicode, out-of-range fields, large bodies parsed and tokenized off the
event loop, and work cancelled once its client goes away."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from serving.app import create_app
from serving.limits import OFF_LOOP_BYTES, ClientLimitMiddleware
from tests.serving.helpers import metric_value, tiny_cpu_config
from tests.serving.test_app import wait_ready

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    config = tiny_cpu_config(tmp_path_factory.mktemp("limits-state"), max_body_bytes=256 * 1024, max_prompt_tokens=64)
    with TestClient(create_app(config)) as c:
        wait_ready(c)
        yield c


def assert_openai_error(response: httpx.Response, status: int, words: str) -> None:
    assert_openai_error_of(response, status, words, "invalid_request_error")


def assert_openai_error_of(response: httpx.Response, status: int, words: str, kind: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"]["code"] == status and body["error"]["type"] == kind
    assert words in body["error"]["message"] and body["detail"] == body["error"]["message"]


# ---------------------------------------------------------------------- per-request limits
def test_more_choices_than_the_limit_is_a_400_before_anything_runs(client):
    many = client.post("/v1/completions", json={"prompt": [[5, 6]] * 2, "n": 128, "max_tokens": 1})
    assert_openai_error(many, 400, "256 choices; this server runs at most 128")
    assert client.post("/v1/completions", json={"prompt": [[5, 6]], "n": 128, "max_tokens": 1}).status_code == 200


def test_more_prompt_tokens_than_the_limit_is_a_400(client):
    assert_openai_error(
        client.post("/v1/completions", json={"prompt": list(range(1, 101)), "max_tokens": 1}),
        400,
        "the prompts hold 100 tokens; this server takes at most 64",
    )
    both = client.post("/v1/completions", json={"prompt": ["x" * 40, "y" * 40], "max_tokens": 1})
    assert_openai_error(both, 400, "hold 80 tokens")


def test_a_body_over_the_limit_is_a_413_by_its_length(client):
    big = json.dumps({"prompt": "x" * (300 * 1024), "max_tokens": 1})
    response = client.post("/v1/completions", content=big, headers=JSON)
    assert_openai_error(response, 413, "larger than this server's limit")


def test_a_chunked_body_over_the_limit_is_counted_and_refused(client):
    def chunks():  # no Content-Length: the body streams in until it is too large
        yield b'{"prompt": "'
        for _ in range(300):
            yield b"x" * 1024
        yield b'"}'

    response = client.post("/v1/completions", content=chunks(), headers=JSON)
    assert response.request.headers.get("transfer-encoding") == "chunked"
    assert_openai_error(response, 413, "larger than this server's limit of 262144 bytes")


def test_the_413_and_429_are_declared_in_the_schema(client):
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = client.get("/openapi.json").json()["paths"][path]["post"]["responses"]
        for status in ("413", "429"):
            assert responses[status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")


# ---------------------------------------------------------------------- requests in flight per client
def held_app(release: asyncio.Event):
    """An ASGI app whose completions answer once `release` is set (requests in flight meanwhile)."""

    async def app(scope, receive, send):
        if scope["path"].startswith("/v1/"):
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def client_from(app, address: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app, client=(address, 5000)), base_url="http://t")


async def test_a_client_over_its_requests_in_flight_is_a_429_and_others_are_not():
    release = asyncio.Event()
    app = ClientLimitMiddleware(held_app(release), max_requests=2)
    async with client_from(app, "10.0.0.9") as flood, client_from(app, "10.0.0.1") as other:
        held = [asyncio.ensure_future(flood.post("/v1/completions", json={})) for _ in range(2)]
        await asyncio.sleep(0.05)  # both are in flight
        refused = await flood.post("/v1/chat/completions", json={})
        assert_openai_error_of(refused, 429, "already has 2 requests in flight", "rate_limit_exceeded")
        assert refused.headers["retry-after"] == "1"
        assert (await flood.get("/healthz")).status_code == 200  # only the completions routes count
        other_request = asyncio.ensure_future(other.post("/v1/completions", json={}))
        await asyncio.sleep(0.05)
        assert app.in_flight == {"10.0.0.9": 2, "10.0.0.1": 1}  # another address has its own count
        release.set()
        assert [r.status_code for r in await asyncio.gather(*held, other_request)] == [200, 200, 200]
        assert (await flood.post("/v1/completions", json={})).status_code == 200  # its turn again
    assert app.in_flight == {}


async def test_no_limit_per_client_with_zero():
    release = asyncio.Event()
    app = ClientLimitMiddleware(held_app(release), max_requests=0)
    async with client_from(app, "10.0.0.9") as flood:
        held = [asyncio.ensure_future(flood.post("/v1/completions", json={})) for _ in range(3)]
        await asyncio.sleep(0.05)
        release.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200, 200]


# ---------------------------------------------------------------------- encoding and ranges
@pytest.mark.parametrize(
    "path, raw",
    [
        ("/v1/completions", '{"prompt": "\\ud800", "max_tokens": 1}'),
        ("/v1/completions", '{"prompt": ["ok", "a\\udfffb"], "max_tokens": 1}'),
        ("/v1/completions", '{"prompt": "ok", "stop": ["\\ud800"], "max_tokens": 1}'),
        ("/v1/completions", '{"prompt": "ok", "model": "\\ud800", "max_tokens": 1}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}'),
    ],
)
def test_a_lone_surrogate_is_a_400_not_a_500(client, path, raw):
    assert_openai_error(client.post(path, content=raw, headers=JSON), 400, "not valid Unicode")


def test_a_negative_seed_is_refused_naming_the_field(client):
    response = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "seed": -1})
    assert response.status_code == 422 and response.json()["message"].startswith("seed:")
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "seed": 0}).status_code == 200


# ---------------------------------------------------------------------- off the event loop
def test_large_bodies_are_parsed_and_tokenized_off_the_event_loop(client, monkeypatch):
    """A large body's JSON and its prompt's tokens are worked out on a worker thread: no running event loop."""
    import serving.limits as limits

    on_loop: dict[str, bool] = {}
    real_loads = json.loads

    class RecordingJson:
        dumps = staticmethod(json.dumps)

        @staticmethod
        def loads(raw):
            on_loop["json"] = asyncio._get_running_loop() is not None
            return real_loads(raw)

    monkeypatch.setattr(limits, "json", RecordingJson)
    tokenizer = client.app.state.server.engine.tokenizer
    real_encode = tokenizer.encode

    def encode(text, *args, **kwargs):
        on_loop["tokenize"] = asyncio._get_running_loop() is not None
        return real_encode(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", encode)
    prompt = "x" * (OFF_LOOP_BYTES + 1024)  # within the body limit, beyond the prompt-token limit
    response = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
    assert response.status_code == 400 and "tokens" in response.json()["detail"]
    assert on_loop == {"json": False, "tokenize": False}


# ---------------------------------------------------------------------- a real server
def _raw_request(port: int, head: str, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head.encode() + b"\r\n\r\n" + body)
    return sock


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_sent(start_server):
    server = start_server()
    # 200 MB announced, nothing sent: the server answers from the headers alone.
    sock = _raw_request(
        server.port,
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 200000000",
    )
    with sock:
        status_line = sock.recv(4096).split(b"\r\n", 1)[0]
    assert status_line == b"HTTP/1.1 413 Request Entity Too Large"
    assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_work_is_cancelled_when_its_client_goes_away(start_server, stream):
    """128 choices of up to 200 tokens each: minutes of work on a CPU. The client hangs up; the
    engine's requests are dropped and the queue empties."""
    server = start_server()
    asked = {"prompt": [[5, 17, 300]], "n": 128, "max_tokens": 200, "temperature": 1.0, "stream": stream}
    body = json.dumps(asked).encode()
    sock = _raw_request(
        server.port,
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}",
        body,
    )
    busy = 0.0
    for _ in range(200):  # bounded: wait until the engine has the request's work queued
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        busy = metric_value(metrics, "gpuyantra_requests_waiting") + metric_value(metrics, "gpuyantra_requests_active")
        if busy >= 100:
            break
        time.sleep(0.05)
    assert busy >= 100
    sock.close()
    for _ in range(100):  # bounded: the disconnect is noticed within a poll or two
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        busy = metric_value(metrics, "gpuyantra_requests_waiting") + metric_value(metrics, "gpuyantra_requests_active")
        if busy == 0:
            break
        time.sleep(0.1)
    assert busy == 0, "the engine still runs the requests of a client that went away"
    assert metric_value(metrics, "gpuyantra_requests_total", 'status="cancelled"') >= 100
