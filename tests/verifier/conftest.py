"""Shared fixtures of the verifier's tests. The interpreter flag must be set before triton loads."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from gpuyantra.verifier.rules import RULES

CANDIDATES = Path(__file__).parent / "candidates"
HEADER = (CANDIDATES / "_header.txt").read_text()

# The honest body used where a test only changes one thing around it.
HONEST_ENTRY = """
def entry(x, *, weight, eps):
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()
    y = torch.empty_like(x2)
    _rms_rows[(x2.shape[0],)](x2, weight, y, hidden, eps, BLOCK=triton.next_power_of_2(hidden))
    return y.view(x.shape)
"""


def candidate_path(name: str) -> Path:
    return CANDIDATES / f"{name}.py"


def rules_of(verdict) -> set[tuple[str, str]]:
    """(layer, rule) pairs of a verdict; every rule named must be a documented one."""
    pairs = {(f.layer, f.rule) for f in verdict.failures}
    for layer, rule in pairs:
        assert rule in RULES and RULES[rule].layer == layer, (layer, rule)
    return pairs


@pytest.fixture
def write_candidate(tmp_path):
    """Write `HEADER + body` (or a whole file) to a .py file and return its path."""

    def write(body: str, whole: bool = False, name: str = "candidate") -> Path:
        path = tmp_path / f"{name}.py"
        path.write_text(body if whole else HEADER + "\n" + body)
        return path

    return write


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A fresh state folder; afterwards no warm sandbox child is left for the next test."""
    from gpuyantra.verifier import sandbox as sandbox_module

    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path))
    yield tmp_path
    sandbox_module.close_spares()


def can_take(path: Path | str, operation: int = fcntl.LOCK_EX) -> bool:
    """Whether a newcomer (its own open file description) could take the lock at `path` right now."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def module_outputs(
    family: Any,
    cases: Sequence[Any],
    specs: list[dict[str, Any]],
    spoil: dict[int, Callable[[Any], None]] | None = None,
) -> dict[str, Any]:
    """A chunk of outputs ({"case_id:0": tensor}) as the module itself computes them, on the cases'
    own inputs; `spoil[case_id]` changes that case's output in place (a kernel wrong in one place)."""
    from gpuyantra.verifier.cases import make_case

    chunk = {}
    for case in cases:
        activations, params = make_case(family, case, specs)
        out = family.reference(*activations, **params)
        if spoil and case.id in spoil:
            out = out.clone()
            spoil[case.id](out)
        chunk[f"{case.id}:0"] = out
    return chunk
