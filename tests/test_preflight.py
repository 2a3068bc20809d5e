"""Preflight: a campaign that would deploy nothing is refused in a second, in one line naming the fix.

The server's `POST /admin/attestation-check` is called on the admin routes alone, no model loaded:
the check needs only the server's key."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from gpuyantra import attestation, preflight
from gpuyantra.cli import main
from gpuyantra.commands.optimize import failure_line, past_preflight
from gpuyantra.processes import free_port
from serving import routes_admin
from serving.auth import AdminAuth, AdminAuthMiddleware
from serving.metrics import Metrics
from serving.state import ServeConfig, ServerState
from tests.fake_servers import ReadyOnCpu, serving

TOKEN = "preflight-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def server_with_key(state: Path, **config: Any) -> TestClient:
    """The admin routes of a server whose key is in `state`, behind its token; no model is loaded
    (the check needs none)."""
    settings = ServeConfig(device="cpu", admin_token=TOKEN, state_dir=str(state), **config)
    app = FastAPI()
    app.state.server = ServerState(config=settings, metrics=Metrics(), attestation_key=attestation.load_key(state))
    app.state.admin_auth = AdminAuth(TOKEN)
    app.add_middleware(AdminAuthMiddleware, auth=app.state.admin_auth)
    routes_admin.add_routes(app)
    return TestClient(app)


def signed(key: bytes) -> dict[str, str]:
    nonce = "ab" * 16
    return {"nonce": nonce, "signature": attestation.sign_nonce(nonce, key), "key": attestation.fingerprint(key)}


@pytest.fixture
def server_key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(attestation.KEY_ENV, raising=False)
    return tmp_path / "server-state"


def test_the_same_key_is_accepted(server_key_dir: Path) -> None:
    client = server_with_key(server_key_dir)
    key = attestation.load_key(server_key_dir)
    answer = client.post("/admin/attestation-check", json=signed(key), headers=AUTH)
    assert answer.status_code == 200
    assert answer.json()["accepted"] is True and answer.json()["key"] == attestation.fingerprint(key)


def test_another_key_is_a_403_naming_the_servers_key(server_key_dir: Path, tmp_path: Path) -> None:
    client = server_with_key(server_key_dir)
    other = attestation.load_key(tmp_path / "worker-state")
    answer = client.post("/admin/attestation-check", json=signed(other), headers=AUTH)
    server_key = attestation.fingerprint(attestation.load_key(server_key_dir))
    assert answer.status_code == 403
    assert answer.json()["key"] == server_key and answer.json()["key_source"].endswith("attestation.key")
    assert server_key in answer.json()["detail"] and attestation.fingerprint(other) in answer.json()["detail"]


def test_the_check_needs_the_admin_token(server_key_dir: Path) -> None:
    client = server_with_key(server_key_dir)
    answer = client.post("/admin/attestation-check", json=signed(b"k"))
    assert answer.status_code == 401


def test_a_server_allowing_unverified_swaps_accepts_any_key(server_key_dir: Path) -> None:
    client = server_with_key(server_key_dir, allow_unverified_swaps=True)
    answer = client.post("/admin/attestation-check", json=signed(b"another key"), headers=AUTH)
    assert answer.status_code == 200 and answer.json()["unverified_swaps_allowed"] is True


def route_to(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preflight's HTTP calls go to the app in `client` (any host)."""

    def post(url: str, **kwargs: Any) -> Any:
        return client.post(url.split("://", 1)[1].partition("/")[2].join(["/", ""]), **kwargs)

    monkeypatch.setattr(
        preflight.httpx, "post", lambda url, json, headers, timeout: post(url, json=json, headers=headers)
    )


def test_mismatched_state_folders_are_one_line_naming_both_keys(
    server_key_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    route_to(server_with_key(server_key_dir), monkeypatch)
    worker_state = tmp_path / "worker-state"
    worker_key = attestation.load_key(worker_state)
    line = preflight.attestation_problem("http://server", TOKEN, worker_key, str(worker_state / "attestation.key"))
    assert line is not None and "\n" not in line
    assert attestation.fingerprint(worker_key) in line
    assert attestation.fingerprint(attestation.load_key(server_key_dir)) in line
    assert "same --state-dir" in line and attestation.KEY_ENV in line
    same = preflight.attestation_problem("http://server", TOKEN, attestation.load_key(server_key_dir), "here")
    assert same is None


def test_a_worker_checks_with_the_trusted_servers_own_token(
    server_key_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """campaign_problems as preflight_campaign calls it: the server's token from its registration,
    the worker's key from its own state folder (here another one: one line naming both keys)."""
    route_to(server_with_key(server_key_dir), monkeypatch)
    worker_state = tmp_path / "worker-state"
    (worker_state / "servers").mkdir(parents=True)
    (tmp_path / "token").write_text(TOKEN)
    registration = {"url": "http://server.test:9", "token_file": str(tmp_path / "token")}
    (worker_state / "servers" / "gpu1.json").write_text(json.dumps(registration))
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(worker_state))
    monkeypatch.delenv("GPUYANTRA_ADMIN_TOKEN", raising=False)
    [line] = preflight.campaign_problems("http://server.test:9", 1, None)
    assert "would refuse every swap" in line and str(worker_state / "attestation.key") in line


def test_a_wrong_token_is_named(server_key_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    route_to(server_with_key(server_key_dir), monkeypatch)
    line = preflight.attestation_problem("http://server", "wrong", b"k", "here")
    assert line is not None and "GPUYANTRA_ADMIN_TOKEN" in line


def test_an_unreachable_server_is_left_to_the_reachability_check() -> None:
    assert preflight.attestation_problem(f"http://127.0.0.1:{free_port()}", TOKEN, b"k", "here") is None


def test_a_cpu_cannot_score_min_reward_3() -> None:
    line = preflight.reward_problem("cpu", None, 3)
    assert line is not None and "--min-reward 1" in line and "GPU" in line
    assert preflight.reward_problem("cpu", None, 1) is None
    assert preflight.reward_problem("cuda", None, 3) is None
    assert preflight.reward_problem("cuda", "cpu", 2) is not None  # verified on the CPU: +1 at most
    assert preflight.reward_problem(None, None, 3) is None  # unknown: the campaign's verdicts will tell


def test_preflight_refusals_are_one_line() -> None:
    cause = ApplicationError("preflight_campaign failed: x would refuse every swap; fix", type="PreflightFailed")
    failure = WorkflowFailureError(cause=cause)
    assert failure_line(failure) == "x would refuse every swap; fix"


# ------------------------------------------------------------------------------- optimize, in-process


@pytest.fixture
def cpu_server() -> Iterator[str]:
    with serving(ReadyOnCpu) as url:
        yield url


def test_optimize_on_a_cpu_server_with_min_reward_3_says_what_to_use(
    cpu_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["optimize", "--server", cpu_server, "--ops", "rms_norm"]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("gpuyantra optimize: min_reward 3 deploys nothing here: the server runs on the CPU")
    assert "use --min-reward 1 or serve on a GPU" in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--server", "127.0.0.1:8000"],
            "argument --server: '127.0.0.1:8000' has no scheme: give http://127.0.0.1:8000",
        ),
        (["--server", "http://127.0.0.1:1", "--ops", ""], "argument --ops: no op names given"),
        (["--server", "http://127.0.0.1:1", "--ops", " , "], "argument --ops: no op names given"),
    ],
)
def test_optimize_usage_errors_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["optimize", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


class Handle:
    """A campaign's handle as `past_preflight` reads it: its status, its progress, its result."""

    def __init__(self, stages: list[str], failure: BaseException | None = None) -> None:
        self.stages, self.failure = stages, failure

    async def describe(self) -> Any:
        from temporalio.client import WorkflowExecutionStatus

        running = self.failure is None or len(self.stages) > 1
        return type("Described", (), {"status": WorkflowExecutionStatus.RUNNING if running else "failed"})()

    async def query(self, name: str) -> dict[str, Any]:
        stage = self.stages.pop(0) if len(self.stages) > 1 else self.stages[0]
        return {"stage": stage}

    async def result(self) -> Any:
        if self.failure is not None:
            raise self.failure
        return {}


def test_optimize_without_wait_returns_once_past_the_preflight() -> None:
    handle = Handle(["preflight", "preflight", "profile"])
    asyncio.run(past_preflight(handle, within_s=10))  # type: ignore[arg-type]
    assert handle.stages == ["profile"]


def test_optimize_without_wait_raises_the_preflight_refusal() -> None:
    refused = WorkflowFailureError(cause=ApplicationError("x would refuse every swap", type="PreflightFailed"))
    with pytest.raises(WorkflowFailureError):
        asyncio.run(past_preflight(Handle(["preflight"], refused), within_s=10))  # type: ignore[arg-type]
