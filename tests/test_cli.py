"""The command line: usage errors exit 2 with a message; unreachable services exit 1 clearly."""

from __future__ import annotations

import subprocess
import sys

from gpuyantra.processes import free_port


def gpuyantra(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuyantra.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_every_command_has_help():
    listing = gpuyantra("--help")
    assert listing.returncode == 0
    for command in ["verify", "serve", "optimize", "worker", "up", "demo", "skills", "kernelbench", "report"]:
        assert command in listing.stdout
        assert gpuyantra(command, "--help").returncode == 0


def test_bad_flag_exits_2_with_message():
    result = gpuyantra("optimize", "--server", "http://127.0.0.1:1", "--no-such-flag")
    assert result.returncode == 2 and "unrecognized arguments: --no-such-flag" in result.stderr


def test_unknown_op_exits_2_naming_the_known_ops():
    result = gpuyantra("optimize", "--server", "http://127.0.0.1:1", "--ops", "rms_norm,warp_drive")
    assert result.returncode == 2
    assert "unknown op 'warp_drive'" in result.stderr and "rms_norm" in result.stderr


def test_unknown_worker_role_exits_2():
    assert gpuyantra("worker", "tpu").returncode == 2


def test_optimize_against_unreachable_server_exits_1_clearly():
    result = gpuyantra("optimize", "--server", f"http://127.0.0.1:{free_port()}", "--ops", "rms_norm")
    assert result.returncode == 1 and "server not reachable" in result.stderr


def test_serve_refuses_a_negative_mixed_prompt_budget():
    result = gpuyantra("serve", "--device", "cpu", "--mixed-prompt-tokens", "-1", "--port", str(free_port()))
    assert result.returncode == 2 and "--mixed-prompt-tokens must be 0 (off) or more" in result.stderr
