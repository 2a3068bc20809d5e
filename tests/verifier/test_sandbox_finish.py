"""A child that has written its results, with nothing else alive in its session, is finished: the
verdict does not wait for its exit (on CUDA its context's teardown, behind the GPU's locks), and a
reaper watches that exit instead (`sandbox._finished_alone`, `_reap_later`). Anything else alive in
its session keeps the old order: wait for the exit, then judge what outlived it."""

from __future__ import annotations

import os
import sys
import time

from gpuyantra.verifier import sandbox as sandbox_module
from gpuyantra.verifier.sandbox import Sandbox

# Reads its job like the harness, writes results, then lingers (a CUDA child's exit, made long).
# With "helper", it first starts a process of its own that outlives it.
LINGERING_CHILD = """
import json, os, sys, time
job = json.loads(sys.stdin.read())
if job.get("helper") and os.fork() == 0:
    time.sleep(30)
    os._exit(0)
path = job["results_path"]
with open(path + ".partial", "w") as handle:
    json.dump({"stage": "done", "finished_at": time.time(), "timings": {}}, handle)
os.replace(path + ".partial", path)
time.sleep(float(job["linger_s"]))
"""


class _LingeringSandbox(Sandbox):
    def _interpreter_command(self, args: list[str]) -> list[str]:
        return [sys.executable, "-c", LINGERING_CHILD]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _run(job: dict, timeout: float = 60.0) -> tuple[Sandbox, sandbox_module.SandboxOutcome, float]:
    sandbox = _LingeringSandbox("cpu", timeout=timeout)
    sandbox.start(fork=False)
    started = time.monotonic()
    outcome = sandbox.run(job)
    return sandbox, outcome, time.monotonic() - started


def test_the_outcome_comes_once_the_results_are_written_and_the_exit_is_reaped_after():
    sandbox, outcome, seconds = _run({"linger_s": 20})
    pid, workdir = sandbox.proc.pid, sandbox.workdir
    try:
        assert outcome.results is not None and outcome.results["stage"] == "done"
        assert seconds < 15, seconds  # far from the child's 20 s linger: its exit was not waited for
        assert outcome.returncode is None and outcome.leftover == [] and not outcome.timed_out
        assert outcome.exit_seconds is None and outcome.results_seen_seconds is not None
        assert _alive(pid)
        sandbox.reap_wait_s = 0.5
        sandbox.close()  # handed to a reaper: it kills the child past `reap_wait_s`
        assert sandbox_module.wait_for_reapers(timeout=30)
    finally:
        if _alive(pid):
            os.kill(pid, 9)
    assert not _alive(pid) and not workdir.exists()


def test_a_finished_child_left_to_end_by_itself_is_cleaned_up_when_it_ends():
    sandbox, outcome, _ = _run({"linger_s": 0.5})
    pid, workdir = sandbox.proc.pid, sandbox.workdir
    assert outcome.results_seen_seconds is not None
    sandbox.close()
    assert sandbox_module.wait_for_reapers(timeout=30)
    assert not _alive(pid) and not workdir.exists() and sandbox.proc.returncode == 0


def test_a_process_of_the_candidate_alive_at_the_end_makes_the_verdict_wait_for_the_exit():
    sandbox, outcome, seconds = _run({"linger_s": 1.0, "helper": True})
    try:
        assert seconds >= 1.0  # the child's exit was waited for
        assert outcome.returncode == 0 and outcome.exit_seconds is not None and outcome.results_seen_seconds is None
        assert len(outcome.leftover) == 1  # the helper outlived it, and was killed
        assert not any(_alive(pid) for pid in outcome.leftover)
    finally:
        sandbox.close()
