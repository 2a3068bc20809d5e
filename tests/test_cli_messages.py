"""Messages of the command line that point the right way, run in-process (no interpreter per case):
--version, a closed stdout, verify on no file, serve on a busy port, status finding its servers."""

from __future__ import annotations

import argparse
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyantra import cli
from gpuyantra.cli import main
from gpuyantra.processes import free_port
from tests.fake_servers import ReadyOnCpu, serving


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == "gpuyantra 0.1.0"


def test_a_closed_stdout_ends_quietly(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def reader_went_away(argv: list[str]) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "run", reader_went_away)
    assert main(["status"]) == cli.BROKEN_PIPE_EXIT
    assert capsys.readouterr().err == ""


def test_run_leaves_a_broken_pipe_to_main(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the one-line `BrokenPipeError: ...` of an unexpected error."""
    parser = cli.build_parser()

    def print_to_a_closed_pipe(args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    parsed = argparse.Namespace(command="status", debug=False, handler=print_to_a_closed_pipe)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv: parsed)
    with pytest.raises(BrokenPipeError):
        cli.run(["status"])


@pytest.mark.parametrize("name", ["missing.py", "."])
def test_verify_without_a_file_is_a_usage_error(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["verify", name]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"gpuyantra verify: {name}")


def test_serve_on_a_busy_port_fails_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        assert main(["serve", "--device", "cpu", "--port", str(port)]) == 2
        assert time.monotonic() - started < 5  # no model was loaded
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"gpuyantra serve: cannot listen on 127.0.0.1:{port}: Address already in use")
    assert err.endswith("stop it or pick another --port")


@pytest.fixture
def ready_server() -> Iterator[str]:
    with serving(ReadyOnCpu) as url:
        yield url


def test_status_finds_the_servers_of_its_state_folder(
    ready_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUYANTRA_SERVER_URL", f"http://127.0.0.1:{free_port()}")  # nothing there
    (tmp_path / "servers").mkdir()
    (tmp_path / "servers" / "serve-1.json").write_text(json.dumps({"url": ready_server}))
    main(["status", "--temporal", f"127.0.0.1:{free_port()}", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert [s["url"] for s in summary["servers"]][1:] == [ready_server]
    assert summary["server"]["url"] == ready_server and summary["server"]["model"] == "tiny-qwen2"
