"""Stand-ins for a serving process, for command-line tests: HTTP on a free loopback port."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator

from gpuyantra.processes import free_port


class Healthy(http.server.BaseHTTPRequestHandler):
    """Answers GET /healthz 200, which is all `optimize` asks first; 404 to the rest."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class ReadyOnCpu(Healthy):
    """/healthz, and /readyz saying a tiny-qwen2 model is ready on the CPU."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path != "/readyz":
            return super().do_GET()
        body = {"status": "ready", "model": "tiny-qwen2", "device": "cpu", "active_swaps": []}
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """The URL of `handler` served on a free port, for the block's duration."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
