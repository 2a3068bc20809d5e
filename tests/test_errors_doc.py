"""Every command-line row of docs/errors.md, run as a subprocess: exit code and the one stderr line."""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyantra.cli import main
from tests.errors_table import matches, rows
from tests.fake_servers import Healthy, ReadyOnCpu, serving

HANG_GUARD_S = 120  # generous: each case answers in seconds; this only stops a hang


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serving(Healthy) as url:
        yield url


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


def test_every_in_process_row(server: str, tmp_path: Path) -> None:
    """The rows under "Checked in-process", through `gpuyantra.cli.main` in this process."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with serving(ReadyOnCpu) as cpu_server, socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        places = {
            "$SERVER": server,
            "$CPU_SERVER": cpu_server,
            "$EMPTY_DIR": str(empty.resolve()),
            "$BUSY_PORT": str(busy.getsockname()[1]),
        }

        def fill(text: str) -> str:
            for name, value in places.items():
                text = text.replace(name, value)
            return text

        cases = rows("Checked in-process")
        assert len(cases) >= 7
        for command, code, message in cases:
            argv = shlex.split(fill(command))
            assert argv[0] == "gpuyantra"
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                try:
                    exit_code = main(argv[1:])
                except SystemExit as exited:  # argparse's usage errors
                    exit_code = int(exited.code or 0)
            lines = stderr.getvalue().strip().splitlines()
            assert exit_code == int(code), (command, stderr.getvalue()[-2000:])
            assert len(lines) == 1 and matches(fill(message), lines[0]), (command, stderr.getvalue()[-2000:])
