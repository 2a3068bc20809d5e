"""Fixtures for the skill library tests: a real local Qdrant folder per test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuyantra.skills import Fingerprint, Skill

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def qdrant_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("GPUYANTRA_QDRANT_URL", raising=False)
    monkeypatch.delenv("GPUYANTRA_QDRANT_PATH", raising=False)
    return tmp_path / "qdrant"


def make_skill(
    op: str = "rms_norm",
    hardware: str = "nvidia-h200",
    variant: str = "a",
    *,
    shape=(1, 1, 1536),
    dtype: str = "bfloat16",
    regime: str = "launch-bound",
    reward: float = 3,
    author: str = "template",
) -> Skill:
    source = f"# {op} kernel {variant}\nOP = {op!r}\nADAPTER = []\n\ndef entry(x):\n    return x\n"
    target = {"op": op, "regime": regime, "shapes": [list(shape)], "dtype": dtype}
    return Skill(
        op=op,
        hardware=hardware,
        source=source,
        adapter=[{"kernel_param": "weight", "module_attr": "weight"}],
        strategy={"variant": variant, "BLOCK": 1024},
        reward=reward,
        speedup_vs_eager=7.1,
        speedup_vs_compile=1.4,
        shapes=[list(shape)],
        dtypes=[dtype],
        fingerprint=Fingerprint.from_target(target, hardware).to_payload(),
        provenance={"campaign": "wf-1", "iteration": 1, "author": author},
    )


def run_python(code: str, env_extra: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (a process restart), from the repository root."""
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"subprocess failed:\n{result.stdout}\n{result.stderr}"
    return result


def run_cli(*args: str, env_extra: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "gpuyantra.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
