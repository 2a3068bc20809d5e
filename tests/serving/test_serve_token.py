"""`gpuyantra serve`'s admin token comes from a file or the environment (a token on the command line is
shown to every user by `ps`: a warning), and a server on another port than the workers' default
registers itself with the state folder's workers while it runs."""

from __future__ import annotations

import argparse
import json
import signal
import time

import httpx
import pytest

from gpuyantra.commands.serve import ADMIN_TOKEN_ON_COMMAND_LINE, admin_token_of, request_limits_of
from tests.serving.helpers import ServerProcess


def flags(**given) -> argparse.Namespace:
    defaults = {"admin_token": None, "admin_token_file": None, "max_body_bytes": None, "max_choices": None}
    return argparse.Namespace(**{**defaults, "max_prompt_tokens": None, "max_client_requests": None, **given})


def test_the_token_file_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUYANTRA_ADMIN_TOKEN", "from-env")
    (tmp_path / "token").write_text("from-file\n")
    assert admin_token_of(flags(admin_token_file=str(tmp_path / "token"))) == "from-file"
    assert admin_token_of(flags()) == "from-env"


@pytest.mark.parametrize("content, why", [(None, "cannot read --admin-token-file"), ("\n", "is empty")])
def test_an_unusable_token_file_is_one_line(tmp_path, content, why):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=why):
        admin_token_of(flags(admin_token_file=str(path)))


def test_a_token_on_the_command_line_gets_a_warning(capsys):
    assert admin_token_of(flags(admin_token="visible-in-ps")) == "visible-in-ps"
    assert capsys.readouterr().err.strip() == ADMIN_TOKEN_ON_COMMAND_LINE


def test_limit_flags_below_one_are_refused():
    with pytest.raises(ValueError, match="--max-choices must be at least 1"):
        request_limits_of(flags(max_choices=0))
    assert request_limits_of(flags(max_body_bytes=10)).max_body_bytes == 10
    with pytest.raises(ValueError, match=r"--max-client-requests must be 0 \(no limit\) or more"):
        request_limits_of(flags(max_client_requests=-1))
    assert request_limits_of(flags(max_client_requests=0)).max_client_requests == 0  # no limit
    assert request_limits_of(flags()).max_client_requests == 32


def test_a_server_takes_its_token_from_a_file_and_registers_while_it_runs(tmp_path):
    token_file = tmp_path / "admin-token"
    token_file.write_text("file-token")
    state = tmp_path / "state"
    state.mkdir()
    server = ServerProcess(state, tmp_path / "server.log", "--admin-token-file", str(token_file), token="env-token")
    try:
        server.wait_ready()
        assert (
            httpx.get(server.url + "/admin/kernels", headers={"Authorization": "Bearer file-token"}).status_code == 200
        )
        assert (
            httpx.get(server.url + "/admin/kernels", headers={"Authorization": "Bearer env-token"}).status_code == 401
        )
        registration = state / "servers" / f"serve-{server.port}.json"
        assert json.loads(registration.read_text()) == {"url": server.url, "token_file": str(token_file.resolve())}
    finally:
        server.kill(signal.SIGTERM)
    for _ in range(50):  # bounded: the registration goes as serve stops
        if not registration.exists():
            break
        time.sleep(0.1)
    assert not registration.exists()
