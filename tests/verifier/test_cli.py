"""`gpuyantra verify`: exit codes 0 / 1 / 2, one JSON object on stdout with `--json`, clear errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from tests.verifier.conftest import candidate_path
from tests.verifier.test_judge import CONTRACT_KEYS, EXTRA_KEYS


def gpuyantra(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuyantra.cli", "verify", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


def test_accepted_exits_0_and_candidate_prints_stay_out_of_stdout():
    # honest_helper prints '{"accepted": true, "reward": 3}' from entry: it must not reach our stdout.
    result = gpuyantra(candidate_path("honest_helper"), "--device", "cpu", "--json", "--dtypes", "float32")
    assert result.returncode == 0, result.stdout + result.stderr
    data = one_json(result.stdout)
    assert list(data) == CONTRACT_KEYS + EXTRA_KEYS + ["verified_by"]
    assert data["verified_by"] == "here"  # no GPU worker polls here
    assert data["accepted"] is True and data["reward"] == 1 and data["failures"] == []
    assert data["op"] == "rms_norm" and data["device"] == "cpu"
    assert data["checks"] == 4 * (5 * 4 + 2 * 2) + 2 + 8  # the grid, the live shapes, the plan classes
    assert data["speedup_vs_eager"] is None and data["speedup_vs_compile"] is None
    # Each stage of the verdict is timed, to the child's exit or to its results seen (then it ends by itself).
    timings = data["timings"]
    stages = {"static", "contract", "sandbox", "judge", "child_setup_import", "child_correctness"}
    assert stages <= set(timings)
    (end,) = {"child_exit", "child_results_seen"} & set(timings)
    assert 0 <= timings[end] <= timings["sandbox"]


def test_rejected_exits_1_with_layer_and_rule():
    result = gpuyantra(candidate_path("cheat_try_fallback"), "--device", "cpu", "--json")
    assert result.returncode == 1
    data = one_json(result.stdout)
    assert data["accepted"] is False and data["reward"] == -1
    assert {"layer": "static", "rule": "try-except"} in [{k: f[k] for k in ("layer", "rule")} for f in data["failures"]]


def test_human_output_names_rules():
    result = gpuyantra(candidate_path("cheat_shape_guard"), "--device", "cpu")
    assert result.returncode == 1
    assert "REJECTED" in result.stdout and "[static/guarded-fallback]" in result.stdout


def test_missing_file_is_a_usage_error_with_one_line(tmp_path):
    result = gpuyantra(tmp_path / "missing.py", "--device", "cpu", "--json")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().endswith("missing.py: no such file") and len(result.stderr.splitlines()) == 1


def test_unknown_op_exits_1_clearly(tmp_path):
    path = tmp_path / "warp.py"
    path.write_text(candidate_path("honest_rowwise").read_text().replace('OP = "rms_norm"', 'OP = "warp_drive"'))
    result = gpuyantra(path, "--device", "cpu")
    assert result.returncode == 1
    assert "[contract/unknown-op]" in result.stdout and "warp_drive" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        [],  # FILE is required
        ["x.py", "--device", "tpu"],
        ["x.py", "--shapes", "1xq"],
        ["x.py", "--dtypes", "float12"],
        ["x.py", "--no-such-flag"],
    ],
)
def test_usage_errors_exit_2(args):
    result = gpuyantra(*args)
    assert result.returncode == 2 and "usage:" in result.stderr


def test_help():
    result = gpuyantra("--help")
    assert result.returncode == 0 and "--module" in result.stdout and "--json" in result.stdout


def _where(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"where": "auto", "device": "cuda", "state_dir": None, "module": None, **given})


def test_auto_sends_to_the_worker_only_what_it_would_verify_the_same(monkeypatch, tmp_path):
    from gpuyantra.commands import verify as command

    assert command._worker_may_take(_where())
    assert command._worker_may_take(_where(where="worker", device="cpu"))  # insisted on
    assert not command._worker_may_take(_where(device="cpu"))  # the interpreter: here
    assert not command._worker_may_take(_where(state_dir=str(tmp_path)))  # its own caches and locks
    assert command._worker_may_take(_where(module="transformers.models.llama.modeling_llama.LlamaRMSNorm"))
    (tmp_path / "gy_my_norms.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not command._worker_may_take(_where(module="gy_my_norms.Norm"))  # a module of this folder
    assert not command._worker_may_take(_where(module="gy_no_such_package.Norm"))
    monkeypatch.setattr(command, "_has_nvidia_device", lambda: False)
    assert not command._worker_may_take(_where(device=None))  # no --device and no GPU here
    monkeypatch.setattr(command, "_has_nvidia_device", lambda: True)
    assert command._worker_may_take(_where(device=None))
