"""The parent's side: reward ladder, benchmark judgement (floor, failures), sandbox outcomes, the
element-wise comparison, and the verdict's JSON shape. Pure functions, no subprocess."""

from __future__ import annotations

import json
import math
import signal

import pytest
import torch

from gpuyantra.ops import get_op
from gpuyantra.verifier import Failure, Verdict, compute_reward
from gpuyantra.verifier.cases import Case, correctness_shapes, make_case, plan
from gpuyantra.verifier.judge import Judgement, _Collector, _compare, _judge_bench, sandbox_failures
from gpuyantra.verifier.sandbox import SandboxOutcome, scrubbed_env

CONTRACT_KEYS = ["op", "accepted", "reward", "failures", "speedup_vs_eager", "speedup_vs_compile"]
EXTRA_KEYS = [
    "kernel_us",
    "eager_us",
    "compile_us",
    "compile_ro_us",
    "floor_us",
    "checks",
    "seconds",
    "shapes",
    "plan_classes",
    "dtypes",
    "device",
    "module_class",
    "network_isolated",
    "isolation",
    "bench",
    "source_sha256",
    "attestation",
    "timings",
    "library_calls",
]


@pytest.mark.parametrize(
    "device,eager,compiled,reward",
    [
        ("cuda", 1.00, 0.50, 1),  # correct, not faster
        ("cuda", 1.05, 0.90, 1),  # 5% is not "more than 5%"
        ("cuda", 1.06, 0.90, 2),  # faster than eager only
        ("cuda", 7.24, 1.39, 3),  # faster than both
        ("cuda", 2.00, None, 2),  # compile baseline unavailable: at most +2
        ("cpu", 9.00, 9.00, 1),  # speed is not judged under the interpreter
    ],
)
def test_reward_ladder(device, eager, compiled, reward):
    assert compute_reward([], device, eager, compiled) == reward


def test_any_failure_is_minus_one():
    assert compute_reward([Failure("correctness", "wrong-values", "x")], "cuda", 10.0, 10.0) == -1


def bench_results(kernel_us, eager_us=10.0, compile_us=8.0, ro_us=6.0, nbytes=8 * 2**20, bandwidth=4000.0):
    return {
        "copy_bandwidth_gbs": bandwidth,
        "bench": [
            {
                "shape": [2048, 2048],
                "dtype": "float16",
                "kernel_us": kernel_us,
                "eager_us": eager_us,
                "compile_us": compile_us,
                "compile_ro_us": ro_us,
                "bytes": nbytes,
                "errors": {},
            }
        ],
    }


def test_benchmark_speedups_use_the_best_compile_mode():
    j = Judgement()
    _judge_bench(bench_results(kernel_us=5.0), j)
    assert j.failures == []
    assert j.speedup_vs_eager == pytest.approx(2.0) and j.speedup_vs_compile == pytest.approx(6.0 / 5.0)
    assert j.floor_us == pytest.approx(8 * 2**20 / 4000e9 * 1e6)


def test_faster_than_the_physical_floor_is_implausible():
    j = Judgement()
    _judge_bench(bench_results(kernel_us=0.1), j)  # 8 MiB at 4 TB/s needs ~2.1 us
    assert [(f.layer, f.rule) for f in j.failures] == [("benchmark", "implausible-speed")]


def test_a_floor_from_a_low_bandwidth_reading_is_measured_again_before_it_rejects(monkeypatch, state):
    import copy

    from gpuyantra.verifier import bench, core

    results = bench_results(kernel_us=2.0, bandwidth=2500.0)  # 8 MiB: floor 3.4 us at 2.5 TB/s
    results["device_name"] = "H200"
    rows = copy.deepcopy(results["bench"])
    first = Judgement()
    _judge_bench(results, first)
    assert [f.rule for f in first.failures] == ["implausible-speed"]
    monkeypatch.setattr(bench, "measure_copy_bandwidth", lambda: 4280.0)  # the GPU alone, clocks up
    assert core._floor_in_doubt(first, results, rows)
    assert results["copy_bandwidth_gbs"] == 4280.0 and results["bench"] == rows  # judged again from scratch
    again = Judgement()
    _judge_bench(results, again)
    assert again.failures == [] and again.floor_us == pytest.approx(8 * 2**20 / 4280e9 * 1e6)
    # A kernel under the floor of the better reading too stays rejected: nothing to judge again.
    cheat = bench_results(kernel_us=0.1, bandwidth=4280.0)
    cheat["device_name"] = "H200"
    rejected = Judgement()
    _judge_bench(cheat, rejected)
    assert not core._floor_in_doubt(rejected, cheat, copy.deepcopy(cheat["bench"]))
    assert [f.rule for f in rejected.failures] == ["implausible-speed"]


def test_kernel_that_fails_under_timing():
    j = Judgement()
    results = bench_results(kernel_us=None)
    results["bench"][0]["errors"]["kernel"] = "RuntimeError: boom"
    _judge_bench(results, j)
    assert [(f.layer, f.rule) for f in j.failures] == [("benchmark", "benchmark-failed")]


@pytest.mark.parametrize(
    "outcome,rule",
    [
        (SandboxOutcome(timed_out=True), "timeout"),
        (SandboxOutcome(memory_exceeded=True, peak_rss=5 * 2**30), "memory-limit"),
        (SandboxOutcome(returncode=-signal.SIGXCPU), "cpu-limit"),
        (SandboxOutcome(returncode=-signal.SIGSEGV), "crash"),
        (SandboxOutcome(returncode=-signal.SIGKILL), "crash"),
        (SandboxOutcome(returncode=0), "early-exit"),
        (SandboxOutcome(returncode=3, stderr_tail="Traceback ...\nSystemError: x"), "crash"),
        (SandboxOutcome(returncode=0, results={"checks": []}, leftover=[12345]), "forked-process"),
    ],
)
def test_sandbox_outcomes(outcome, rule):
    failures = sandbox_failures(outcome, timeout=10, memory_limit=2**30)
    assert rule in {f.rule for f in failures} and all(f.layer == "sandbox" for f in failures)


def test_scrubbed_environment_drops_secrets(monkeypatch, tmp_path):
    for name in ("GPUYANTRA_ADMIN_TOKEN", "GOOGLE_API_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "GITHUB_TOKEN"):
        monkeypatch.setenv(name, "secret")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    env = scrubbed_env("cpu", tmp_path, threads=2)
    assert not [k for k, v in env.items() if v == "secret"]
    assert env["HOME"] == str(tmp_path / "home") and env["TRITON_INTERPRET"] == "1"
    assert set(env) <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "PYTHONPATH",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONHASHSEED",
        "PYTHONNOUSERSITE",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TRITON_HOME",
        "TRITON_INTERPRET",
        "TRITON_CACHE_DIR",
        "TRITON_CACHE_MANAGER",
        "GPUYANTRA_SHARED_TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "GPUYANTRA_SHARED_INDUCTOR_CACHE_DIR",
        "CUDA_VISIBLE_DEVICES",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        "CUDA_HOME",
        "CUDA_PATH",
    }


def test_every_element_is_checked():
    want = torch.linspace(-2, 2, 1000, dtype=torch.float64).reshape(10, 100)
    c = _Collector()
    got = want.to(torch.float16)
    _compare(got, want, (2e-3, 2e-3), 0, "case", c)
    assert c.first == {}
    got[9, 99] += 0.05  # one element of a thousand
    _compare(got, want, (2e-3, 2e-3), 0, "case", c)
    assert ("correctness", "wrong-values") in c.first and "(9, 99)" in c.first[("correctness", "wrong-values")]
    poisoned = want.to(torch.float16)
    poisoned[3, 7] = float("nan")
    c = _Collector()
    _compare(poisoned, want, (2e-3, 2e-3), 0, "case", c)
    assert list(c.first) == [("correctness", "nan-output")]


def test_cases_are_reproducible_and_parameters_random():
    family = get_op("rms_norm")
    specs = [{"name": "weight", "kind": "tensor", "shape": ["H"]}, {"name": "eps", "kind": "float", "value": 1e-6}]
    case = Case(0, "main", "float16", (3, 64), 2, -1.0)
    (x1,), p1 = make_case(family, case, specs)
    (x2,), p2 = make_case(family, case, specs)
    assert torch.equal(x1, x2) and torch.equal(p1["weight"], p2["weight"]) and x1.dtype == torch.float16
    weight = p1["weight"].float()
    assert not torch.all(weight == 1) and weight.std() > 0.2  # never weight = 1
    (x3,), _ = make_case(family, Case(1, "main", "float16", (3, 64), 2, 3.0), specs)
    assert not torch.equal(x1, x3)


def test_plan_covers_seeds_shapes_distributions():
    shapes = correctness_shapes("cpu", [[1, 2048], [512, 64]])
    assert shapes[:2] == [[1, 2048], [64, 64]]  # live first, rows capped under the interpreter
    cases = plan("cpu", shapes, ["float32", "float16"])
    # 5 seeds x 4 scales of N(0, 1) and 2 seeds x 2 activation-like distributions per (shape, dtype).
    assert len(cases) == len(shapes) * 2 * (5 * 4 + 2 * 2)
    assert {c.scale for c in cases} == {1.0, 3.0, 0.01, -1.0} and {c.seed for c in cases} == set(range(5))
    assert any(c.phase == "recheck" for c in plan("cuda", shapes, ["float16"], recheck=True))


def test_verdict_json_shape_is_stable():
    verdict = Verdict(
        op="rms_norm",
        accepted=False,
        reward=-1,
        failures=[Failure("static", "torch-compute", "line 3: torch.rsqrt")],
        kernel_us=math.nan,
    )
    data = verdict.to_dict()
    assert list(data)[:6] == CONTRACT_KEYS and list(data)[6:] == EXTRA_KEYS
    assert data["failures"] == [{"layer": "static", "rule": "torch-compute", "message": "line 3: torch.rsqrt"}]
    assert data["kernel_us"] is None  # NaN is not JSON
    json.loads(json.dumps(data, allow_nan=False))


def test_a_baseline_timed_below_the_physical_floor_leaves_the_speedups():
    """torch.compile (or eager) faster than the bytes over copy bandwidth did not do the work: it is
    kept in the row as implausible and compared against by no speedup; the candidate is not at fault."""
    j = Judgement()
    results = bench_results(kernel_us=5.0)  # 8 MiB at 4 TB/s: the floor is ~2.1 us
    row = results["bench"][0]
    row["compile_us"], row["compile_ro_us"] = 0.5, None
    _judge_bench(results, j)
    assert j.failures == [] and j.speedup_vs_eager == pytest.approx(2.0)
    assert j.speedup_vs_compile is None and row["implausible_baselines"] == {"compile_us": 0.5}
