"""The admin token (serving/auth.py) without a model: compared once per request, in one place, and
still enforced on an admin route mounted on an app without the middleware."""

from __future__ import annotations

import hmac

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from serving import auth
from serving.app import ServeConfig, create_app
from serving.auth import AdminAuth, require_admin

TOKEN = "secret-token"


@pytest.mark.parametrize(
    "token, header, reason",
    [
        (TOKEN, f"Bearer {TOKEN}", None),
        (TOKEN, f"bearer  {TOKEN} ", None),
        (TOKEN, None, "missing or wrong bearer token"),
        (TOKEN, TOKEN, "missing or wrong bearer token"),
        (TOKEN, "Bearer wrong", "missing or wrong bearer token"),
        (None, f"Bearer {TOKEN}", "the admin API is disabled"),
    ],
)
def test_denial(token, header, reason):
    got = AdminAuth(token).denial(header)
    assert got == reason if reason is None else got.startswith(reason)


def test_the_token_is_compared_once_per_request(tmp_path, monkeypatch):
    calls: list[bytes] = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append(a)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    # No `with`: the model is never loaded, so an authenticated request ends in a 503 after the check.
    client = TestClient(create_app(ServeConfig(device="cpu", admin_token=TOKEN, state_dir=str(tmp_path))))
    r = client.get("/admin/kernels", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 503 and len(calls) == 1
    r = client.post("/admin/swap", content=b"{not json", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and len(calls) == 2


def test_the_dependency_checks_the_token_where_the_middleware_is_missing():
    app = FastAPI()
    app.state.admin_auth = AdminAuth(TOKEN)
    app.add_api_route("/admin/ping", lambda: {"ok": True}, methods=["GET"], dependencies=[Depends(require_admin)])
    client = TestClient(app)
    r = client.get("/admin/ping")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert client.get("/admin/ping", headers={"Authorization": f"Bearer {TOKEN}"}).json() == {"ok": True}
