#!/usr/bin/env python3
# Over 600 lines: one benchmark, top to bottom: the server, the normal load, five kinds of abuse, the verdict.
"""Abusive clients against a real `gpuyantra serve`: do the server's request limits hold, and do the
normal clients beside them keep their latency?

Two phases of the same normal load, N streaming clients (chat completions with `stream: true` where
the served model has a chat template, else completions), each sending realistic prompts one after
another for T seconds: first alone (the baseline), then beside abusive clients running concurrently:

- `many_prompts`: one completions request of --prompts prompts x n=--n (over `--max-choices`: a 400);
- `largest_allowed`: one streamed completions request of one prompt x the largest `n` the published
  schema (`/openapi.json`) allows, 4x the normal `max_tokens`: within every limit, cancelled at the phase's end;
- `body_declared` / `body_chunked`: a --body-mb MB body, with its Content-Length and chunked (a 413,
  from the headers or once the limit is counted);
- `slow_loris`: --loris connections sending request headers one byte per --loris-interval-s, never done;
- `flood`: --flood concurrent streaming requests from one client.

The abusive clients connect from another address than the normal ones (127.0.0.2 when the server is
on 127.0.0.1), so the server can tell them apart: its fair admission between clients and its
per-client limit (`--max-client-requests`) key on the client's address.

Per phase: the normal requests ok / failed, p50 / p99 of time to first token and total latency, and
`/healthz` latency (polled every 0.2 s); per abusive client what it got back (status codes, time).
Verdict: pass when no normal request failed and the normal p99 total latency under abuse is at most
2x the baseline's. Exit 0 on pass, 1 on fail, 3 when the run itself failed (the JSON says why).

    python benchmarks/abuse_bench.py --out $OUT/abuse.json                     # GPU: qwen2.5-1.5b, graphs
    python benchmarks/abuse_bench.py --url http://127.0.0.1:8000 --out a.json  # a server already running
    python benchmarks/abuse_bench.py --smoke --out /tmp/abuse.json             # CPU: tiny-qwen2, small sizes
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import select
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from gpuyantra.processes import Managed, free_port, start_server  # noqa: E402

TOKEN = "bench-admin-token"
HEALTH_POLL_S = 0.2
MB = 1_000_000
CHUNK = 256 * 1024  # bytes per write of the large bodies
VERDICT_P99_FACTOR = 2.0
LARGEST_ALLOWED_TOKENS = 4  # x --max-tokens: long, and within the started server's 512 positions

# Realistic prompts: questions and instructions of the lengths chat traffic has (tens to hundreds of tokens).
PROMPTS = [
    "What is the capital of France, and why did it become the capital?",
    "Summarize in two sentences: The mitochondrion is an organelle found in most eukaryotic cells. It "
    "generates most of the cell's supply of adenosine triphosphate, used as a source of chemical energy.",
    "Write a short Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Translate to German: The train to Munich leaves at half past eight from platform four.",
    "I have 3 apples and buy 5 more, then give away 2. How many apples do I have? Explain step by step.",
    "List three differences between TCP and UDP that matter when streaming video over a lossy network.",
    "Explain to a ten-year-old why the sky is blue, in no more than three sentences.",
    "Draft a polite email declining a meeting invitation for Thursday afternoon because of a conflict.",
]

# What --smoke sets where the flag was not given: the CPU run of the test suite.
SMOKE = {
    "model": "tiny-qwen2",
    "clients": 2,
    "seconds": 3.0,
    "max_tokens": 6,
    "prompts": 20,
    "n": 16,
    "body_mb": 6.0,
    "flood": 8,
    "loris_interval_s": 0.2,
}
DEFAULTS = {
    "model": "qwen2.5-1.5b",
    "clients": 8,
    "seconds": 30.0,
    "max_tokens": 64,
    "prompts": 1000,
    "n": 128,
    "body_mb": 200.0,
    "flood": 64,
    "loris_interval_s": 1.0,
}


ABUSE_KINDS = ("many_prompts", "largest_allowed", "body", "loris", "flood")


def abuse_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in ABUSE_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown abuse {unknown or text!r}; known: {','.join(ABUSE_KINDS)}")
    return kinds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the JSON result")
    p.add_argument("--url", default=None, help="a running server (default: start one on 127.0.0.1)")
    p.add_argument("--model", default=None, help=f"model of the started server (default {DEFAULTS['model']})")
    p.add_argument("--clients", type=int, default=None, help="normal streaming clients (default 8)")
    p.add_argument("--seconds", type=float, default=None, help="length of each phase (default 30)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per normal request (default 64)")
    p.add_argument("--prompts", type=int, default=None, help="prompts of the many-prompts request (default 1000)")
    p.add_argument("--n", type=int, default=None, help="n of the many-prompts request (default 128)")
    p.add_argument("--body-mb", type=float, default=None, help="size of the large bodies in MB (default 200)")
    p.add_argument("--flood", type=int, default=None, help="concurrent requests of the flooding client; 0: none")
    p.add_argument("--loris", type=int, default=1, help="slow-loris connections (default 1)")
    p.add_argument("--loris-interval-s", type=float, default=None, help="seconds between a loris's bytes")
    p.add_argument(
        "--abuse",
        type=abuse_kinds,
        default=ABUSE_KINDS,
        help=f"the abusive clients of the second phase, comma-separated (default: all of {','.join(ABUSE_KINDS)})",
    )
    p.add_argument("--endpoint", choices=["auto", "chat", "completions"], default="auto")
    p.add_argument("--serve-arg", action="append", default=[], help="extra `gpuyantra serve` argument (repeat)")
    p.add_argument("--smoke", action="store_true", help="tiny-qwen2 on the CPU, small sizes, seconds of load")
    args = p.parse_args(argv)
    for name, value in (SMOKE if args.smoke else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.clients < 1 or args.seconds <= 0 or args.max_tokens < 1 or args.prompts < 1 or args.n < 1:
        p.error("--clients, --seconds, --max-tokens, --prompts and --n must be positive")
    if args.flood < 0 or args.loris < 0 or args.body_mb < 0:
        p.error("--flood, --loris and --body-mb must be 0 or more")
    return args


# ====================================================================== figures
def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of `values`, None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)], 4)


def latency_figures(values: list[float]) -> dict[str, Any]:
    return {"count": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99)}


@dataclass
class NormalLoad:
    """What the normal clients of one phase saw."""

    ttft_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "ok": len(self.total_s),
            "failed": len(self.failures),
            "failures": self.failures[:5],
            "ttft_s": latency_figures(self.ttft_s),
            "total_s": latency_figures(self.total_s),
        }


def verdict(baseline: dict[str, Any], abused: dict[str, Any], factor: float = VERDICT_P99_FACTOR) -> dict[str, Any]:
    """Pass when no normal request failed in either phase and the abused p99 total latency is at
    most `factor` x the baseline's."""
    base, under = baseline["normal"]["total_s"]["p99"], abused["normal"]["total_s"]["p99"]
    failed = baseline["normal"]["failed"] + abused["normal"]["failed"]
    ratio = round(under / base, 3) if base and under is not None else None
    reasons = []
    if failed:
        reasons.append(f"{failed} normal request(s) failed")
    if ratio is None:
        reasons.append("no normal request completed in a phase")
    elif ratio > factor:
        reasons.append(f"normal p99 latency {under:.3f}s is {ratio}x the baseline's {base:.3f}s (limit {factor}x)")
    return {"pass": not reasons, "p99_ratio": ratio, "reasons": reasons}


# ====================================================================== normal clients
def normal_request(endpoint: str, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The path and body of one normal streamed request."""
    if endpoint == "chat":
        messages = [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, "stream": True}
    return "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "stream": True}


def has_content(event: dict[str, Any]) -> bool:
    """Does a streamed chunk carry generated text (chat's role-only first chunk does not)?"""
    for choice in event.get("choices") or ():
        if choice.get("text") or choice.get("token_ids") or (choice.get("delta") or {}).get("content"):
            return True
    return False


async def streamed(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[int, float | None, str]:
    """One streamed request: its status, seconds to the first generated text (None without any) and
    the error it reported ('' when none)."""
    started = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            return response.status_code, None, (await response.aread()).decode(errors="replace")[:200]
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                return 200, first, str(event["error"])[:200]
            if first is None and has_content(event):
                first = time.perf_counter() - started
    return 200, first, ""


async def normal_client(url: str, index: int, endpoint: str, max_tokens: int, stop_at: float, load: NormalLoad) -> None:
    """One normal client: its requests one after another until `stop_at`."""
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600, connect=30)) as client:
        turn = 0
        while time.monotonic() < stop_at:
            prompt = PROMPTS[(index + turn) % len(PROMPTS)]
            turn += 1
            path, body = normal_request(endpoint, prompt, max_tokens)
            started = time.perf_counter()
            try:
                status, ttft, error = await streamed(client, path, body)
            except (httpx.HTTPError, json.JSONDecodeError) as exc:
                load.failures.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            if status != 200 or error:
                load.failures.append(f"HTTP {status}: {error}")
                continue
            load.total_s.append(time.perf_counter() - started)
            if ttft is not None:
                load.ttft_s.append(ttft)


async def health_probe(url: str, stop_at: float) -> dict[str, Any]:
    """`GET /healthz` every HEALTH_POLL_S until `stop_at`: its latency and failures."""
    latencies: list[float] = []
    failures: list[str] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            try:
                response = await client.get("/healthz")
                if response.status_code == 200:
                    latencies.append(time.perf_counter() - started)
                else:
                    failures.append(f"HTTP {response.status_code}")
            except httpx.HTTPError as exc:
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
            await asyncio.sleep(HEALTH_POLL_S)
    return {**latency_figures(latencies), "max": round(max(latencies), 4) if latencies else None, "failed": failures}


# ====================================================================== abusive clients
def answer(status: int | None, started: float, detail: str = "", **extra: Any) -> dict[str, Any]:
    return {"status": status, "seconds": round(time.perf_counter() - started, 3), "detail": detail[:300], **extra}


def abuser_client(url: str, source: str | None, connections: int = 1) -> httpx.AsyncClient:
    """An HTTP client connecting from `source` (None: the default address)."""
    transport = httpx.AsyncHTTPTransport(local_address=source) if source else None
    limits = httpx.Limits(max_connections=connections + 1, max_keepalive_connections=connections + 1)
    return httpx.AsyncClient(base_url=url, timeout=600, transport=transport, limits=limits)


async def many_prompts(url: str, source: str | None, prompts: int, n: int) -> dict[str, Any]:
    """(a) one completions request of `prompts` prompts x `n`: more choices than a server runs."""
    body = {"prompt": [PROMPTS[i % len(PROMPTS)] for i in range(prompts)], "n": n, "max_tokens": 16}
    started = time.perf_counter()
    async with abuser_client(url, source) as client:
        try:
            response = await client.post("/v1/completions", json=body)
        except httpx.HTTPError as exc:
            return answer(None, started, f"{type(exc).__name__}: {exc}")
    return answer(response.status_code, started, response.text, prompts=prompts, n=n)


async def largest_allowed(url: str, source: str | None, n: int, max_tokens: int, stop_at: float) -> dict[str, Any]:
    """One streamed request of one prompt x the schema's largest `n`, within every limit: served
    (or refused) as it comes; the client hangs up at `stop_at`, which cancels what is left."""
    body = {"prompt": PROMPTS[0], "n": n, "max_tokens": max_tokens, "temperature": 1.0, "stream": True}
    started = time.perf_counter()
    events = 0
    try:
        async with (
            abuser_client(url, source) as client,
            client.stream("POST", "/v1/completions", json=body) as response,
        ):
            if response.status_code != 200:
                return answer(response.status_code, started, (await response.aread()).decode(errors="replace"), n=n)
            async for line in response.aiter_lines():
                events += line.startswith("data: ")
                if time.monotonic() >= stop_at:
                    return answer(200, started, "hung up at the phase's end", n=n, events=events, finished=False)
    except httpx.HTTPError as exc:
        return answer(None, started, f"{type(exc).__name__}: {exc}", n=n, events=events)
    return answer(200, started, "", n=n, events=events, finished=True)


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)


async def read_status(reader: asyncio.StreamReader) -> int | None:
    """The status code of the answer on `reader`, None when the connection closed without one."""
    try:
        line = await reader.readline()
    except ConnectionError:
        return None
    return status_of(line)


def status_of(data: bytes) -> int | None:
    """The status code of an HTTP status line (None when `data` holds none)."""
    try:
        return int(data.split(b"\r\n", 1)[0].split()[1])
    except (IndexError, ValueError):
        return None


def body_chunks(total: int) -> Iterator[bytes]:
    """A JSON completions body of `total` bytes (a prompt of 'a's), in CHUNK-sized pieces."""
    head, tail = b'{"prompt": "', b'", "max_tokens": 1}'
    filler = total - len(head) - len(tail)
    yield head
    piece = b"a" * CHUNK
    while filler > 0:
        yield piece[: min(CHUNK, filler)]
        filler -= CHUNK
    yield tail


def answer_waiting(sock: socket.socket, wait_s: float) -> tuple[bool, int | None]:
    """Has the server answered (or closed) within `wait_s`, and with which status?"""
    if not select.select([sock], [], [], wait_s)[0]:
        return False, None
    try:
        return True, status_of(sock.recv(4096))
    except OSError:  # reset: whatever it answered was dropped with the connection
        return True, None


def framed(chunks: Iterator[bytes], chunked: bool) -> Iterator[bytes]:
    """The body's bytes on the wire: as they are, or in chunked transfer coding with its last chunk."""
    for chunk in chunks:
        yield b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk
    if chunked:
        yield b"0\r\n\r\n"


def send_large_body(host: str, port: int, source: str | None, total: int, chunked: bool) -> dict[str, Any]:
    """(b) on a thread: the headers, up to a second for an early answer (as curl waits on a large
    upload), then the body as fast as the server takes it until it answers, closes or has it all.
    Never blocked in a send: an answer is read the moment it arrives, before the server's close can
    reset the connection under it."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    started = time.perf_counter()
    sent = 0
    with socket.create_connection((host, port), timeout=120, source_address=(source, 0) if source else None) as sock:
        sock.sendall(head.encode())
        answered, status = answer_waiting(sock, 1.0)
        sock.setblocking(False)
        wire, pending = framed(body_chunks(total), chunked), b""
        while not answered:
            pending = pending or next(wire, b"")
            if not pending:  # all sent
                answered, status = answer_waiting(sock, 120)
                break
            readable, writable, _ = select.select([sock], [sock], [], 120)
            if readable or not writable:
                answered, status = answer_waiting(sock, 0 if readable else 120)
                break
            try:
                written = sock.send(pending)
            except BlockingIOError:
                continue
            except OSError:  # the server closed: its answer may still be readable
                answered, status = answer_waiting(sock, 5.0)
                break
            pending, sent = pending[written:], sent + written
    return answer(status, started, "", body_bytes=total, bytes_sent=sent, chunked=chunked)


async def large_body(url: str, source: str | None, megabytes: float, chunked: bool) -> dict[str, Any]:
    """(b) a body of `megabytes` MB, with its Content-Length or chunked (on a thread: blocking sends)."""
    host, port = host_port(url)
    return await asyncio.to_thread(send_large_body, host, port, source, max(64, int(megabytes * MB)), chunked)


async def slow_loris(url: str, source: str | None, interval_s: float, stop_at: float) -> dict[str, Any]:
    """(c) request headers sent one byte per `interval_s`, never finished, until `stop_at`: what the
    server answered meanwhile (None: nothing, the connection still open) or whether it closed it."""
    host, port = host_port(url)
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0) if source else None)
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nX-Padding: ".encode()
    status_task = asyncio.ensure_future(read_status(reader))
    sent = 0
    try:
        while time.monotonic() < stop_at and not status_task.done():
            writer.write(head[sent : sent + 1] if sent < len(head) else b"a")
            await writer.drain()
            sent += 1
            await asyncio.sleep(interval_s)
    except ConnectionError:
        pass
    closed = status_task.done()
    status = status_task.result() if closed else None
    status_task.cancel()
    writer.close()
    return answer(status, started, "", bytes_sent=sent, closed_by_server=closed)


async def flood(url: str, source: str | None, requests: int, max_tokens: int, stop_at: float) -> dict[str, Any]:
    """(d) `requests` concurrent streamed completions from one client (one source address), each
    slot sending again as soon as its last ended, until `stop_at`: the status codes it got."""
    statuses: Counter[str] = Counter()
    started = time.perf_counter()
    async with abuser_client(url, source, requests) as client:

        async def one_slot(slot: int) -> None:
            turn = 0
            while time.monotonic() < stop_at:
                body = {"prompt": PROMPTS[(slot + turn) % len(PROMPTS)], "max_tokens": max_tokens, "stream": True}
                turn += 1
                try:
                    status, _, error = await streamed(client, "/v1/completions", body)
                    statuses[str(status) if not error or status != 200 else "200-error"] += 1
                    if status != 200:
                        await asyncio.sleep(0.05)  # a refused request: retry, as a client would, not in a spin
                except (httpx.HTTPError, json.JSONDecodeError) as exc:
                    statuses[type(exc).__name__] += 1

        await asyncio.gather(*(one_slot(s) for s in range(requests)))
    return answer(None, started, "", concurrent=requests, statuses=dict(statuses))


# ====================================================================== phases
async def with_deadline(make: Callable[[], Any], stop_at: float, grace_s: float) -> Any:
    """`make()`'s coroutine, given until `stop_at` + `grace_s` (its own requests' end); then cancelled."""
    try:
        return await asyncio.wait_for(make(), timeout=max(1.0, stop_at - time.monotonic() + grace_s))
    except TimeoutError:
        return {"status": None, "detail": "still running at the phase's end + grace: cancelled"}


async def run_phase(url: str, args: argparse.Namespace, endpoint: str, abusive: dict[str, Callable[..., Any]]):
    """One phase: the normal clients and the health probe for `args.seconds`, beside `abusive`
    (name -> coroutine function of `stop_at`)."""
    stop_at = time.monotonic() + args.seconds
    load = NormalLoad()
    grace = max(30.0, args.seconds)
    normal = [normal_client(url, i, endpoint, args.max_tokens, stop_at, load) for i in range(args.clients)]
    abuse_names = list(abusive)
    results = await asyncio.gather(
        health_probe(url, stop_at),
        *(with_deadline(lambda f=abusive[name]: f(stop_at), stop_at, grace) for name in abuse_names),
        *normal,
    )
    phase: dict[str, Any] = {"seconds": args.seconds, "normal": load.summary(), "healthz_s": results[0]}
    if abuse_names:
        phase["abuse"] = dict(zip(abuse_names, results[1 : 1 + len(abuse_names)]))
    return phase


def abuser_source(url: str, index: int) -> str | None:
    """The address abusive client `index` connects from: 127.0.0.(2 + index) when the server is on
    127.0.0.1 (Linux routes all of 127/8 to lo), so the server tells each apart from the normal
    clients and from the others (one's per-client limit is not another's); else the default."""
    loopback = host_port(url)[0] in ("127.0.0.1", "localhost") and sys.platform == "linux"
    return f"127.0.0.{2 + index}" if loopback and index < 250 else None


def largest_n(url: str) -> int:
    """The largest `n` the published schema lets a completions request ask for."""
    schema = httpx.get(f"{url}/openapi.json", timeout=30).json()
    return int(schema["components"]["schemas"]["CompletionRequest"]["properties"]["n"].get("maximum", 1))


def chosen_endpoint(url: str, wanted: str) -> str:
    """chat where the served model has a chat template (auto), else completions."""
    if wanted != "auto":
        return wanted
    models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    return "chat" if models and models[0].get("chat_template") else "completions"


def abusive_clients(url: str, args: argparse.Namespace, n_max: int) -> dict[str, Callable[[float], Any]]:
    """The abusive clients `--abuse` names, by name: each a coroutine function of the phase's end,
    each from its own address (`abuser_source`)."""
    kinds = set(args.abuse)
    made: dict[str, Callable[[str | None, float], Any]] = {}
    if "many_prompts" in kinds:
        made["many_prompts"] = lambda source, stop_at: many_prompts(url, source, args.prompts, args.n)
    if "largest_allowed" in kinds:
        made["largest_allowed"] = lambda source, stop_at: largest_allowed(
            url, source, n_max, LARGEST_ALLOWED_TOKENS * args.max_tokens, stop_at
        )
    if "body" in kinds and args.body_mb > 0:
        made["body_declared"] = lambda source, stop_at: large_body(url, source, args.body_mb, chunked=False)
        made["body_chunked"] = lambda source, stop_at: large_body(url, source, args.body_mb, chunked=True)
    for i in range(args.loris if "loris" in kinds else 0):
        made[f"slow_loris_{i}"] = lambda source, stop_at: slow_loris(url, source, args.loris_interval_s, stop_at)
    if "flood" in kinds and args.flood:
        made["flood"] = lambda source, stop_at: flood(url, source, args.flood, args.max_tokens, stop_at)
    return {
        name: functools.partial(with_source, make, abuser_source(url, index))
        for index, (name, make) in enumerate(made.items())
    }


async def with_source(make: Callable[[str | None, float], Any], source: str | None, stop_at: float) -> dict:
    """An abusive client's result, with the address it came from."""
    return {**(await make(source, stop_at)), "source": source or "default"}


async def bench(url: str, args: argparse.Namespace) -> dict[str, Any]:
    endpoint = chosen_endpoint(url, args.endpoint)
    n_max = largest_n(url)
    # A warm-up request, so the baseline does not pay for first-call costs.
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await streamed(client, *normal_request(endpoint, PROMPTS[0], 2))
    baseline = await run_phase(url, args, endpoint, {})
    abused = await run_phase(url, args, endpoint, abusive_clients(url, args, n_max))
    return {
        "endpoint": endpoint,
        "largest_n": n_max,
        "phases": {"baseline": baseline, "abuse": abused},
        "verdict": verdict(baseline, abused),
    }


# ====================================================================== the server and the report
def start_own_server(args: argparse.Namespace) -> Managed:
    device = "cpu" if args.smoke else "cuda"
    extra = ["--max-seq-len", "512", "--max-batch", "4" if args.smoke else "8", "--log-level", "warning"]
    extra += [] if args.smoke else ["--cuda-graphs"]
    env = {"TRITON_INTERPRET": "1"} if args.smoke else {}
    state = Path(tempfile.mkdtemp(prefix="gy-abuse-bench-"))
    extra += args.serve_arg
    return start_server(args.model, state, free_port(), TOKEN, device=device, extra_args=extra, env=env, timeout_s=600)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def summary_lines(result: dict[str, Any]) -> list[str]:
    lines = []
    for name, phase in result["phases"].items():
        normal, health = phase["normal"], phase["healthz_s"]
        lines.append(
            f"{name:8s} normal ok {normal['ok']} failed {normal['failed']}  "
            f"ttft p50/p99 {fmt(normal['ttft_s']['p50'])}/{fmt(normal['ttft_s']['p99'])} s  "
            f"total p50/p99 {fmt(normal['total_s']['p50'])}/{fmt(normal['total_s']['p99'])} s  "
            f"healthz p99 {fmt(health['p99'])} s max {fmt(health['max'])} s"
        )
        for abuser, got in phase.get("abuse", {}).items():
            statuses = got.get("statuses")
            shown = statuses if statuses is not None else f"HTTP {got.get('status')}"
            lines.append(f"  {abuser:16s} {shown} in {got.get('seconds', '-')} s")
    v = result["verdict"]
    lines.append(
        f"verdict: {'PASS' if v['pass'] else 'FAIL'} (p99 ratio {v['p99_ratio']})"
        + "".join(f"; {r}" for r in v["reasons"])
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = None if args.url else start_own_server(args)
    url = args.url or server.info["url"]  # type: ignore[union-attr]
    out: dict[str, Any] = {"config": dict(vars(args)), "url": url}
    try:
        out.update(asyncio.run(bench(url, args)))
    except Exception as exc:  # noqa: BLE001 - recorded with the server's log, then the exit code says so
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if server is not None:
            out["server_log"] = server.log_tail(20)
            server.stop()
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    if "error" in out:
        print(f"abuse_bench: the run failed: {out['error']} (server log in {args.out})", file=sys.stderr)
        return 3
    print("\n".join(summary_lines(out)))
    return 0 if out["verdict"]["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
