"""Campaign results as workflows/campaign.py returns them, for report and CLI tests: one verified on
a GPU (timed, with benchmark rows) and one on a CPU (speed not judged)."""

from __future__ import annotations

from typing import Any


def bench_row(shape: list[int], kernel_us: float, floor_us: float, nbytes: int) -> dict[str, Any]:
    return {
        "shape": shape,
        "kernel_us": kernel_us,
        "eager_us": kernel_us * 3,
        "compile_us": kernel_us * 1.4,
        "compile_ro_us": None,
        "floor_us": floor_us,
        "bytes": nbytes,
    }


def speed(tokens: float, spread: float = 0.04) -> dict[str, Any]:
    return {
        "tokens_per_s": tokens,
        "min": tokens * (1 - spread / 2),
        "max": tokens * (1 + spread / 2),
        "relative_spread": spread,
        "repeats": 5,
        "measured": "benchmark",
    }


def gpu_result(candidate_path: str | None = None) -> dict[str, Any]:
    verdict = {
        "accepted": True,
        "reward": 3,
        "device": "cuda",
        "failures": [],
        "speedup_vs_eager": 3.0,
        "speedup_vs_compile": 1.4,
        "kernel_us": 8.0,
        "eager_us": 24.0,
        "compile_us": 11.2,
        "floor_us": 6.0,
        "shapes": [[1, 1536], [8, 1536]],
        "dtypes": ["bfloat16"],
        "candidate_path": candidate_path,
        "bench": [bench_row([1, 1536], 8.0, 6.0, 9216), bench_row([8, 1536], 10.0, 9.0, 52224)],
    }
    attempts = [
        {
            "iteration": 1,
            "strategy": {"BLOCK": 1024},
            "author": "template",
            "reward": -1,
            "failures": [{"layer": "correctness", "rule": "mismatch", "message": "max abs err 0.5"}],
            "kernel_us": None,
            "floor_us": None,
            "candidate_path": None,
        },
        {
            "iteration": 2,
            "strategy": {"BLOCK": 2048},
            "author": "template",
            "reward": 3,
            "failures": [],
            "kernel_us": 8.0,
            "floor_us": 6.0,
            "candidate_path": candidate_path,
        },
    ]
    return {
        "workflow_id": "campaign-qwen2.5-1.5b-rms_norm-127.0.0.1-8000-20261130-120000-00001",
        "server": "http://127.0.0.1:8000",
        "model": "qwen2.5-1.5b",
        "hardware": "NVIDIA H200",
        "deployed": [
            {
                "op": "rms_norm",
                "module_class": "Qwen2RMSNorm",
                "modules": 57,
                "reward": 3,
                "speedup_vs_eager": 3.0,
                "speedup_vs_compile": 1.4,
                "skill_id": "s-1",
                "iterations": 2,
                "seed_skill_id": None,
                "verdict": verdict,
                "best_iteration": 2,
                "attempts": attempts,
                "swap_id": "w-1",
                "e2e_tokens_per_s": {"before": 250.0, "after": 262.0},
                "served_speed": {
                    "before": speed(250.0),
                    "after": speed(262.0),
                    "judged": True,
                    "drop": -0.048,
                    "noise": 0.04,
                },
            }
        ],
        "rejected": [
            {
                "op": "silu_mul",
                "module_class": "Qwen2MLP",
                "iterations": 1,
                "reason": "no candidate passed verification in 1 iterations (static/forbidden-import: os)",
                "verdict": {
                    "accepted": False,
                    "reward": -1,
                    "device": "cuda",
                    "bench": [],
                    "failures": [{"layer": "static", "rule": "forbidden-import", "message": "os"}],
                },
                "attempts": [],
            },
            {"op": "rope", "reason": "the served model has no module computing rope"},
        ],
        "e2e": {"tokens_per_s_before": 250.0, "tokens_per_s_after": 262.0},
        "served_speed": {"before": speed(250.0), "after": speed(262.0)},
        "warnings": [],
    }


def cpu_result() -> dict[str, Any]:
    verdict = {
        "accepted": True,
        "reward": 1,
        "device": "cpu",
        "failures": [],
        "speedup_vs_eager": None,
        "speedup_vs_compile": None,
        "kernel_us": None,
        "floor_us": None,
        "bench": [],
        "candidate_path": None,
    }
    return {
        "workflow_id": "campaign-tiny-qwen2-rms_norm-127.0.0.1-9000-20261130-120000-00002",
        "server": "http://127.0.0.1:9000",
        "model": "tiny-qwen2",
        "hardware": "cpu",
        "deployed": [
            {
                "op": "rms_norm",
                "module_class": "Qwen2RMSNorm",
                "modules": 5,
                "reward": 1,
                "speedup_vs_eager": None,
                "speedup_vs_compile": None,
                "skill_id": "s-2",
                "iterations": 1,
                "verdict": verdict,
                "attempts": [],
                "served_speed": {
                    "before": speed(40.0),
                    "after": speed(3.0),
                    "judged": False,
                    "drop": 0.92,
                    "noise": 0.04,
                },
            }
        ],
        "rejected": [],
        "e2e": {"tokens_per_s_before": 40.0, "tokens_per_s_after": 3.0},
        "served_speed": {"before": speed(40.0), "after": speed(3.0)},
        "warnings": [
            "rms_norm deployed: served speed went from 40.0 to 3.0 tokens/s (92.5% slower; kept: speed "
            "is not judged on a cpu verdict)"
        ],
    }


def profile() -> dict[str, Any]:
    """The server's /admin/profile answer, trimmed to what a report reads (gpuyantra/profiler/model.py)."""
    return {
        "hardware": "nvidia-h200",
        "hardware_spec": {
            "name": "nvidia-h200",
            "device_name": "NVIDIA H200",
            "copy_bytes_per_s": 4.13e12,
            "matmul_flops_per_s": 7.98e14,
            "measured": True,
        },
        "primary_phase": "decode",
        "regime": "launch-bound",
        "busy_fraction": 0.035,
        "step_ms": 88.5,
        "launches_per_step": 1174.0,
        "targets": [
            {
                "op": "rms_norm",
                "module_class": "Qwen2RMSNorm",
                "regime": "launch-bound",
                "cost_us": 14673.02,
                "est_cost_after_us": 5035.92,
            },
            {
                "op": "rope",
                "module_class": "apply_rotary_pos_emb",
                "binding": "function",
                "regime": "memory-bound",
                "cost_us": 9469.2,
                "est_cost_after_us": 2473.79,
            },
        ],
        "phases": {
            "decode": {
                "classes": [
                    {"module_class": "Qwen2Attention", "host_us": 69411.03, "device_us": 671.17, "share": 0.591},
                    {"module_class": "Qwen2RMSNorm", "host_us": 14673.02, "device_us": 651.42, "share": 0.125},
                ]
            }
        },
    }
