"""`gpuyantra report`: one offline HTML page from a saved campaign result."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from gpuyantra.report import render_html
from tests.report.results import cpu_result, gpu_result

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


def test_gpu_result_report_shows_every_target_and_figure(tmp_path):
    source = tmp_path / "rms_norm_Qwen2RMSNorm_2.py"
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
    assert "Kernel speedup" in page and "Time vs bytes moved" in page and "Served decode tokens/s" in page
    assert ": absent." not in page.split("<h2>Per target</h2>")[0]
    assert "75.0%" in page  # floor 6 us over kernel 8 us: 75% of copy bandwidth
    assert "static/forbidden-import" in page or "forbidden-import" in page
    assert "the served model has no module computing rope" in page
    assert "_rms_norm_kernel" in page and "a &lt; b &amp; c" in page  # the kernel source, escaped
    assert "250.0" in page and "262.0" in page


def test_cpu_result_report_says_speed_is_not_judged(tmp_path):
    page = report_of(cpu_result(), tmp_path)
    assert_offline(page)
    assert "speed is not judged" in page
    assert "Speedup chart: absent." in page and "Roofline plot: absent." in page
    assert page.count("<svg") == 1 and "Served decode tokens/s" in page  # served speed is still measured
    assert "Kernel source: absent." in page
    assert "92.5% slower" in page  # the warning


def test_report_escapes_what_the_result_holds():
    result = gpu_result()
    result["rejected"][0]["reason"] = "<img src=x onerror=alert(1)>"
    page = render_html(result)
    assert "<img" not in page and "&lt;img src=x" in page


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
