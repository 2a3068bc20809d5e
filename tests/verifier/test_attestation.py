"""The verdict's `source_sha256` and `attestation`, and the shared key behind the attestation."""

from __future__ import annotations

import hashlib
import json
import stat

from gpuyantra import attestation
from gpuyantra.verifier import run_verification
from tests.verifier.conftest import candidate_path


def test_accepted_verdict_carries_digest_and_a_valid_attestation():
    path = candidate_path("honest_rowwise")
    verdict = run_verification(path, device="cpu", seeds=[0])
    assert verdict.accepted, verdict.failures
    data = json.loads(json.dumps(verdict.to_dict()))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert data["source_sha256"] == digest
    keys = list(data)
    assert keys.index("bench") < keys.index("source_sha256") == keys.index("attestation") - 1  # stable extras
    proof = data["attestation"]
    assert proof["digest"] == digest and proof["op"] == "rms_norm" and proof["reward"] == 1
    assert proof["device"] == "cpu"
    assert attestation.check(path.read_bytes(), proof, "cpu") is None
    assert (
        attestation.check(path.read_bytes() + b"\n", proof, "cpu") == "source digest does not match the attested digest"
    )


def test_rejected_verdict_has_a_digest_and_no_attestation():
    path = candidate_path("cheat_torch_fallback")
    verdict = run_verification(path, device="cpu")
    assert not verdict.accepted
    data = verdict.to_dict()
    assert data["source_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert data["attestation"] is None


def test_unreadable_file_has_neither(tmp_path):
    data = run_verification(tmp_path / "missing.py").to_dict()
    assert data["source_sha256"] is None and data["attestation"] is None


def test_key_file_is_made_once_owner_only_and_shared(tmp_path, monkeypatch):
    monkeypatch.delenv(attestation.KEY_ENV, raising=False)
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path))
    key = attestation.load_key()  # the state folder's file, made on first use
    path = tmp_path / attestation.KEY_FILE
    assert len(key) == 32 and path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert attestation.load_key(tmp_path) == key  # a second process on the same folder signs alike
    assert [p.name for p in tmp_path.iterdir()] == [attestation.KEY_FILE]
    proof = attestation.record("0" * 64, "rms_norm", 1, "cpu")
    assert proof["signature"] == attestation.sign("0" * 64, "rms_norm", 1, "cpu", key)
    monkeypatch.setenv(attestation.KEY_ENV, "from-the-environment")
    assert attestation.load_key(tmp_path) == b"from-the-environment"
    assert attestation.record("0" * 64, "rms_norm", 1, "cpu")["signature"] != proof["signature"]
