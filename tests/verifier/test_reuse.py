"""What a verification reuses: warm sandbox children, cached compile baselines, one GPU timing lock."""

from __future__ import annotations

import fcntl
import os

import pytest

from gpuyantra.verifier import baselines, run_verification
from gpuyantra.verifier import sandbox as sandbox_module
from gpuyantra.verifier.gpu_locks import time_alone
from tests.verifier.conftest import can_take, candidate_path

QUICK = {"seeds": (0,), "dtypes": ["float32"]}


def test_keep_warm_leaves_a_started_child_that_the_next_verification_takes(state):
    first = run_verification(candidate_path("honest_rowwise"), device="cpu", keep_warm=True, **QUICK)
    assert first.accepted
    ((spare,),) = sandbox_module._SPARES.values()
    assert spare.proc is not None and spare.proc.poll() is None  # started, waiting for its job
    pid = spare.proc.pid
    taken = sandbox_module.take_sandbox("cpu")
    assert taken is spare and taken.proc.pid == pid and list(sandbox_module._SPARES.values()) == [[]]
    taken.close()
    second = run_verification(candidate_path("cheat_ignores_weight"), device="cpu", keep_warm=False, **QUICK)
    assert not second.accepted  # a fresh child judges as before


def test_a_dead_spare_is_replaced_not_used(state):
    sandbox_module.keep_spare("cpu")
    ((spare,),) = sandbox_module._SPARES.values()
    spare.proc.kill()
    spare.proc.wait()
    fresh = sandbox_module.take_sandbox("cpu")
    assert fresh is not spare and fresh.proc is None
    fresh.close()


def test_baselines_round_trip_per_op_shape_dtype_and_device(state):
    rows = [
        {
            "shape": [1, 1536],
            "dtype": "bfloat16",
            "eager_us": 30.0,
            "eager_launch_us": 41.0,
            "compile_us": 17.5,
            "compile_ro_us": 22.0,
        },
        {
            "shape": [4096, 1536],
            "dtype": "bfloat16",
            "compile_us": 55.0,
            "compile_ro_us": None,
            "errors": {"compile_ro_us": "failed"},
        },
    ]
    baselines.store_baselines("rms_norm", "M", rows, "H200")
    got = baselines.cached_baselines("rms_norm", "M", [[1, 1536], [4096, 1536], [8, 8]], "bfloat16", "H200")
    assert got == {
        "1x1536": {"eager_us": 30.0, "eager_launch_us": 41.0, "compile_us": 17.5, "compile_ro_us": 22.0},
        "4096x1536": {"compile_us": 55.0},
    }
    assert baselines.cached_baselines("rms_norm", "M", [[1, 1536]], "float16", "H200") == {}
    assert baselines.cached_baselines("rms_norm", "M", [[1, 1536]], "bfloat16", "H100") == {}
    assert baselines.cached_baselines("softmax", "M", [[1, 1536]], "bfloat16", "H200") == {}
    # A reused value is not written back as if measured again.
    baselines.store_baselines(
        "rms_norm",
        "M",
        [
            {
                "shape": [1, 1536],
                "dtype": "bfloat16",
                "compile_us": 99.0,
                "eager_us": 9.0,
                "cached": ["compile_us", "eager_us"],
            }
        ],
        "H200",
    )
    kept = baselines.cached_baselines("rms_norm", "M", [[1, 1536]], "bfloat16", "H200")["1x1536"]
    assert (kept["compile_us"], kept["eager_us"]) == (17.5, 30.0)


def test_baselines_are_kept_per_parameter_set(state):
    # q/k/v and o_proj take the same activations: their eager and compile times must not be shared.
    qkv = baselines.params_digest([{"name": "weight", "kind": "tensor", "shape": [2048, 1536]}])
    o_proj = baselines.params_digest([{"name": "weight", "kind": "tensor", "shape": [1536, 1536]}])
    assert qkv != o_proj
    row = {"shape": [8, 1, 1536], "dtype": "bfloat16", "eager_us": 9.2, "compile_us": 9.3}
    baselines.store_baselines("linear", "Linear", [row], "H200", qkv)
    assert baselines.cached_baselines("linear", "Linear", [[8, 1, 1536]], "bfloat16", "H200", o_proj) == {}
    assert baselines.cached_baselines("linear", "Linear", [[8, 1, 1536]], "bfloat16", "H200", qkv) == {
        "8x1x1536": {"eager_us": 9.2, "compile_us": 9.3}
    }


def test_a_bench_row_reuses_baselines_only_when_every_key_was_kept():
    from gpuyantra.verifier.bench import EAGER_KEYS, _reuse_cached

    row: dict = {}
    assert not _reuse_cached(row, {"eager_us": 3.0}, EAGER_KEYS) and row == {}
    assert not _reuse_cached(row, None, EAGER_KEYS)
    assert _reuse_cached(row, {"eager_us": 3.0, "eager_launch_us": 9}, EAGER_KEYS)
    assert row == {"eager_us": 3.0, "eager_launch_us": 9.0, "cached": ["eager_us", "eager_launch_us"]}


def test_bandwidth_cache_is_kept_per_device_name(state):
    baselines.store_bandwidth("H200", 4280.0)
    baselines.store_bandwidth(None, 1.0)
    assert baselines.bandwidth_cache() == {"H200": 4280.0}


def test_a_lower_bandwidth_reading_never_replaces_a_higher_one(state):
    # Low clocks and others' work only slow a copy: the best reading is the nearest to the truth.
    assert baselines.store_bandwidth("H200", 2900.0) == 2900.0
    assert baselines.store_bandwidth("H200", 4280.0) == 4280.0
    assert baselines.store_bandwidth("H200", 3100.0) == 4280.0
    assert baselines.store_bandwidth("H200", None) == 4280.0
    assert baselines.bandwidth_cache() == {"H200": 4280.0}


def test_a_bandwidth_measured_again_is_measured_alone_and_keeps_the_better(state):
    seen: list[bool] = []

    def measure(value: float):
        def run() -> float:
            seen.append(can_take(baselines.timing_lock().with_name("gpu-quiet.lock"), fcntl.LOCK_SH))
            return value

        return run

    baselines.store_bandwidth("H200", 2900.0)
    assert baselines.remeasure_bandwidth("H200", measure(4280.0)) == 4280.0
    assert baselines.remeasure_bandwidth("H200", measure(3000.0)) == 4280.0
    assert seen == [False, False]


def test_timing_lock_is_exclusive_while_held(state):
    path = baselines.timing_lock()
    with time_alone(path):
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released once the block ends
    finally:
        os.close(fd)


def test_the_copy_bandwidth_is_measured_once_with_the_gpu_alone(state):
    seen: list[bool] = []

    def measure() -> float:
        seen.append(can_take(baselines.timing_lock().with_name("gpu-quiet.lock"), fcntl.LOCK_SH))
        return 4280.0

    assert baselines.measure_bandwidth_if_missing("H200", measure) is True
    assert seen == [False]  # nobody else could use the GPU meanwhile
    assert baselines.bandwidth_cache() == {"H200": 4280.0}
    assert baselines.measure_bandwidth_if_missing("H200", measure) is False and len(seen) == 1
