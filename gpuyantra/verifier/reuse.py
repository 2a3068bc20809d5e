"""Accepted verdicts kept in the state folder and reused for the very same question.

A warm campaign seeds each target from the skill library, and the author's first candidate is then
byte for byte the kernel an earlier campaign verified, against the same target, shapes and dtypes,
on the same device. Verifying it again costs a GPU verdict per target and can only repeat the
answer, so the campaign reuses it. The key holds everything the verdict depends on: the candidate's
bytes, the op and module class, shapes, dtypes and parameter shapes, the device's name, the torch
and triton versions, and a digest of the verifier's and the op families' own code (a new rule or
tolerance makes every stored verdict stale). Only accepted verdicts are kept: a rejection may come
from a passing condition (a sandbox killed under memory pressure beside other work).

The swap still checks parity on the live weights, and the server still checks the attestation
against the bytes it imports; reusing a verdict skips neither.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

FRESH_ENV = "GPUYANTRA_FRESH_VERDICTS"  # "1": never reuse, verify every candidate again
_JUDGING_CODE = ("verifier", "ops", "rewards.py", "attestation.py", "candidate.py")


def folder() -> Path:
    from gpuyantra.verifier.baselines import folder as verifier_folder

    path = verifier_folder() / "verdicts"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=1)
def judging_code_digest() -> str:
    """sha256 over the source of everything that decides a verdict (verifier, op families, rewards)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in _JUDGING_CODE:
        path = root / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def verdict_key(
    source: str,
    *,
    op: str,
    module_class: str | None,
    shapes: Sequence[Sequence[int]] | None,
    dtypes: Sequence[str] | None,
    param_shapes: Mapping[str, Sequence[int] | None] | None,
    device_name: str,
    versions: Mapping[str, str],
    layouts: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    question: dict[str, Any] = {
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "op": op,
        "module_class": module_class,
        "shapes": [list(map(int, s)) for s in shapes or []],
        "dtypes": list(dtypes or []),
        "param_shapes": {k: (list(v) if v is not None else None) for k, v in sorted((param_shapes or {}).items())},
        "device": device_name,
        "versions": dict(sorted(versions.items())),
        "judging_code": judging_code_digest(),
    }
    if layouts:  # served layouts draw more cases: another question (keys without them stay as they were)
        question["layouts"] = [dict(layout) for layout in layouts]
    return hashlib.sha256(json.dumps(question, sort_keys=True).encode()).hexdigest()


def enabled() -> bool:
    return os.environ.get(FRESH_ENV, "") not in ("1", "true", "yes")


def load(key: str) -> dict[str, Any] | None:
    """The stored verdict for `key`, marked with where it came from; None when there is none."""
    path = folder() / f"{key}.json"
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or not isinstance(stored.get("verdict"), dict):
        return None
    verdict = dict(stored["verdict"])
    verdict["reused"] = {"key": key, "verified_at": stored.get("verified_at")}
    return verdict


def store(key: str, verdict: Mapping[str, Any]) -> bool:
    """Keep an accepted verdict (atomically). False, and nothing written, for any other."""
    if not verdict.get("accepted"):
        return False
    path = folder() / f"{key}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    body = {"verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "verdict": dict(verdict)}
    tmp.write_text(json.dumps(body, default=str))
    tmp.replace(path)
    return True
