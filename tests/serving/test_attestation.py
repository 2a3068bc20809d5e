"""`POST /admin/swap` swaps only bytes the verifier attested: every other request is a 403 that
changes nothing (no active swap, same served tokens, no kept file), unless the server was started
with `--allow-unverified-swaps`, which swaps with a warning."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi.testclient import TestClient

from serving.app import create_app
from tests.serving.candidates import SYNTAX_ERROR, rms_norm_source
from tests.serving.helpers import RMS_NORM_KERNEL, TOKEN, attested, metric_value, tiny_cpu_config
from tests.serving.test_app import wait_ready

AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROMPT = "attested swaps only"
SOURCE = rms_norm_source()


def make_client(state, **config) -> TestClient:
    return TestClient(create_app(tiny_cpu_config(state, **config)))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("attested-state")) as c:
        wait_ready(c)
        yield c


def kept_files(client: TestClient) -> set[str]:
    return {p.name for p in client.app.state.server.engine.swaps.swaps_dir.glob("*.py")}


def tokens(client: TestClient) -> list[int]:
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "temperature": 0})
    return r.json()["choices"][0]["token_ids"]


def assert_refused(client: TestClient, body: dict, reason: str) -> None:
    """403 with the app's swap-error body, and nothing changed: no active swap, same tokens, no kept file."""
    want, kept = tokens(client), kept_files(client)
    forbidden = metric_value(client.get("/metrics").text, "gpuyantra_swaps_total", 'result="forbidden"')
    r = client.post("/admin/swap", json=body, headers=AUTH)
    assert r.status_code == 403, r.text
    assert r.json() == {"detail": {"status": "forbidden", "reason": reason}}
    assert client.get("/admin/kernels", headers=AUTH).json()["active"] == []
    assert tokens(client) == want
    assert kept_files(client) == kept
    assert metric_value(client.get("/metrics").text, "gpuyantra_swaps_total", 'result="forbidden"') == forbidden + 1


def test_attested_source_and_path_are_swapped(client, tmp_path):
    # The control: the same requests as the refusals below, attested right, do swap.
    path = tmp_path / "rms_norm_candidate.py"
    path.write_text(SOURCE)
    for body in ({"source": SOURCE}, {"path": str(path)}):
        r = client.post("/admin/swap", json={**body, "attestation": attested(SOURCE)}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "committed"
        r = client.post("/admin/rollback", json={"all": True}, headers=AUTH)
        assert r.status_code == 200 and r.json()["active"] == []


def test_unattested_swap_is_refused(client):
    assert_refused(
        client,
        {"source": SOURCE},
        "no attestation: start the server with --allow-unverified-swaps to swap unverified kernels",
    )
    assert_refused(
        client,
        {"path": str(RMS_NORM_KERNEL)},
        "no attestation: start the server with --allow-unverified-swaps to swap unverified kernels",
    )


def test_bytes_edited_after_attestation_are_refused(client, tmp_path):
    proof = attested(SOURCE)
    edited = SOURCE.replace("SCALE = 1.0", "SCALE = 1.5")
    assert len(edited) == len(SOURCE) and sum(a != b for a, b in zip(edited, SOURCE)) == 1
    assert_refused(client, {"source": edited, "attestation": proof}, "source digest does not match the attested digest")
    path = tmp_path / "candidate.py"
    path.write_text(SOURCE)
    path.write_text(edited)  # the file changed on disk between verification and the swap
    assert_refused(
        client, {"path": str(path), "attestation": proof}, "source digest does not match the attested digest"
    )


def test_attested_bytes_python_would_read_differently_never_run(client, tmp_path):
    """Even validly signed, a file whose coding declaration makes Python read other code than the
    checker saw (here a hidden line that leaves a mark) is not imported: 422, nothing swapped."""
    mark = tmp_path / "hidden-code-ran"
    hidden = "# -*- coding: raw_unicode_escape -*-\n" + SOURCE.replace(
        "\ndef ", f"\n# checked as a comment \\u000aopen({str(mark)!r}, 'w').write('ran')\ndef ", 1
    )
    kept = kept_files(client)
    r = client.post("/admin/swap", json={"source": hidden, "attestation": attested(hidden)}, headers=AUTH)
    assert r.status_code == 422, r.text
    assert "raw_unicode_escape" in r.text
    assert not mark.exists() and kept_files(client) == kept
    assert client.get("/admin/kernels", headers=AUTH).json()["active"] == []


def test_forged_attestations_are_refused(client):
    assert_refused(
        client,
        {"source": SOURCE, "attestation": attested(SOURCE, key=b"some other key")},
        "attestation signature invalid",
    )
    tampered = {**attested(SOURCE, reward=-1), "reward": 1}  # a rejected verdict's record, promoted
    assert_refused(client, {"source": SOURCE, "attestation": tampered}, "attestation signature invalid")


@pytest.mark.parametrize(
    "proof, reason",
    [
        (dict(reward=-1), "attested reward -1 is not accepted"),
        (dict(device="cuda"), "attested on cuda, server runs on cpu"),
        (dict(op="silu_mul"), "attested op 'silu_mul' is not the candidate's OP 'rms_norm'"),
    ],
)
def test_validly_signed_but_wrong_records_are_refused(client, proof, reason):
    assert_refused(client, {"source": SOURCE, "attestation": attested(SOURCE, **proof)}, reason)


def test_openapi_declares_the_403_and_the_attestation(client):
    spec = client.get("/openapi.json").json()
    swap = spec["paths"]["/admin/swap"]["post"]
    assert "403" in swap["responses"]
    schemas = spec["components"]["schemas"]
    assert set(schemas["Attestation"]["properties"]) == {"digest", "op", "reward", "device", "signature"}
    assert all(p.get("description") for p in schemas["Attestation"]["properties"].values())
    assert "attestation" in schemas["SwapBody"]["properties"]


def test_allow_unverified_swaps_swaps_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="gpuyantra.serving")
    with make_client(tmp_path, allow_unverified_swaps=True) as c:
        wait_ready(c)
        assert any("UNVERIFIED SWAPS ALLOWED" in m for m in caplog.messages)
        caplog.clear()
        r = c.post("/admin/swap", json={"source": SOURCE}, headers=AUTH)
        assert r.status_code == 200 and r.json()["status"] == "committed", r.text
        assert any("UNVERIFIED SWAP" in m and "no attestation" in m for m in caplog.messages)
        caplog.clear()
        r = c.post("/admin/swap", json={"source": SOURCE, "attestation": attested(SOURCE, key=b"other")}, headers=AUTH)
        assert r.status_code == 200, r.text
        assert any("attestation signature invalid" in m for m in caplog.messages)
        caplog.clear()
        r = c.post("/admin/swap", json={"source": SOURCE, "attestation": attested(SOURCE)}, headers=AUTH)
        assert r.status_code == 200 and not any("UNVERIFIED" in m for m in caplog.messages)
        # The swap engine's own checks still hold: a candidate that does not load is a 422.
        r = c.post("/admin/swap", json={"source": SYNTAX_ERROR}, headers=AUTH)
        assert r.status_code == 422
        detail = r.json()["detail"]
        assert detail["status"] == "invalid_candidate" and "SyntaxError" in detail["reason"]


@pytest.mark.integration
def test_serve_flag_allows_unverified_swaps(start_server):
    server = start_server(None, "--allow-unverified-swaps")
    with httpx.Client(base_url=server.url, timeout=120, headers=server.admin) as admin:
        r = admin.post("/admin/swap", json={"path": str(RMS_NORM_KERNEL)})
        assert r.status_code == 200, r.text
    log = server.log_tail(20000)
    assert "UNVERIFIED SWAPS ALLOWED" in log and "UNVERIFIED SWAP (--allow-unverified-swaps): no attestation" in log
