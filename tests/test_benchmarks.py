"""The GPU benchmarks' own code paths, end to end on the CPU (`--smoke`: tiny-qwen2, Triton's
interpreter), so a benchmark cannot rot between GPU sessions. Timings here mean nothing; the
checks they make (kernel inside the graph, greedy agreement, no failed request) do."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_bench(
    script: str,
    out: Path,
    timeout: int,
    mode: str = "--smoke",
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    exit_codes: tuple[int, ...] = (0,),
) -> dict:
    """The script in its CPU mode (`--smoke`, or `--dry-run` for the kernel sweeps) with `extra`
    arguments and `env` variables; its JSON."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), mode, "--out", str(out), *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode in exit_codes, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


# The smoke's sections in four runs the test workers take in parallel (the interpreter makes each
# swap and graph capture slow): the three longest groups of sections alone, then every other section.
FUSED = "graphs+attn+fused+swaps"  # with its run-ahead off and on again
SWAPS_AND_LINEAR = f"{FUSED}+linear"
CAMPAIGN_ORDER = "order projections first"
SERVING_SMOKE_PARTS = {
    "campaign_order": ("--sections", CAMPAIGN_ORDER),
    "linear_and_norms": ("--sections", SWAPS_AND_LINEAR),
    "fused": ("--sections", FUSED, "--skip-sections", SWAPS_AND_LINEAR),
    "the_rest": ("--skip-sections", f"{CAMPAIGN_ORDER},{FUSED}"),
}


@pytest.mark.parametrize("part", list(SERVING_SMOKE_PARTS))
def test_serving_bench_smoke(tmp_path, part):
    result = run_bench("serving_bench.py", tmp_path / "serving.json", 600, extra=SERVING_SMOKE_PARTS[part])
    assert result["errors"] == {}
    paths = result["results"]
    if part == "campaign_order":
        assert list(paths) == [CAMPAIGN_ORDER]
        ordered = paths[CAMPAIGN_ORDER]
        assert [s["swap"] for s in ordered["steps"]][1:] == ["rope", "rms_norm", "silu_mul"]
        assert ordered["steps"][0]["swap"].startswith("linear:")
        assert ordered["with_prefill_graphs"]["batch1"]["tokens_per_s"] > 0 and ordered["eager_prefill"]["batch2"]
    elif part == "linear_and_norms":
        swapped = [s["op"] for s in paths["graphs+attn+fused+swaps+linear+add_norm"]["swaps"] if "binding" in s]
        assert {"linear", "add_rms_norm"} <= set(swapped), swapped
    elif part == "fused":
        assert sorted(paths) == [FUSED, f"{FUSED} again", f"{FUSED} waiting"]
        assert paths[FUSED]["fused_projection_groups"], paths[FUSED]
    else:
        assert CAMPAIGN_ORDER not in paths and not any(name.startswith(FUSED) for name in paths)
        assert result["checks"]["check_counter_in_graph"]["ok"]
        assert result["checks"]["check_weights_live_in_graph"]["ok"]
        final = paths["graphs+attn+swaps"]
        assert final["decode_attention"] == "triton"
        assert [s["op"] for s in final["swaps"]] == ["rms_norm", "rope", "silu_mul"]
        assert final["attention_calls_before_bench"]["kernel"] > 0
    for name, section in paths.items():
        for key, value in section.items():
            if key.startswith("batch") and "agrees_with_eager_first_tokens" in value:
                assert value["agrees_with_eager_first_tokens"] == len(value["output_ids"]), (name, key)


def test_http_serving_bench_smoke(tmp_path):
    result = run_bench("http_serving_bench.py", tmp_path / "http.json", 600)
    assert result["errors"] == []
    assert [s["http"] for s in result["swaps"]] == [200, 200, 200]
    assert result["during_swaps"]["failed"] == 0
    assert result["rollback"]["http"] == 200 and result["rollback"]["active"] == []
    assert result["after_rollback_equals_before"]


def test_abuse_bench_smoke(tmp_path):
    """benchmarks/abuse_bench.py on a served tiny chat model (random weights, from a local Hugging Face
    cache): the normal chat streams alone and beside each abusive client. What each abusive request
    got is the server's published answer; the verdict (a timing) is left to the GPU run."""
    from tests.serving.helpers import write_hf_cache_model

    write_hf_cache_model(tmp_path / "hub")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    extra = ("--model", "gpuyantra-test/tiny-chat", "--seconds", "2", "--flood", "6")
    extra += ("--serve-arg=--max-client-requests=4",)  # the flood (6 at once) meets the per-client limit
    extra += ("--serve-arg=--header-timeout=1",)  # within the 2 s phase: the loris is answered and closed
    result = run_bench("abuse_bench.py", tmp_path / "abuse.json", 300, extra=extra, env=env, exit_codes=(0, 1))
    assert result["endpoint"] == "chat" and result["largest_n"] == 128
    for name in ("baseline", "abuse"):
        normal = result["phases"][name]["normal"]
        assert normal["failed"] == 0 and normal["ok"] > 0, (name, normal)
        assert normal["total_s"]["p99"] is not None and result["phases"][name]["healthz_s"]["failed"] == []
    abuse = result["phases"]["abuse"]["abuse"]
    assert abuse["many_prompts"]["status"] == 400 and "320 choices" in abuse["many_prompts"]["detail"]
    assert abuse["body_declared"]["status"] == 413 and abuse["body_chunked"]["status"] == 413
    assert abuse["largest_allowed"]["status"] == 200 and abuse["largest_allowed"]["n"] == 128
    assert abuse["slow_loris_0"]["bytes_sent"] > 0
    assert abuse["slow_loris_0"]["closed_by_server"] and abuse["slow_loris_0"]["status"] == 408, abuse["slow_loris_0"]
    assert set(abuse["flood"]["statuses"]) <= {"200", "429"} and abuse["flood"]["statuses"]["429"] > 0
    assert len({a["source"] for a in abuse.values()}) == len(abuse)  # each from its own address
    assert set(result["verdict"]) == {"pass", "p99_ratio", "reasons"}


def test_linear_gemv_dry_run(tmp_path):
    """benchmarks/linear_gemv.py on tiny shapes in the interpreter: every method times at 1, 8 and 54
    rows (the template's three regimes), the template's best point is checked against F.linear."""
    result = run_bench("linear_gemv.py", tmp_path / "linear.json", 300, mode="--dry-run")
    assert result["dry_run"] and result["copy_bandwidth_gbs"] > 0
    assert {(r["shape"], r["batch"]) for r in result["rows"]} == {
        (name, batch) for name in ("tiny_qkv", "tiny_down") for batch in (1, 8, 54)
    }
    for row in result["rows"]:
        for method in ("cublas", "compile", "template"):
            assert row[method]["us"] > 0 and row[method]["pct_copy_bw"] >= 0, (row["shape"], method, row[method])
        assert row["template"]["max_abs_err"] < 1e-4 and row["template"]["strategy"]
        assert row["template"]["regime"] == {1: "gemv", 8: "small", 54: "big"}[row["batch"]]
        assert row["template"]["knobs"]


GEMV_VARIANTS = ("static", "splitk_sem", "loop")
GEMV_TOL = 1e-2  # bf16 output: one rounding (the interpreter truncates: up to 2^-7 of the largest |y|)


def test_gemv_variants_dry_run(tmp_path):
    """benchmarks/gemv_variants.py on tiny shapes in the interpreter: every decode-GEMV variant
    (static unroll, split-K with the semaphore reduction, dynamic loop) ran every planned config and
    was right against F.linear; timings mean nothing here."""
    result = run_bench("gemv_variants.py", tmp_path / "gemv_variants.json", 180, mode="--dry-run")
    assert result["dry_run"] and result["copy_bandwidth_gbs"] > 0 and result["dtype"] == "bfloat16"
    assert {(r["shape"], r["m"]) for r in result["rows"]} == {
        (name, m) for name in ("tiny", "tiny_bias") for m in (1, 3)
    }
    for row in result["rows"]:
        where = (row["shape"], row["m"])
        for method in ("cublas", "template", "template_start"):
            assert row[method]["us"] > 0 and row[method]["rel_err"] < GEMV_TOL, (where, method, row[method])
        assert set(row["variants"]) == set(GEMV_VARIANTS)
        for variant, bucket in row["variants"].items():
            assert not (bucket["failed"] or bucket["rejected"] or bucket["skipped"]), (where, variant, bucket)
            assert len(bucket["timed"]) == bucket["planned"] >= 2, (where, variant)
            for record in bucket["timed"]:
                assert record["us"] > 0 and record["rel_err"] < GEMV_TOL, (where, variant, record)
            assert bucket["best"]["us"] == min(r["us"] for r in bucket["timed"])
    # The configs cover what could go wrong: a ragged K (130), a partial N block (20 of 8 or 16),
    # an uneven split with masked steps, and every num_stages.
    tiny_bias = next(r for r in result["rows"] if r["shape"] == "tiny_bias")
    splits = {rec["config"]["split"] for rec in tiny_bias["variants"]["splitk_sem"]["timed"]}
    assert {2, 3, 4} <= splits
    stages = {rec["config"]["stages"] for rec in tiny_bias["variants"]["loop"]["timed"]}
    assert stages == {1, 3, 4}


@pytest.mark.integration
def test_campaign_bench_smoke(tmp_path):
    """benchmarks/campaign_bench.py on real parts (Temporal dev server, CPU and GPU workers, a served
    tiny-qwen2): a cold and a warm rms_norm campaign, timed from the workflow history, with the
    served speed measured around them and the reports written."""
    out = tmp_path / "campaign"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "campaign_bench.py"),
            "--smoke",
            "--skip-compile",
            "--budget-s",
            "500",
            "--state-dir",
            str(tmp_path / "state"),
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "campaign_bench.json").read_text())
    assert {name: p["status"] for name, p in result["phases"].items()} == dict.fromkeys(
        ("start", "before", "cold", "warm", "after", "reports", "bisect"), "ok"
    )
    # The bisection runs only when the greedy completion changed; it says so either way.
    assert result["bisect"].get("culprit") or result["bisect"].get("skipped")
    for label in ("cold", "warm"):
        campaign = result[label]
        assert campaign["exit_code"] == 0 and [d["op"] for d in campaign["deployed"]] == ["rms_norm"]
        assert 0 < campaign["timeline"]["first_deploy_workflow_s"] <= campaign["timeline"]["workflow_s"]
        assert 0 < campaign["first_deploy_s"] < campaign["wall_s"]
        assert (out / f"campaign-{label}.json").exists()
        assert "<svg" in (out / f"report-{label}.html").read_text()
    assert result["cold"]["seeded_targets"] == 0 and result["warm"]["seeded_same_op"] == 1  # the skill library
    assert result["deployments"]["same"] and list(result["deployments"]["by_campaign"]) == ["cold", "warm"]
    rollback = result["warm"]["rollback"]
    assert rollback["active_before"] == [["rms_norm", 5]] and rollback["active_after"] == []
    assert rollback["greedy_equal"]  # the original forward, bit for bit
    for label in ("before", "after"):
        for batch in ("batch1", "batch2"):
            assert result[label]["http"][batch]["tokens_per_s"] > 0
            assert result[label]["http_decode"][batch]["tokens_per_s"] > 0  # streamed, after the first token
            assert result[label]["inprocess"][batch]["tokens_per_s"] > 0
    assert [k["op"] for k in result["after"]["kernels"]["active"]] == ["rms_norm"]
    assert "greedy_equal" in result["after"] and "greedy_equal_tokens" in result["after"]
    recorded, forced = result["before"]["forced"], result["after"]["forced"]
    assert len(recorded["token_ids"]) == len(recorded["margins"]) == forced["positions"] > 0
    assert forced["equal_positions"] + len(forced["differences"]) == forced["positions"]
    assert "warm" in proc.stdout and "first_deploy_s" in proc.stdout  # the table


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_campaign_bench():
    return load_bench("campaign_bench")


def test_a_linear_grid_times_every_combination_over_the_start():
    bench = load_bench("linear_gemv")
    grid = bench.parse_grid("SMALL_SWAP_AB=False|True; SMALL_BLOCK_N=16|64;W_EVICTION=evict_first|''")
    assert grid == {"SMALL_SWAP_AB": [False, True], "SMALL_BLOCK_N": [16, 64], "W_EVICTION": ["evict_first", ""]}
    points = bench.template_points(1536, 8960, 8, "bfloat16", "NVIDIA H200", 100, grid)
    start = bench.template_points(1536, 8960, 8, "bfloat16", "NVIDIA H200", 1)[0]
    assert points[0] == start and (start["SMALL_SWAP_AB"], start["SMALL_BLOCK_N"]) == (True, 64)  # the start first
    # then the grid's other points; W_EVICTION is a GEMV knob, so its two values are twins at 8 rows
    assert [(p["SMALL_SWAP_AB"], p["SMALL_BLOCK_N"]) for p in points[1:]] == [(False, 16), (False, 64), (True, 16)]


def test_a_streamed_decode_rate_leaves_the_first_token_out_and_prefixes_count_equal_tokens():
    bench = load_campaign_bench()
    # first event at 1.0 s (prefill ends), then 6 tokens over 0.5 s
    rate = bench.decode_rate([(1.0, 1), (1.1, 2), (1.25, 1), (1.5, 3)])
    assert rate["completion_tokens"] == 7 and rate["tokens_per_s"] == pytest.approx(12.0)
    assert bench.decode_rate([(1.0, 4)])["tokens_per_s"] is None  # one event: no rate
    assert bench.equal_prefix({"token_ids": [1, 2, 3, 4]}, {"token_ids": [1, 2, 9, 4]}) == 2
    assert bench.equal_prefix({"token_ids": [1, 2]}, {"token_ids": [1, 2, 3]}) == 2
    assert bench.equal_prefix({"text": "a"}, {"token_ids": [1]}) is None


def test_the_teacher_forced_check_feeds_the_recorded_token_at_each_difference_and_goes_on():
    bench = load_campaign_bench()
    recorded = {"token_ids": [5, 6, 7, 8, 9, 10], "margins": [1.0, 0.01, 2.0, 1.0, 0.3, 1.0]}

    def served(prefix: list[int], n: int) -> dict:
        # Differs from the recorded tokens after contexts of length 1 and 4; right everywhere else.
        flips = {1: 60, 4: 90}
        ids, context = [], list(prefix)
        for _ in range(n):
            ids.append(flips.get(len(context), recorded["token_ids"][len(context)]))
            context.append(ids[-1])
        return {"token_ids": ids, "margins": [0.5] * n}

    asked: list[list[int]] = []
    result = bench.forced_comparison(recorded, lambda p, n: asked.append(p) or served(p, n), near_tie_nats=0.05)
    assert asked == [[], [5, 6], [5, 6, 7, 8, 9]]  # the recorded token fed past each difference
    assert [(d["position"], d["recorded"], d["got"]) for d in result["differences"]] == [(1, 6, 60), (4, 9, 90)]
    assert result["equal_positions"] == 4 and result["positions"] == 6
    assert [d["recorded_margin"] for d in result["differences"]] == [0.01, 0.3]
    assert not result["all_differences_near_ties"]  # 0.3 nats is no tie
    same = bench.forced_comparison(recorded, lambda p, n: {"token_ids": recorded["token_ids"][len(p) :]}, 0.05)
    assert same["equal_positions"] == 6 and same["differences"] == [] and same["requests"] == 1
    short = bench.forced_comparison(recorded, lambda p, n: {"token_ids": [5, 6]}, 0.05)
    assert short["differences"] == [{"position": 2, "recorded": 7, "got": None}]
    logprobs = {"token_logprobs": [-0.1, -2.0], "top_logprobs": [{"a": -0.1, "b": -1.6}, {"x": -2.0}]}
    assert bench.top_margins(logprobs) == [1.5, None]  # one text for two tokens: no margin
    by_id = {**logprobs, "top_token_logprobs": [[[3, -0.1], [9, -1.6]], [[4, -2.0], [8, -2.03125]]]}
    assert bench.top_margins(by_id) == [1.5, 0.03125]  # by token id: both margins


RMS_PROBLEM = """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(v + self.variance_epsilon))


def get_inputs():
    return [torch.randn(64, 1536)]


def get_init_inputs():
    return [1536]
"""


def test_kernel_resources_compiles_the_launches_for_a_gpu_without_one(tmp_path):
    """benchmarks/kernel_resources.py: the rms_norm template's launches, recorded by the interpreter
    on CPU tensors and compiled for sm_90 by Triton's compiler; a limit below what they need fails."""
    problem = tmp_path / "1_RMSNorm.py"
    problem.write_text(RMS_PROBLEM)
    candidate = tmp_path / "rms_norm.py"
    candidate.write_text((REPO / "gpuyantra" / "kernels" / "rms_norm.py").read_text())
    argv = [sys.executable, str(REPO / "benchmarks" / "kernel_resources.py"), str(candidate), "--problem", str(problem)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run([*argv, "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    [launch] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert launch["kernel"] == "_rms_norm_rows" and launch["constexprs"]["H"] == 1536
    assert launch["shared_bytes"] > 0 and "num_warps" in launch["options"]  # the row sum's partials
    proc = subprocess.run([*argv, "--limit", "-1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "1 over the -1 B limit" in proc.stdout
    proc = subprocess.run([*argv, "--set", "nonsense"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "expected KERNEL:NAME=VALUE" in proc.stderr


def test_linear_verdicts_verifies_the_template_at_a_knob_point_and_refuses_unknown_knobs(tmp_path):
    argv = [sys.executable, str(REPO / "benchmarks" / "linear_verdicts.py"), "--device", "cpu", "--weight", "8x32"]
    argv += ["--shapes", "2x1x32", "--dtype", "float32", "--out", str(tmp_path / "points.json")]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [*argv, "--points", "BLOCK_N=2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (point,) = json.loads((tmp_path / "points.json").read_text())["points"]
    assert point["point"] == {"BLOCK_N": "2"} and point["accepted"] is True and point["failures"] == []
    bad = subprocess.run(
        [*argv, "--points", "NO_SUCH_KNOB=1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0 and "NO_SUCH_KNOB is not a module constant" in bad.stderr


def test_mixed_rows_sweep_smoke(tmp_path):
    """benchmarks/mixed_rows_sweep.py on tiny-qwen2: a mixed graph per prompt budget beside the full
    decode step, each timed (eager steps here: the times mean nothing)."""
    result = run_bench("mixed_rows_sweep.py", tmp_path / "mixed.json", 300)
    assert [(r["prompt_tokens"], r["rows"]) for r in result["rows"]] == [(4, 6), (8, 10)]
    for row in result["rows"]:
        assert row["decode_ms"]["min_ms"] > 0 and row["mixed_ms"]["min_ms"] > 0
        assert row["extra_measured_ms"] is None  # measured only where graphs are captured


def test_temporal_round_trips_smoke():
    """benchmarks/temporal_round_trips.py: a dev server per SQLite journal, a worker process with a
    lock-holding thread and a client process; one round of six workflows per setting, each at least
    its 1 s activity."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "temporal_round_trips.py")]
        + ["--threads", "1", "--rounds", "1", "--repeats", "1", "--switch-ms", "5,1", "--sqlite", "default,wal"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(run["sqlite"], run["switch_ms"]) for run in runs] == [
        ("default", 5.0),
        ("default", 1.0),
        ("wal", 5.0),
        ("wal", 1.0),
    ]
    assert all(len(run["beyond_activity_s"]) == 1 and run["beyond_activity_s"][0] >= 0 for run in runs)
