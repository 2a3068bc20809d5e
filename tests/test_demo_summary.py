"""`gpuyantra demo` ends with a short human summary: what was deployed where, speed before and after
at each batch, where the report is, and links that answer now or say how to bring them back."""

from __future__ import annotations

from pathlib import Path

from gpuyantra.commands import stage_printer
from gpuyantra.commands.demo import Where, demo_summary
from tests.report.test_report_agrees import kept_cpu_swap_with_batches

STATE = Path("/state")


def summary(kept: bool) -> list[str]:
    where = Where(STATE, "127.0.0.1:7233", "http://127.0.0.1:8233", "http://127.0.0.1:9000", kept)
    return demo_summary(kept_cpu_swap_with_batches(), 53.0, STATE / "r.html", STATE / "r.json", where)


def test_the_summary_is_short_and_says_what_was_deployed_and_how_fast() -> None:
    lines = summary(kept=False)
    assert len(lines) <= 30 and not any(line.lstrip().startswith(("{", '"')) for line in lines)
    text = "\n".join(lines)
    assert "deployed into http://127.0.0.1:9000" in text and "deployed rms_norm (Qwen2RMSNorm)" in text
    assert "served decode: 40.0 -> 3.0 tokens/s" in text
    assert f"Report:  {STATE / 'r.html'}" in text and f"Result:  {STATE / 'r.json'}" in text


def test_after_the_demo_stops_links_say_how_to_bring_them_back() -> None:
    text = "\n".join(summary(kept=False))
    assert "curl" not in text and "admin/kernels" not in text
    assert "The demo has stopped its server, workers and Temporal" in text
    assert f"gpuyantra up --state-dir {STATE}, then http://127.0.0.1:8233/namespaces/default/workflows/" in text


def test_with_keep_the_links_are_live_ones() -> None:
    text = "\n".join(summary(kept=True))
    assert "Running until Ctrl-C" in text and "gpuyantra kernels list --server http://127.0.0.1:9000" in text
    assert "has stopped" not in text


def test_stage_lines_only_on_a_terminal(capsys) -> None:
    stage_printer("demo", quiet=False)("loading")  # stderr is captured here: not a terminal
    stage_printer("demo", quiet=True)("loading")
    assert capsys.readouterr().err == ""
