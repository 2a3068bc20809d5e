"""A deadline for a request's headers. uvicorn has none: a client that sends its headers a byte at a
time (a slow-loris connection) holds a socket and a protocol object for as long as it likes, and
enough of them exhaust the server's file descriptors. Here every connection must complete a
request's headers within `seconds` of connecting, and each later request within `seconds` of the
previous response; past that the server answers 408 in the OpenAI error shape and closes.

Works over whichever uvicorn HTTP protocol class is in use (`httptools`, `h11`): both keep the
request being served as `self.cycle` (set once its headers are parsed) and call
`on_response_complete` when its response is sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

DEFAULT_HEADER_TIMEOUT_S = 30.0  # generous for any real client over a slow link; a loris is not one


def timeout_response(seconds: float) -> bytes:
    """The raw 408 a connection gets when its headers did not arrive in time (the app never saw it)."""
    message = f"the request headers did not arrive within {seconds:g} s (gpuyantra serve --header-timeout)"
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "code": 408}, "detail": message})
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body.encode()


def with_header_deadline(base: type[Any], seconds: float) -> type[asyncio.Protocol]:
    """`base` (a uvicorn HTTP protocol class) that closes a connection whose request headers take
    longer than `seconds`."""

    class HeaderDeadlineProtocol(base):
        _headers_due: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_deadline()  # the next request on this connection has its own deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)

        def _arm_header_deadline(self) -> None:
            self._disarm_header_deadline()
            self._headers_due = self.loop.call_later(seconds, self._headers_late)

        def _disarm_header_deadline(self) -> None:
            if self._headers_due is not None:
                self._headers_due.cancel()
                self._headers_due = None

        def _headers_late(self) -> None:
            self._headers_due = None
            if self.cycle is not None and not self.cycle.response_complete:
                return  # this request's headers arrived: it is being served
            if self.transport.is_closing():
                return
            self.transport.write(timeout_response(seconds))
            self.transport.close()

    HeaderDeadlineProtocol.__name__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadlineProtocol


def http_protocol(seconds: float) -> type[asyncio.Protocol] | str:
    """What `uvicorn.Config(http=...)` takes: uvicorn's own choice with the deadline around it, or
    that choice untouched when `seconds` is 0 (no deadline)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return with_header_deadline(AutoHTTPProtocol, seconds) if seconds > 0 else "auto"
