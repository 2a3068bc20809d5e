"""Temporal's own protection for gpuyantra's clients (workers, CLI, dashboard): TLS and API keys.

Read from the variables the `temporal` CLI reads, so one environment serves both:
`TEMPORAL_TLS_CERT` and `TEMPORAL_TLS_KEY` (a client certificate and key, files: mutual TLS),
`TEMPORAL_TLS_CA` (the server's CA, a file; default: the system's roots), `TEMPORAL_TLS_SERVER_NAME`,
`TEMPORAL_TLS=true` (TLS without a client certificate) and `TEMPORAL_API_KEY` (sent as a bearer
token, over TLS). None set: plain gRPC, as `gpuyantra up`'s loopback-only dev server expects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

TLS_ENV = ("TEMPORAL_TLS_CERT", "TEMPORAL_TLS_KEY", "TEMPORAL_TLS_CA", "TEMPORAL_TLS_SERVER_NAME")


def _file(name: str) -> bytes | None:
    path = os.environ.get(name)
    if not path:
        return None
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ValueError(f"${name}={path}: cannot read it: {exc.strerror}") from None


def connect_options() -> dict[str, Any]:
    """`Client.connect` keyword arguments for TLS and an API key; {} when none is configured.
    ValueError naming the variable when a file cannot be read or the pair is incomplete."""
    from temporalio.service import TLSConfig

    cert, key = _file("TEMPORAL_TLS_CERT"), _file("TEMPORAL_TLS_KEY")
    if (cert is None) != (key is None):
        raise ValueError("$TEMPORAL_TLS_CERT and $TEMPORAL_TLS_KEY go together: set both or neither")
    api_key = os.environ.get("TEMPORAL_API_KEY") or None
    wants_tls = os.environ.get("TEMPORAL_TLS", "").lower() in ("1", "true", "yes")
    if not (wants_tls or api_key or any(os.environ.get(name) for name in TLS_ENV)):
        return {}
    tls = TLSConfig(
        server_root_ca_cert=_file("TEMPORAL_TLS_CA"),
        client_cert=cert,
        client_private_key=key,
        domain=os.environ.get("TEMPORAL_TLS_SERVER_NAME") or None,
    )
    return {"tls": tls, **({"api_key": api_key} if api_key else {})}
