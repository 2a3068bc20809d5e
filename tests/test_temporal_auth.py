"""Temporal's own protection for gpuyantra's clients: TLS and an API key from the temporal CLI's variables."""

from __future__ import annotations

import pytest

from gpuyantra.cli import main
from gpuyantra.temporal_auth import TLS_ENV, connect_options


@pytest.fixture(autouse=True)
def no_temporal_auth(monkeypatch):
    for name in (*TLS_ENV, "TEMPORAL_TLS", "TEMPORAL_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_plain_grpc_without_settings():
    assert connect_options() == {}


def test_an_api_key_goes_over_tls(monkeypatch):
    monkeypatch.setenv("TEMPORAL_API_KEY", "key-1")
    options = connect_options()
    assert options["api_key"] == "key-1" and options["tls"].client_cert is None


def test_mutual_tls_reads_the_pair(monkeypatch, tmp_path):
    (tmp_path / "c.pem").write_bytes(b"CERT")
    (tmp_path / "k.pem").write_bytes(b"KEY")
    monkeypatch.setenv("TEMPORAL_TLS_CERT", str(tmp_path / "c.pem"))
    monkeypatch.setenv("TEMPORAL_TLS_KEY", str(tmp_path / "k.pem"))
    tls = connect_options()["tls"]
    assert (tls.client_cert, tls.client_private_key) == (b"CERT", b"KEY")


def test_a_worker_with_half_a_pair_stops_with_one_line(monkeypatch, tmp_path, capsys):
    (tmp_path / "c.pem").write_bytes(b"CERT")
    monkeypatch.setenv("TEMPORAL_TLS_CERT", str(tmp_path / "c.pem"))
    assert main(["worker", "cpu", "--temporal", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gpuyantra worker: $TEMPORAL_TLS_CERT and $TEMPORAL_TLS_KEY go together: set both or neither"
    )
