"""The torch.compile baselines compiled in a second child while the candidate's runs its cases
(`precompile_beside`): when it is asked for, the compiling child's job and word, the candidate's
child waiting for that word (and compiling itself without it), the compiling child never
outliving its verification. Real children on the CPU; on CUDA the same jobs run beside a timing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import gpuyantra.verifier.precompile_beside as precompile_beside
from gpuyantra.verifier.child import _compiled_beside
from gpuyantra.verifier.sandbox import Sandbox, _session_members

RMS_PARAMS = [
    {"name": "weight", "kind": "tensor", "shape": ["H"]},
    {"name": "eps", "kind": "float", "value": 1e-6},
]
COMPILED = {"compile_us": 3.0, "compile_ro_us": 2.5}


def _job(**extra) -> dict:
    job = {
        "op": "rms_norm",
        "device": "cpu",
        "param_specs": RMS_PARAMS,
        "threads": 1,
        "family_modules": [],
        "open_target": None,
        "benchmark": True,
        "bench_shapes": [[2, 64]],
        "bench_dtype": "float32",
        "cached_baselines": {},
        "timing_lock": None,
        "path": "/nonexistent/candidate.py",  # the candidate's: never sent to the compiling child
    }
    return {**job, **extra}


def test_a_second_child_compiles_only_what_is_not_kept():
    assert precompile_beside.needed(_job())
    assert precompile_beside.needed(_job(cached_baselines={"2x64": {"compile_us": 3.0}}))  # one mode left
    assert not precompile_beside.needed(_job(cached_baselines={"2x64": COMPILED}))
    assert not precompile_beside.needed(_job(benchmark=False))
    # Every timed shape counts: one kept is not all kept.
    assert precompile_beside.needed(_job(bench_shapes=[[2, 64], [4, 64]], cached_baselines={"2x64": COMPILED}))
    # At milliseconds of eager per call the CUDA-graph baseline is skipped (it keeps no time): not to
    # be compiled again by every verification.
    slow = {"compile_us": 1500.0, "eager_us": 1500.0}
    assert not precompile_beside.needed(_job(cached_baselines={"2x64": slow}))
    assert precompile_beside.needed(_job(cached_baselines={"2x64": {**slow, "eager_us": 900.0}}))
    # Inputs of gigabytes (KernelBench's): not twice on the GPU at once; the candidate's child compiles.
    huge = [[16, precompile_beside.MAX_INPUT_BYTES // 16 // 4 + 1]]
    assert not precompile_beside.needed(_job(bench_shapes=huge))
    assert precompile_beside.needed(_job(bench_shapes=huge, bench_dtype="float16"))  # half the bytes


def _word_after(marker: Path, word: str, seconds: float) -> threading.Thread:
    def write() -> None:
        time.sleep(seconds)
        marker.write_text(word)

    thread = threading.Thread(target=write)
    thread.start()
    return thread


@pytest.mark.parametrize(("word", "compiled"), [("ok", True), ("failed", False)])
def test_the_candidates_child_waits_for_the_word(tmp_path, word, compiled):
    marker = tmp_path / precompile_beside.MARKER
    job = {"precompile_beside": {"marker": str(marker), "max_wait_s": 60}}
    writer = _word_after(marker, word, 0.3)
    timings: dict[str, float] = {}
    started = time.monotonic()
    assert _compiled_beside(job, timings) is compiled  # "failed": the child compiles them itself
    writer.join()
    assert 0.25 <= time.monotonic() - started < 30
    assert timings["precompile_wait"] >= 0.25


def test_without_a_word_in_time_or_without_a_second_child_the_child_compiles_itself(tmp_path):
    marker = tmp_path / precompile_beside.MARKER
    timings: dict[str, float] = {}
    assert not _compiled_beside({"precompile_beside": {"marker": str(marker), "max_wait_s": 0.2}}, timings)
    assert 0.2 <= timings["precompile_wait"] < 30
    timings.clear()
    assert not _compiled_beside({}, timings) and "precompile_wait" not in timings


def test_a_second_child_compiles_the_baselines_and_says_so(state, tmp_path):
    job = _job()
    beside = precompile_beside.start(job, tmp_path, Sandbox("cpu", timeout=240))
    # The candidate's job now tells its child where the word comes; the compiling child's job is its own.
    assert job["precompile_beside"] == {"marker": str(tmp_path / "baselines-compiled"), "max_wait_s": 120.0}
    assert _compiled_beside(job, {})
    beside.stop()
    results = beside.outcome.results
    assert results["stage"] == "done" and not results.get("harness_error"), results
    assert beside.timings()["beside_precompile"] > 0


def test_a_second_child_that_fails_says_so(state, tmp_path):
    job = _job(op="no_such_family")
    beside = precompile_beside.start(job, tmp_path, Sandbox("cpu", timeout=120))
    assert not _compiled_beside(job, {})
    beside.stop()
    assert (tmp_path / "baselines-compiled").read_text() == "failed"


@pytest.mark.parametrize("at_once", [True, False])
def test_a_second_child_never_outlives_its_verification(state, tmp_path, at_once):
    # Ten shapes to compile: far longer than the verification lasts here. Stopped at once, the child
    # may not have started yet; later, it is compiling.
    job = _job(bench_shapes=[[2, 64 + 8 * k] for k in range(10)])
    sandbox = Sandbox("cpu", timeout=240)
    beside = precompile_beside.start(job, tmp_path, sandbox)
    deadline = time.monotonic() + 60
    while not at_once and sandbox.proc is None and time.monotonic() < deadline:
        time.sleep(0.05)
    beside.stop()
    assert not beside.running
    if sandbox.proc is not None:
        assert sandbox.proc.poll() is not None and not _session_members(sandbox.proc.pid)
    assert (tmp_path / "baselines-compiled").read_text() == "failed"


def test_only_a_warm_spare_compiles_beside(state, monkeypatch):
    """A second child that had to start first (7-10 s of imports) would keep the candidate's child
    waiting longer than compiling itself: `take_spare` hands out warm spares only, else None."""
    from gpuyantra.verifier import sandbox as sandbox_module
    from gpuyantra.verifier.sandbox import keep_spare, take_spare

    monkeypatch.setattr(sandbox_module, "_SPARE_COUNT", 1)
    assert take_spare("cpu") is None
    keep_spare("cpu")
    spare = take_spare("cpu")
    try:
        assert spare is not None and spare.proc is not None  # started before it was asked for
        assert take_spare("cpu") is None  # the pool's one spare is taken
    finally:
        if spare is not None:
            spare.close()
