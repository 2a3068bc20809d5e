"""The adversarial suite: whole `verify` runs on cheating and honest candidates, each verdict asserted.

Candidates live in `candidates/` (real files, as the Coder writes them). Runtime cheats pass the
static layer and are caught by the sandbox or the correctness layer. Cheats the static layer stops
are run a second time with static analysis switched off, to show the runtime layers stop them too
(defence in depth). To keep the suite fast, most runs use one seed and one dtype (the plan is
otherwise the full one: every hidden shape, all four input distributions); the honest candidates
get the full default plan and the CPU time budget is asserted.
"""

from __future__ import annotations

import json

import pytest
import torch

import gpuyantra.verifier.core as core
from gpuyantra.ops import get_op
from gpuyantra.verifier import run_verification, verify
from gpuyantra.verifier.cases import class_cases
from tests.verifier.conftest import candidate_path, rules_of

QUICK = {"seeds": (0,), "dtypes": ["float32"]}

# candidate, extra run_verification knobs, the (layer, rule) the verdict must name
RUNTIME_CHEATS = [
    ("cheat_ignores_weight", {}, ("correctness", "wrong-values")),
    ("cheat_half_written", {}, ("correctness", "nan-output")),
    ("cheat_pow2_only", {}, ("correctness", "entry-raised")),
    ("cheat_tuple_output", {}, ("correctness", "output-type")),
    ("cheat_fp32_output", {"dtypes": ["float16"]}, ("correctness", "output-dtype")),
    ("cheat_flat_output", {}, ("correctness", "output-shape")),
    ("cheat_meta_output", {}, ("correctness", "output-device")),
    ("cheat_inplace_alias", {}, ("correctness", "output-aliases-input")),
    ("cheat_scribbles_input", {}, ("correctness", "input-mutated")),
    ("cheat_loop_launch", {}, ("correctness", "no-kernel-launch")),
    ("cheat_wild_pointer", {}, ("sandbox", "crash")),
    ("cheat_hang", {"timeout": 6}, ("sandbox", "timeout")),
    ("cheat_hang", {"timeout": 120, "cpu_seconds": 6}, ("sandbox", "cpu-limit")),
    ("cheat_memory_hog", {"memory_limit": 2**30}, ("sandbox", "memory-limit")),
    ("cheat_import_error", {}, ("sandbox", "import-failed")),
    # Stopped statically (see STATIC_CHEATS); with the static layer off the runtime layers stop them.
    ("cheat_torch_fallback", {"skip_static": True}, ("correctness", "host-torch-op")),
    ("cheat_cached_buffer", {"skip_static": True}, ("correctness", "output-reused")),
    ("cheat_fork", {"skip_static": True, "dtypes": ["float32"]}, ("sandbox", "forked-process")),  # fewer forks alive
    ("cheat_exit_fake_reward", {"skip_static": True}, ("sandbox", "early-exit")),
    ("cheat_adapter_mutation", {"skip_static": True}, ("sandbox", "runtime-mismatch")),
]


@pytest.mark.parametrize("name,knobs,expected", RUNTIME_CHEATS, ids=[f"{n}-{e[1]}" for n, _, e in RUNTIME_CHEATS])
def test_runtime_cheat_is_rejected(name, knobs, expected):
    verdict = run_verification(candidate_path(name), **{**QUICK, **knobs})
    assert expected in rules_of(verdict), verdict.failures
    assert not verdict.accepted and verdict.reward == -1
    assert verdict.speedup_vs_eager is None and verdict.speedup_vs_compile is None
    json.dumps(verdict.to_dict())  # the worker survives and reports


# The published exploits, through a whole verify: rejected before anything runs.
STATIC_CHEATS = [
    ("cheat_torch_fallback", "torch-compute"),  # Sakana AI CUDA Engineer / KernelBench
    ("cheat_decoy_kernel", "kernel-not-launched"),  # decoy @triton.jit, getattr-aliased torch
    ("cheat_try_fallback", "try-except"),  # Kevin-32B
    ("cheat_shape_guard", "guarded-fallback"),  # KernelBench-Verified
    ("cheat_cached_buffer", "mutable-state"),  # CUDA-L1 result caching
    ("cheat_side_stream", "concurrency"),  # CUDA-L1 side streams
    ("cheat_fork", "import-not-allowed"),
    ("cheat_exit_fake_reward", "import-not-allowed"),
    ("cheat_adapter_mutation", "import-time-code"),
]


@pytest.mark.parametrize("name,rule", STATIC_CHEATS, ids=[n for n, _ in STATIC_CHEATS])
def test_published_cheat_is_rejected_statically(name, rule):
    verdict = verify(candidate_path(name))
    assert ("static", rule) in rules_of(verdict)
    assert not verdict.accepted and verdict.reward == -1
    assert verdict.checks == 0 and verdict.network_isolated is None  # the sandbox never started


def test_honest_rowwise_full_plan():
    verdict = verify(candidate_path("honest_rowwise"))
    assert verdict.failures == [] and verdict.accepted and verdict.reward == 1
    # 4 hidden shapes x 2 dtypes x (5 seeds x 4 scales + 2 seeds x 2 activation-like distributions),
    # plus the two stress shapes once and the plan classes' cases once each.
    classes = class_cases("cpu", get_op("rms_norm"), verdict.shapes, verdict.dtypes)
    assert verdict.checks == 4 * 2 * (5 * 4 + 2 * 2) + 2 + len(classes) and verdict.dtypes == ["float32", "float16"]
    assert [1, 1000] in verdict.shapes and [67, 96] in verdict.shapes and [2, 3, 64] in verdict.shapes
    assert verdict.speedup_vs_eager is None  # speed is not judged on CPU


def test_honest_chunked_with_live_shapes():
    verdict = run_verification(candidate_path("honest_chunked"), shapes=[[5, 200]], seeds=(0, 1), dtypes=["float16"])
    assert verdict.failures == [] and verdict.reward == 1
    # (live + 4 hidden shapes) x (2 seeds x 4 scales + 2 seeds x 2 activation-like inputs) + 2 stress
    # shapes + the plan classes' cases.
    classes = class_cases("cpu", get_op("rms_norm"), verdict.shapes, verdict.dtypes)
    assert verdict.shapes[0] == [5, 200] and verdict.checks == 5 * (2 * 4 + 2 * 2) + 2 + len(classes)


def test_honest_helper_with_heuristics_and_printed_fake_reward():
    verdict = run_verification(candidate_path("honest_helper"), **QUICK)
    assert verdict.failures == [] and verdict.reward == 1  # the printed reward 3 is ignored


def test_live_shapes_are_capped_to_interpreter_size_on_cpu():
    verdict = run_verification(candidate_path("honest_rowwise"), shapes=[[4096, 128]], **QUICK)
    assert verdict.accepted and verdict.shapes[0] == [64, 128]


@pytest.mark.parametrize("op", ["silu_mul", "rope"])
def test_other_families_multiple_activations_and_tuple_outputs(op):
    """Nothing is rms_norm-specific: two activations (silu_mul), four activations and a (q, k) output
    (rope), each output checked."""
    from pathlib import Path

    template = Path(core.__file__).parents[1] / "kernels" / f"{op}.py"
    verdict = run_verification(template, **QUICK)
    assert verdict.op == op and verdict.failures == [] and verdict.reward == 1


def test_unreadable_candidate_is_a_clear_rejection(tmp_path):
    missing = verify(tmp_path / "nope.py")
    assert rules_of(missing) == {("static", "unreadable")} and "nope.py" in missing.failures[0].message
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    assert ("static", "unreadable") in rules_of(verify(binary))


def test_verifier_error_rejects_instead_of_raising(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(core, "check_contract", broken)
    verdict = verify(candidate_path("honest_rowwise"))
    assert rules_of(verdict) == {("sandbox", "internal-error")} and not verdict.accepted


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's answer")
def test_cuda_requested_without_cuda():
    verdict = verify(candidate_path("honest_rowwise"), device="cuda")
    assert rules_of(verdict) == {("sandbox", "device-unavailable")} and verdict.reward == -1


def test_bad_arguments_are_usage_errors_not_verdicts():
    with pytest.raises(ValueError):
        verify(candidate_path("honest_rowwise"), dtypes=["float12"])
    with pytest.raises(ValueError):
        verify(candidate_path("honest_rowwise"), device="tpu")


# --- CUDA only: the benchmark layer and the side-stream check ----------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
def test_cuda_honest_candidate_is_benchmarked():
    verdict = verify(
        candidate_path("honest_rowwise"), device="cuda", shapes=[[1, 4096], [512, 4096]], dtypes=["float16"]
    )
    assert verdict.failures == [] and verdict.reward >= 1
    assert verdict.kernel_us and verdict.eager_us and verdict.floor_us is not None
    assert verdict.speedup_vs_eager is not None and len(verdict.bench) == 2
    assert verdict.checks > 0


@pytest.mark.gpu
@needs_cuda
def test_cuda_side_stream_is_caught_at_runtime():
    verdict = run_verification(
        candidate_path("cheat_side_stream"),
        device="cuda",
        skip_static=True,
        seeds=(0,),
        dtypes=["float16"],
        benchmark=False,
    )
    assert ("correctness", "stream-changed") in rules_of(verdict)
