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


def _first_bytes_sent_to_a_listener(connect) -> bytes:
    """What a client sends first to a loopback listener that answers nothing: a TLS handshake starts
    with the record type 0x16, plain gRPC with HTTP/2's preface."""
    import asyncio
    import socket
    import threading

    received: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(10)

        def accept_once() -> None:
            # A client may first probe the port (connect, send nothing, close): the first bytes of
            # the first connection that sends any are what the SDK said.
            while not received:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    conn.settimeout(5)
                    try:
                        first = conn.recv(16)
                    except OSError:
                        continue
                    if first:
                        received.append(first)

        listener = threading.Thread(target=accept_once, daemon=True)
        listener.start()
        with pytest.raises(Exception):  # noqa: B017 - refused, timed out: the listener answers nothing
            asyncio.run(connect(f"127.0.0.1:{server.getsockname()[1]}"))
        listener.join(timeout=10)
    return received[0] if received else b""


def test_the_verify_and_campaign_clients_speak_tls_with_an_api_key(monkeypatch):
    from gpuyantra import campaign_client, verify_client

    monkeypatch.setattr(verify_client, "CONNECT_WITHIN_S", 3.0)
    monkeypatch.setenv("TEMPORAL_API_KEY", "key-1")
    assert _first_bytes_sent_to_a_listener(verify_client._connect)[:1] == b"\x16"
    assert _first_bytes_sent_to_a_listener(lambda a: campaign_client.connect(a, within_s=3.0))[:1] == b"\x16"
    monkeypatch.delenv("TEMPORAL_API_KEY")
    assert _first_bytes_sent_to_a_listener(verify_client._connect).startswith(b"PRI * HTTP/2.0")
