"""A child whose harness has written its results is done: the verdict does not wait for its process
to go away (on CUDA a context torn down, 0.1-0.4 s), its session is killed and its process reaped in
the background; a caller about to hand the GPU's memory on waits for those exits (`wait_for_exits`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from gpuyantra.verifier.sandbox import Sandbox, wait_for_exits

# Stands in for the child: writes its results whole, then takes its time to exit, with a process of
# its own session still running (what a candidate's leftover is).
LINGERING_CHILD = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    sys.stdin.read()
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.3)
    with open("results.json.tmp", "w") as fh:
        json.dump({"checks": [], "stage": "done", "finished_at": time.time(), "timings": {}}, fh)
    os.replace("results.json.tmp", "results.json")
    time.sleep(60)
    """
)


def test_the_verdict_does_not_wait_for_a_child_whose_results_are_in():
    sandbox = Sandbox("cpu", timeout=120)
    sandbox.proc = subprocess.Popen(
        [sys.executable, "-c", LINGERING_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=sandbox.workdir,
        start_new_session=True,
    )
    sandbox._stdout = open(sandbox.workdir / "stdout.log", "wb")
    sandbox._stderr = open(sandbox.workdir / "stderr.log", "wb")
    started = time.monotonic()
    try:
        outcome = sandbox.run({"job": "ignored"})
    finally:
        sandbox.close()
    assert time.monotonic() - started < 30  # not the child's 60 s
    assert outcome.results is not None and outcome.results["stage"] == "done"
    assert outcome.returncode is None and not outcome.timed_out  # killed after its results: no crash
    assert len(outcome.leftover) == 1  # the process it started, still there when the results came
    assert outcome.exit_seconds is not None and outcome.exit_seconds < 30
    assert wait_for_exits(timeout=30)
    assert sandbox.proc.returncode is not None  # reaped
