"""The report says what the result says, on every device: a kept swap never reads as rolled back, a
nominal matmul rate is not shown as 0 TFLOP/s nor called measured, and the profile chart estimates
"after" only for the targets the campaign searched."""

from __future__ import annotations

import re
import warnings
from typing import Any

from gpuyantra.report import render_html
from gpuyantra.report.result import fmt_rate, text_summary
from tests.report.results import cpu_result, profile, speed
from tests.report.test_report import chart

CPU_SPEC = {"device": "cpu", "measured": False, "copy_bytes_per_s": 1e10, "matmul_flops_per_s": 5e10, "ridge": 5.0}


def kept_cpu_swap_with_batches() -> dict[str, Any]:
    """The demo's shape: a CPU swap kept although batch 8's drop exceeded its noise (speed not judged)."""
    result = cpu_result()
    entry = result["deployed"][0]
    entry["served_speed"]["batches"] = {
        "1": {"before": speed(103.5), "after": speed(23.5), "drop": 0.772, "noise": 6.7, "decision": "keep"},
        "8": {"before": speed(4067.4), "after": speed(31.9), "drop": 0.992, "noise": 0.707, "decision": "rollback"},
    }
    return result


def test_a_kept_cpu_swap_never_reads_rollback() -> None:
    page = render_html(kept_cpu_swap_with_batches())
    around = re.search(r"<p>Served decode around this swap, (.*?)</p>", page).group(1)
    assert "(rollback)" not in around and "judged: False" not in around
    assert "(kept: speed is not judged on this device)" in around
    assert "served speed not judged: a cpu verdict is judged on correctness only" in around


def test_a_nominal_matmul_rate_is_shown_in_its_unit_and_not_called_measured() -> None:
    result = {**cpu_result(), "profile": {**profile(), "device": "cpu", "hardware_spec": CPU_SPEC}}
    page = render_html(result)
    device = page[page.index("<h2>Device</h2>") :]
    assert "0 TFLOP/s" not in device
    assert "<td>matmul rate</td><td>50 GFLOP/s</td><td>nominal (hardware spec, not measured on this device)" in device
    assert "<td>ridge point</td><td>5 FLOP/byte</td>" in device
    assert fmt_rate(7.98e14, "FLOP/s") == "798 TFLOP/s" and fmt_rate(4.13e12, "B/s") == "4.13 TB/s"


def test_targets_the_campaign_did_not_search_have_no_estimate_after() -> None:
    result = {**cpu_result(), "profile": profile()}
    result["hardware"] = "NVIDIA H200"  # a GPU campaign on rms_norm only
    result["deployed"][0]["verdict"] = {**result["deployed"][0]["verdict"], "device": "cuda"}
    page = render_html(result)
    assert "Estimated after a swap only for the targets this campaign searched: rms_norm (Qwen2RMSNorm);" in page
    profiled = {t["op"]: t for t in profile()["targets"]}
    texts = chart(page, "Profile targets:")
    assert f"{profiled['rms_norm']['est_cost_after_us']:,.0f}" in texts  # the searched target's estimate
    assert f"{profiled['rope']['est_cost_after_us']:,.0f}" not in texts  # none for a target not searched


def test_on_a_cpu_no_target_is_estimated_after() -> None:
    result = {**cpu_result(), "profile": profile()}
    page = render_html(result)
    assert "No target is estimated after a swap: on the CPU speed is not judged." in page
    texts = chart(page, "Profile targets:")
    estimates = {str(t.get("est_cost_after_us")) for t in profile()["targets"]}
    assert not estimates & {text.replace(",", "") for text in texts}


def test_the_summary_says_where_and_how_fast_at_each_batch() -> None:
    summary = text_summary(kept_cpu_swap_with_batches())
    assert summary[0].startswith("Campaign campaign-tiny-qwen2")
    assert "1 deployed into http://127.0.0.1:9000" in summary[0]
    assert any(line.startswith("  deployed rms_norm (Qwen2RMSNorm): reward +1") for line in summary)
    assert any("speed not judged on cpu" in line for line in summary)
    assert any(line.startswith("  served decode: 40.0 -> 3.0 tokens/s (-92.5%") for line in summary)


def test_ten_profile_targets_with_a_long_open_target_keep_their_bars() -> None:
    """The demo's profile (ten targets, an open target's long name): matplotlib keeps room for the bars."""
    shown = profile()
    long_name = {"op": "open.qwen2rotaryembedding_db31e62f1f", "module_class": "Qwen2RotaryEmbedding"}
    shown["targets"] = [
        {**shown["targets"][i % 2], **(long_name if i == 8 else {}), "cost_us": 1000.0 + i} for i in range(10)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        render_html({**cpu_result(), "profile": shown})
