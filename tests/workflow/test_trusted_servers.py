"""A worker sends admin requests, and a token, only to servers it was told to trust
(gpuyantra/trusted_servers.py), never to a URL that came from workflow input alone."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.gpu as gpu
from activities.cpu import preflight_campaign
from gpuyantra.campaign.records import (
    BenchmarkInput,
    CampaignInput,
    CompareInput,
    DeployInput,
    RollbackInput,
    ServerCall,
)
from gpuyantra.commands.worker import trust_servers
from gpuyantra.processes import free_port
from gpuyantra.trusted_servers import remember_server, resolve, token_env

TOKEN = "the-real-admin-token"


class Listener(http.server.ThreadingHTTPServer):
    """Anyone's HTTP listener on 127.0.0.1: records every request and its Authorization header."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        listener = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                listener.seen.append((self.path, self.headers.get("Authorization")))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer = json.dumps({"targets": [], "tokens_per_s": 1.0, "rolled_back": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def listener(monkeypatch, tmp_path) -> Iterator[Listener]:
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUYANTRA_ADMIN_TOKEN", TOKEN)
    monkeypatch.delenv("GPUYANTRA_SERVERS", raising=False)
    monkeypatch.delenv("GPUYANTRA_SERVER_URL", raising=False)
    server = Listener()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def server_activities(url: str) -> list[tuple[Callable[..., Any], Any]]:
    """Every GPU activity that talks to a campaign's server, with an input naming `url`."""
    return [
        (gpu.profile_server, ServerCall(url)),
        (gpu.benchmark_server, BenchmarkInput(url, batches=[1])),
        (gpu.compare_swap, CompareInput(url, "swap-1")),
        (gpu.deploy_kernel, DeployInput(url, {"op": "rms_norm", "module_class": "X"}, "OP = 'rms_norm'")),
        (gpu.rollback_swap, RollbackInput(url, "swap-1")),
    ]


@pytest.mark.parametrize("index", range(5), ids=["profile", "benchmark", "compare", "deploy", "rollback"])
def test_an_untrusted_server_gets_no_request_and_no_token(listener, index):
    activity, call = server_activities(listener.url)[index]
    with pytest.raises(ApplicationError) as refused:
        ActivityEnvironment().run(activity, call)
    assert refused.value.type == "UntrustedServer" and refused.value.non_retryable
    assert f"gpuyantra worker --server NAME={listener.url}" in str(refused.value)
    assert listener.seen == []  # the token never left the worker


async def test_preflight_fails_a_campaign_naming_an_untrusted_server(listener):
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(preflight_campaign, CampaignInput(server_url=listener.url))
    assert refused.value.type == "UntrustedServer" and "\n" not in str(refused.value)
    assert listener.seen == []


def test_a_server_trusted_by_name_gets_its_own_token(listener, monkeypatch):
    trust_servers([f"gpu2={listener.url}"])
    monkeypatch.setenv(token_env("gpu2"), "gpu2-token")
    ActivityEnvironment().run(gpu.profile_server, ServerCall(listener.url.replace("127.0.0.1", "localhost")))
    assert listener.seen == [("/admin/profile", "Bearer gpu2-token")]
    assert resolve("gpu2").url == listener.url  # by name too


def test_a_server_registered_in_the_state_folder_is_trusted_with_its_token_file(listener, tmp_path):
    token_file = tmp_path / "other-token"
    token_file.write_text("file-token\n")
    remember_server("serve-9", listener.url, token_file)
    ActivityEnvironment().run(gpu.rollback_swap, RollbackInput(listener.url, "swap-1"))
    assert listener.seen == [("/admin/rollback", "Bearer file-token")]


def test_the_local_server_is_trusted_by_default_with_the_admin_token(listener, monkeypatch):
    assert resolve("http://127.0.0.1:8000").name == "local"
    assert resolve("http://localhost:8000/").token() == TOKEN
    monkeypatch.setenv("GPUYANTRA_SERVER_URL", listener.url)  # the worker's own setting moves `local`
    ActivityEnvironment().run(gpu.profile_server, ServerCall(listener.url))
    assert listener.seen == [("/admin/profile", f"Bearer {TOKEN}")]


@pytest.mark.parametrize("spec", ["gpu2", "=http://x:1", "gpu2=10.0.0.5:8000", "bad name=http://x:1"])
def test_worker_server_flag_takes_name_equals_url(spec, monkeypatch):
    monkeypatch.delenv("GPUYANTRA_SERVERS", raising=False)
    with pytest.raises(ValueError, match="--server takes NAME=URL"):
        trust_servers([spec])
