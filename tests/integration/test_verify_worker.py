"""`gpuyantra verify` as a user runs it, beside real workers (`worker cpu` and `worker gpu` processes on
a real Temporal dev server): `--where worker` gets the GPU worker's verdict through the VerifyKernel
workflow; with no worker to be found the command says so (`worker`) or verifies here (`auto`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpuyantra.processes import Managed, free_port

TEMPLATE = Path(__file__).resolve().parents[2] / "gpuyantra" / "kernels" / "rms_norm.py"


def verify(*args: str, address: str, state_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "TEMPORAL_ADDRESS": address, "GPUYANTRA_STATE_DIR": str(state_dir), "TRITON_INTERPRET": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gpuyantra.cli", "verify", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_the_gpu_worker_answers_the_command(temporal: Managed, workers: list[Managed], state_dir: Path) -> None:
    result = verify(
        str(TEMPLATE),
        "--where",
        "worker",
        "--dtypes",
        "float32",
        "--json",
        address=temporal.info["address"],
        state_dir=state_dir,
    )
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout.strip().splitlines()[-1])
    assert verdict["verified_by"] == "worker" and verdict["workflow_id"].startswith("verify-rms_norm-")
    assert verdict["accepted"] is True and verdict["op"] == "rms_norm" and verdict["dtypes"] == ["float32"]
    assert Path(verdict["candidate_path"]).read_text() == TEMPLATE.read_text()
    # The human form names the workflow, to find it in the Web UI.
    human = verify(
        str(TEMPLATE), "--where", "worker", "--dtypes", "float32", address=temporal.info["address"], state_dir=state_dir
    )
    assert human.returncode == 0 and "verified by this machine's GPU worker: workflow verify-rms_norm-" in human.stdout


def test_without_a_worker_the_command_says_so_or_verifies_here(tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens there
    demanded = verify(str(TEMPLATE), "--where", "worker", "--json", address=nowhere, state_dir=tmp_path)
    assert demanded.returncode == 2 and demanded.stdout == ""
    (line,) = demanded.stderr.strip().splitlines()
    assert line.startswith(f"gpuyantra verify: --where worker: no Temporal server answers at {nowhere} (")
    assert line.endswith("(start one with `gpuyantra up`)")
    # auto, asked for CUDA: no worker, so this process verifies (and finds no CUDA on this machine).
    here = verify(str(TEMPLATE), "--device", "cuda", "--json", address=nowhere, state_dir=tmp_path)
    verdict = json.loads(here.stdout.strip().splitlines()[-1])
    assert verdict["verified_by"] == "here"
    if verdict["accepted"] is False:  # a machine without CUDA
        assert [f["rule"] for f in verdict["failures"]] == ["device-unavailable"]


OPEN = Path(__file__).resolve().parents[1] / "verify_open"


def test_the_gpu_worker_verifies_against_a_problem_it_is_sent(
    temporal: Managed, workers: list[Managed], state_dir: Path, tmp_path: Path
) -> None:
    """`--problem`: the problem's text travels in the request; the worker makes the open target in
    its own state folder, tells a candidate naming another op the target's name, accepts the honest one."""
    address = temporal.info["address"]
    problem = str(OPEN / "scaled_add_problem.py")
    quick = ("--where", "worker", "--dtypes", "float32", "--json", "--problem", problem)
    named = verify(str(OPEN / "scaled_add_kernel.py"), *quick, address=address, state_dir=state_dir)
    verdict = json.loads(named.stdout.strip().splitlines()[-1])
    assert named.returncode == 1 and verdict["verified_by"] == "worker", named.stderr
    (failure,) = verdict["failures"]
    op = failure["message"].rsplit('set OP = "', 1)[1].rstrip('"')
    assert failure["rule"] == "unknown-op" and op.startswith("open.scaled_add_problem_")

    honest = tmp_path / "honest.py"
    honest.write_text((OPEN / "scaled_add_kernel.py").read_text().replace("OPNAME", op))
    accepted = verify(str(honest), *quick, address=address, state_dir=state_dir)
    verdict = json.loads(accepted.stdout.strip().splitlines()[-1])
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert verdict["accepted"] is True and verdict["op"] == op and verdict["verified_by"] == "worker"

    # A problem the worker cannot make a target of: the command's usage error, the worker's reason.
    broken = tmp_path / "broken_problem.py"
    broken.write_text((OPEN / "scaled_add_problem.py").read_text().replace("return a + self.scale * b", "return a @ b"))
    refused = verify(str(honest), "--where", "worker", "--problem", str(broken), address=address, state_dir=state_dir)
    assert refused.returncode == 2 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"gpuyantra verify: --problem {broken}: its model does not run on its inputs: RuntimeError")
