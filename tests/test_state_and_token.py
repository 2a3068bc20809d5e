"""One state-folder resolution for every command, and the admin token `up` hands its workers."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuyantra import config
from gpuyantra.cli import build_parser
from gpuyantra.commands.up import admin_token_for


def test_default_state_folder_is_the_users_data_folder_not_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUYANTRA_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert config.state_dir() == (tmp_path / "data" / "gpuyantra").resolve()
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(tmp_path / "mine"))
    assert config.state_dir() == (tmp_path / "mine").resolve()


def test_every_command_that_touches_state_takes_state_dir():
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in ("verify", "serve", "optimize", "worker", "up", "demo", "kernelbench", "report"):
        assert any("--state-dir" in a.option_strings for a in subs[name]._actions), name
    skills = next(a for a in subs["skills"]._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in skills.items():
        assert any("--state-dir" in a.option_strings for a in sub._actions), f"skills {name}"


def test_skills_list_reads_the_state_folder_given_from_any_directory(tmp_path):
    state = tmp_path / "state"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUYANTRA_STATE_DIR", "GPUYANTRA_QDRANT_PATH")}
    result = subprocess.run(
        [sys.executable, "-m", "gpuyantra.cli", "skills", "list", "--state-dir", str(state), "--json"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (state / "qdrant").exists() and not (elsewhere / ".state").exists()


@pytest.fixture
def no_token(monkeypatch):
    monkeypatch.delenv("GPUYANTRA_ADMIN_TOKEN", raising=False)


def test_up_token_flag_then_environment(no_token, tmp_path, monkeypatch):
    assert admin_token_for(argparse.Namespace(admin_token="from-flag"), tmp_path) is False
    assert os.environ["GPUYANTRA_ADMIN_TOKEN"] == "from-flag"
    monkeypatch.setenv("GPUYANTRA_ADMIN_TOKEN", "from-env")
    assert admin_token_for(argparse.Namespace(admin_token=None), tmp_path) is False
    assert os.environ["GPUYANTRA_ADMIN_TOKEN"] == "from-env"


def test_up_reuses_the_kept_token_else_makes_one(no_token, tmp_path):
    assert admin_token_for(argparse.Namespace(admin_token=None), tmp_path) is True
    first = os.environ["GPUYANTRA_ADMIN_TOKEN"]
    assert len(first) >= 24
    (tmp_path / "admin-token").write_text("kept-token\n")
    os.environ.pop("GPUYANTRA_ADMIN_TOKEN")
    assert admin_token_for(argparse.Namespace(admin_token=None), tmp_path) is True
    assert os.environ["GPUYANTRA_ADMIN_TOKEN"] == "kept-token"
    assert Path(tmp_path / "admin-token").read_text().strip() == "kept-token"
