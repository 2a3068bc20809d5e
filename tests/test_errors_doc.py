"""Every command-line row of docs/errors.md, run as a subprocess: exit code and the one stderr line."""

from __future__ import annotations

import concurrent.futures
import http.server
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyantra.processes import free_port
from tests.errors_table import matches, rows

HANG_GUARD_S = 120  # generous: each case answers in seconds; this only stops a hang


class Healthy(http.server.BaseHTTPRequestHandler):
    """Stands in for `$SERVER`: answers GET /healthz 200, which is all `optimize` asks first."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Healthy)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_every_command_line_row(server: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    places = {"$SERVER": server, "$EMPTY_DIR": str(empty.resolve())}

    def fill(text: str) -> str:
        for name, value in places.items():
            text = text.replace(name, value)
        return text

    cases = rows("Command line")
    assert len(cases) >= 9

    def run(row: list[str]) -> tuple[list[str], subprocess.CompletedProcess]:
        argv = shlex.split(fill(row[0]))
        assert argv[0] == "gpuyantra"
        return row, subprocess.run(
            [sys.executable, "-m", "gpuyantra.cli", *argv[1:]],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            stdin=subprocess.DEVNULL,
        )

    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:  # in parallel: wall time of the slowest
        results = list(pool.map(run, cases))
    for (command, code, message), result in results:
        lines = result.stderr.strip().splitlines()
        assert result.returncode == int(code), (command, result.stderr[-2000:])
        assert len(lines) == 1 and matches(fill(message), lines[0]), (command, result.stderr[-2000:])
        assert "Traceback" not in result.stdout + result.stderr


def test_debug_anywhere_on_the_line_shows_the_traceback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuyantra.cli", "skills", "list", "--qdrant-url", "http://127.0.0.1:1", "--debug"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 1 and "Traceback" in result.stderr
