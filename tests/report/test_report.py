"""`gpuyantra report`: one offline HTML page from a saved campaign result."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from gpuyantra import config
from gpuyantra.report import render_html
from gpuyantra.report.result import text_summary
from tests.report.results import cpu_result, gpu_result, profile

KERNEL = "import triton\n\n@triton.jit\ndef _rms_norm_kernel(X, W, Y, N: tl.constexpr):\n    pass  # a < b & c\n"


def report_of(result: dict, tmp_path: Path) -> str:
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(result))
    out = tmp_path / "out" / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "gpuyantra.cli", "report", "--from-json", str(saved), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    return out.read_text()


def assert_offline(page: str) -> None:
    assert not re.search(r"https?://", page), re.findall(r".{30}https?://.{30}", page)
    assert "<script" not in page and not re.search(r"""(src|href)=["'](?!#)""", page)
    for svg in re.findall(r"<svg.*?</svg>", page, flags=re.S):
        ElementTree.fromstring(svg)  # each chart is well-formed


def charts_of(page: str) -> dict[str, list[str]]:
    """Each inline chart by its title, with the texts it shows (axis labels, ticks, legend, values)."""
    charts = {}
    for svg in re.findall(r"<svg.*?</svg>", page, flags=re.S):
        root = ElementTree.fromstring(svg)
        charts[str(root.findtext("title"))] = ["".join(text.itertext()) for text in root.iter("text")]
    return charts


def chart(page: str, title_start: str) -> list[str]:
    [texts] = [texts for title, texts in charts_of(page).items() if title.startswith(title_start)]
    return texts


def test_gpu_result_report_shows_every_target_and_figure(tmp_path):
    source = config.candidates_dir() / "report-test" / "rms_norm_Qwen2RMSNorm_2.py"  # where workers keep them
    source.parent.mkdir(exist_ok=True)
    source.write_text(KERNEL)
    page = report_of(gpu_result(str(source)), tmp_path)
    assert_offline(page)
    for name in (
        "rms_norm (Qwen2RMSNorm)",
        "silu_mul (Qwen2MLP)",
        "rope",
        "qwen2.5-1.5b",
        "NVIDIA H200",
        "127.0.0.1:8000",
    ):
        assert name in page
    assert page.count("<svg") == 3  # speedups, roofline, served speed
    speedup = chart(page, "Kernel speedup (x, higher is better; dashed: 1x)")
    assert {"speedup (x)", "vs eager", "vs torch.compile", "1x: no faster", "rms_norm", "3", "1.4"} <= set(speedup)
    roofline = chart(page, "Roofline on NVIDIA H200: attained bandwidth vs bytes moved per call")
    assert {"bytes moved per call", "attained bandwidth (GB/s)", "kernel", "eager", "torch.compile"} <= set(roofline)
    assert "rms_norm (Qwen2RMSNorm): 75.0–90.0% of copy bandwidth" in roofline  # floors 6 and 9 us, kernel 8 and 10
    assert any(text.startswith("copy roof ") and text.endswith(" GB/s") for text in roofline)
    served = chart(page, "Served decode tokens/s before and after")
    assert {"tokens/s", "campaign", "rms_norm swap", "before", "after"} <= set(served)
    assert {"250.0 (spread 4.0%)", "262.0 (spread 4.0%)"} <= set(served)
    overview = page.split("<h2>Per target</h2>")[0]
    assert re.findall(r"<strong>([^<]*): absent.</strong>", overview) == ["Profile chart"]  # the result holds none
    assert "measured by the verifier (bytes / floor time of its benchmark rows)" in overview
    assert "absent: measured with the profile, which this result does not carry" in overview  # matmul rate
    assert "75.0%" in page  # floor 6 us over kernel 8 us: 75% of copy bandwidth
    assert "static/forbidden-import" in page or "forbidden-import" in page
    assert "the served model has no module computing rope" in page
    assert "_rms_norm_kernel" in page and "a &lt; b &amp; c" in page  # the kernel source, escaped
    assert "250.0" in page and "262.0" in page


def test_per_target_section_shows_layers_skill_seed_and_strategies():
    page = render_html(gpu_result()).split("<h2>Per target</h2>")[1]
    deployed, rejected = page.split('<h3 id="silu_mul">')
    assert "<td>benchmark</td><td>passed: x3.00 vs eager, x1.40 vs torch.compile</td>" in deployed
    assert "<td>skill</td><td>s-1</td>" in deployed and "none: written without a seed" in deployed
    assert "{&quot;BLOCK&quot;: 2048}" in deployed and "correctness/mismatch" in deployed  # strategies tried
    assert "<td>static</td><td>failed: forbidden-import</td>" in rejected
    assert "<td>correctness</td><td>not judged (an earlier layer failed)</td>" in rejected


def test_profile_in_the_result_is_drawn_with_the_device_roofs():
    result = {**gpu_result(), "profile": profile()}
    page = render_html(result)
    assert_offline(page)
    assert page.count("<svg") == 5 and ": absent." not in page.split("<h2>Per target</h2>")[0]
    targets = chart(page, "Profile targets: µs per step on the critical path, measured before and estimated after")
    assert {"rms_norm · Qwen2RMSNorm · launch-bound", "rope · apply_rotary_pos_emb · memory-bound"} <= set(targets)
    assert {"measured before", "estimated after", "14,673", "5,036", "µs per step"} <= set(targets)
    classes = chart(page, "Self time per module class (decode step)")
    assert {"Qwen2Attention · 59.1% of step", "host µs", "device µs", "69,411"} <= set(classes)
    assert "Profiled decode step: 88.50 ms, GPU busy 3.5%" in page
    assert "<td>matmul rate</td><td>798 TFLOP/s</td>" in page and "<td>193 FLOP/byte</td>" in page
    assert "copy roof 4,130 GB/s" in chart(page, "Roofline on NVIDIA H200")  # the profile's measured copy rate


def test_profile_after_the_swaps_is_drawn_beside_the_one_before():
    after = profile()
    after["phases"]["decode"]["classes"] = [
        {"module_class": "Qwen2Attention", "host_us": 60000.0, "device_us": 640.5, "share": 0.7},
        {"module_class": "Qwen2RMSNorm", "host_us": 900.0, "device_us": 120.25, "share": 0.02},
    ]
    page = render_html({**gpu_result(), "profile": profile(), "profile_after": after})
    classes = chart(page, "Self GPU time per module class (decode step), before the campaign and after its swaps")
    assert {"Qwen2RMSNorm · 12.5% of step", "before", "after", "651", "120", "µs per step"} <= set(classes)
    assert "Self time per module class (decode step)" not in page  # one class chart, not two


def test_cpu_result_report_says_speed_is_not_judged(tmp_path):
    page = report_of(cpu_result(), tmp_path)
    assert_offline(page)
    assert "speed is not judged" in page
    assert "Speedup chart: absent." in page and "Roofline plot: absent." in page and "Profile chart: absent." in page
    assert page.count("<svg") == 1  # served speed is still measured
    assert {"40.0 (spread 4.0%)", "3.0 (spread 4.0%)"} <= set(chart(page, "Served decode tokens/s"))
    assert "not timed: speed is not judged on cpu" in page
    assert "Kernel source: absent." in page
    assert "92.5% slower" in page  # the warning


def test_report_escapes_what_the_result_holds():
    result = gpu_result()
    result["rejected"][0]["reason"] = "<img src=x onerror=alert(1)>"
    result["deployed"][0]["op"] = "rms<norm>&$x$"
    page = render_html(result)
    assert "<img" not in page and "&lt;img src=x" in page
    assert_offline(page)  # the charts stay well-formed
    assert "rms<norm>&$x$ swap" in chart(page, "Served decode tokens/s")  # shown as written, not as math


def test_report_is_deterministic_and_gpuyantra_starts_without_matplotlib():
    assert render_html(gpu_result()) == render_html(gpu_result())
    code = "import sys, gpuyantra.cli, gpuyantra.report; assert 'matplotlib' not in sys.modules, 'imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_report_without_id_or_json_is_a_usage_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "gpuyantra.cli", "report"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "CAMPAIGN_ID or --from-json" in done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    done = subprocess.run(
        [sys.executable, "-m", "gpuyantra.cli", "report", "--from-json", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "holds no campaign result" in done.stderr


def test_page_without_matplotlib_names_each_chart_absent():
    # gpuyantra on a path without its dependencies installed (a bare GPU machine): the page still renders.
    code = (
        "import sys, json; sys.modules['matplotlib'] = None\n"
        "from gpuyantra.report import render_html\n"
        "from tests.report.results import gpu_result\n"
        "print(render_html(gpu_result()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    page = done.stdout
    assert "<svg" not in page and "Speedup chart: absent." in page and "Roofline plot: absent." in page
    assert "matplotlib cannot be imported here" in page and "rms_norm" in page  # the tables are still there


def test_served_speed_at_each_batch_is_shown_with_each_swaps_decision():
    """A campaign that measured batches 1 and 8: both in the table, and around a swap each batch's
    figures with what became of it (a batch-8 drop beyond the noise that the paired check did not
    confirm: the swap is kept, and the page says so)."""
    result = gpu_result(KERNEL)

    def measured(tps: float, spread: float) -> dict:
        return {"tokens_per_s": tps, "min": tps * (1 - spread), "max": tps, "relative_spread": spread, "repeats": 5}

    result["served_speed"]["batches"] = {
        "1": {"before": measured(293.6, 0.01), "after": measured(474.0, 0.01)},
        "8": {"before": measured(2113.9, 0.02), "after": measured(2336.0, 0.03)},
    }
    entry = result["deployed"][0]
    entry["served_speed"]["batches"] = {
        "1": {**result["served_speed"]["batches"]["1"], "drop": -0.2, "noise": 0.03, "decision": "keep"},
        "8": {
            "before": measured(3860.0, 0.02),
            "after": measured(2336.0, 0.03),
            "drop": 0.395,
            "noise": 0.03,
            "decision": "rollback",
        },
    }
    page = render_html(result)
    served = page[page.index("<h2>Served speed</h2>") : page.index("<h2>Warnings</h2>")]
    for label, median in (("batch 1, before", "293.6"), ("batch 8, before", "2113.9"), ("batch 8, after", "2336.0")):
        assert re.search(rf"<td>{label}</td><td>{re.escape(median)}</td>", served), label
    around = re.search(r"<p>Served decode around this swap, (.*?)</p>", page).group(1)
    assert "batch 1: 293.6 → 474.0 tokens/s" in around and "(keep)" in around
    kept = "drop 39.5% vs noise 3.0% (kept: the paired on/off check did not confirm the drop)"
    assert "batch 8: 3860.0 → 2336.0 tokens/s" in around and kept in around
    summary = text_summary(result)
    assert any(line.startswith("  served decode at batch 1: 293.6 -> 474.0 tokens/s") for line in summary)
    assert any(line.startswith("  served decode at batch 8: 2113.9 -> 2336.0 tokens/s") for line in summary)
