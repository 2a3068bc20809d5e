"""Attestations: the verifier's signed word that it accepted exactly these source bytes.

A record is `{"digest", "op", "reward", "device", "signature"}`: `digest` is the SHA-256 of the
candidate file's bytes and `signature` an HMAC-SHA256 over the canonical JSON of the other four,
under a key shared by the workers (which verify and sign) and the serving process (which checks
before it swaps). The server recomputes the digest from the bytes it is about to import, so an
edited file, a forged record or a rejected verdict cannot be swapped in.

The key: `$GPUYANTRA_ATTESTATION_KEY` when set, else `<state dir>/attestation.key`, 32 random
bytes made owner-only on first use. Processes of one machine share it through the state folder.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuyantra.candidate import read_op
from gpuyantra.rewards import REWARD_ACCEPTED

KEY_ENV = "GPUYANTRA_ATTESTATION_KEY"
KEY_FILE = "attestation.key"


def source_sha256(source: str | bytes) -> str:
    """SHA-256 (hex) of the source's UTF-8 bytes: the bytes on disk for a file read by `read_source`."""
    return hashlib.sha256(source.encode() if isinstance(source, str) else source).hexdigest()


def load_key(state: Path | None = None) -> bytes:
    """The shared key: the environment's, else the state folder's file (created on first use)."""
    if os.environ.get(KEY_ENV):
        return os.environ[KEY_ENV].encode()
    if state is None:
        from gpuyantra.config import state_dir

        state = state_dir()
    path = Path(state) / KEY_FILE
    if not path.exists():
        _create_key(path)
    key = path.read_bytes()
    if not key:
        raise ValueError(f"{path} is empty: delete it (a new key is made) or set {KEY_ENV}")
    return key


def _create_key(path: Path) -> None:
    # Written aside and linked into place: processes starting together (a worker and the server)
    # end up with the one key that landed first, and nobody reads a half-written file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def sign(digest: str, op: str, reward: int, device: str, key: bytes | None = None) -> str:
    """HMAC-SHA256 (hex) of the canonical JSON of {digest, op, reward, device}."""
    payload = json.dumps(
        {"digest": digest, "op": op, "reward": reward, "device": device}, sort_keys=True, separators=(",", ":")
    ).encode()
    return hmac.new(key if key is not None else load_key(), payload, hashlib.sha256).hexdigest()


def record(digest: str, op: str, reward: int, device: str, key: bytes | None = None) -> dict[str, Any]:
    """The attestation object a verdict carries and `POST /admin/swap` takes."""
    return {
        "digest": digest,
        "op": op,
        "reward": reward,
        "device": device,
        "signature": sign(digest, op, reward, device, key),
    }


def check(source: bytes, attested: Mapping[str, Any], device: str, key: bytes | None = None) -> str | None:
    """Why `source` may not be swapped on `device` under `attested` (None: it may)."""
    if not _same(source_sha256(source), attested["digest"]):
        return "source digest does not match the attested digest"
    expected = sign(attested["digest"], attested["op"], attested["reward"], attested["device"], key)
    if not _same(expected, attested["signature"]):
        return "attestation signature invalid"
    if attested["reward"] < REWARD_ACCEPTED:
        return f"attested reward {attested['reward']} is not accepted"
    if attested["device"] != device:
        return f"attested on {attested['device']}, server runs on {device}"
    op = read_op(source.decode("utf-8", errors="replace"))
    if op != attested["op"]:
        return f"attested op {attested['op']!r} is not the candidate's OP {op!r}"
    return None


def _same(a: str, b: str) -> bool:
    # Bytes, so a non-ASCII string from a client is a mismatch rather than a TypeError.
    return hmac.compare_digest(str(a).encode(), str(b).encode())


# ------------------------------------------------------------------------------- key check
# Before a campaign spends time verifying, its preflight asks the server whether it would accept this
# worker's attestations: it signs a fresh nonce with its key, and `POST /admin/attestation-check`
# answers 200 when the server's key gives the same signature, 403 otherwise. Both sides name their
# key by its fingerprint, never by the key itself.
NONCE_CONTEXT = b"gpuyantra attestation-check:"


def fingerprint(key: bytes) -> str:
    """16 hex digits naming a key (a SHA-256 of it, so the key cannot be read back from it)."""
    return hashlib.sha256(b"gpuyantra key fingerprint:" + key).hexdigest()[:16]


def key_source(state: Path | None = None) -> str:
    """Where `load_key` takes the key from: the environment variable, or the state folder's file."""
    if os.environ.get(KEY_ENV):
        return f"${KEY_ENV}"
    if state is None:
        from gpuyantra.config import state_dir

        state = state_dir()
    return str(Path(state) / KEY_FILE)


def sign_nonce(nonce: str, key: bytes) -> str:
    """HMAC-SHA256 (hex) of a check's nonce, apart from attestations' payloads by its context."""
    return hmac.new(key, NONCE_CONTEXT + nonce.encode(), hashlib.sha256).hexdigest()


def nonce_signed_with(nonce: str, signature: str, key: bytes) -> bool:
    return _same(sign_nonce(nonce, key), signature)
