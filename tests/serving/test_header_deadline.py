"""A connection whose request headers do not arrive in time gets a 408 and is closed (a slow-loris
connection no longer holds a socket for as long as it likes); requests whose headers did arrive are
served however long they take, and a kept-alive connection's next request has its own deadline."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpuyantra.processes import free_port
from serving.header_deadline import with_header_deadline

DEADLINE_S = 0.5
SLOW_APP_S = 1.5  # longer than the deadline: a request being served is not cut
WAIT_S = 10.0  # bounded waits: far beyond the deadline


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(SLOW_APP_S)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.contextmanager
def serving(protocol: type) -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=protocol, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started
        yield port
    finally:
        server.should_exit = True
        thread.join(WAIT_S)


def read_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(WAIT_S)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def get(sock: socket.socket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    sock.settimeout(WAIT_S)
    data = b""
    while not data.endswith(b"ok"):
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    return data


PROTOCOLS = {"httptools": HttpToolsProtocol, "h11": H11Protocol}


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_headers_that_do_not_arrive_in_time_get_a_408_and_the_connection_closes(name: str) -> None:
    with serving(with_header_deadline(PROTOCOLS[name], DEADLINE_S)) as port:
        with socket.create_connection(("127.0.0.1", port)) as loris:
            loris.sendall(b"GET / HTTP/1.1\r\nHo")  # and nothing more
            started = time.monotonic()
            answer = read_until_closed(loris)
            assert time.monotonic() - started < WAIT_S
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b'"code": 408' in answer and b"--header-timeout" in answer


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_a_request_being_served_and_the_next_one_on_its_connection_are_not_cut(name: str) -> None:
    with serving(with_header_deadline(PROTOCOLS[name], DEADLINE_S)) as port:
        with socket.create_connection(("127.0.0.1", port)) as client:
            assert get(client, "/slow").startswith(b"HTTP/1.1 200 ")  # served for longer than the deadline
            time.sleep(DEADLINE_S / 2)
            assert get(client, "/").startswith(b"HTTP/1.1 200 ")  # its own deadline, not the first one's


def test_without_the_deadline_a_loris_holds_its_connection() -> None:
    """The control: plain uvicorn keeps the half-sent request open past the deadline."""
    with serving(HttpToolsProtocol) as port:
        with socket.create_connection(("127.0.0.1", port)) as loris:
            loris.sendall(b"GET / HTTP/1.1\r\nHo")
            loris.settimeout(DEADLINE_S * 4)
            with pytest.raises(TimeoutError):
                loris.recv(4096)
