"""The report as one HTML page: tables, the figures of gpuyantra/report/figures.py, the kernel sources.

Everything a result holds is escaped; the page links only to its own anchors, runs no script and
loads nothing, so it opens offline and can be mailed or archived as one file.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from gpuyantra import config
from gpuyantra.report.figures import absent, profile_figure, roofline_figure, served_figure, speedup_figure
from gpuyantra.report.result import (
    copy_bandwidth_share,
    device_roofs,
    figure,
    fmt,
    fmt_rate,
    fmt_share,
    hardware_spec,
    pct,
    speed_not_judged,
    target_name,
    targets,
    verdict_layers,
)

MAX_SOURCE_CHARS = 200_000

CSS = """body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;
vertical-align:top}th{background:#f3f3f3}.deployed{color:#1a7f37}.rejected{color:#b35900}.absent{color:#666;
background:#f6f6f6;padding:0.6em;border-left:4px solid #bbb}.note{color:#666}pre{background:#f7f7f7;padding:0.8em;
overflow:auto;font-size:12px;max-height:40em}.warn{color:#a00}svg.chart{max-width:100%;height:auto;display:block;
margin:0.5em 0}"""

TARGET_HEADERS = [
    "target",
    "status",
    "verdict",
    "reward",
    "x vs eager",
    "x vs compile",
    "kernel µs",
    "floor µs",
    "% of copy bandwidth",
    "iterations",
    "device",
]


class Markup(str):
    """Already-escaped HTML for a table cell."""


def _table(headers: list[str] | None, rows: list[list[Any]]) -> str:
    """A table of escaped cells (Markup cells as they are); no header row when `headers` is None."""
    head = ("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>") if headers else ""
    body = "".join(
        "<tr>"
        + "".join(f"<td>{cell if isinstance(cell, Markup) else html.escape(str(cell))}</td>" for cell in row)
        + "</tr>"
        for row in rows
    )
    return f"<table>{head}{body}</table>"


def _strip_scheme(url: Any) -> str:
    """The server as host:port: the page links to nothing outside itself."""
    return str(url or "unknown").split("://", 1)[-1].rstrip("/")


def _anchor(entry: dict[str, Any]) -> str:
    return html.escape(str(entry["op"]))


# ------------------------------------------------------------------------------- sections


def _targets_table(result: dict[str, Any]) -> str:
    rows = []
    for entry in targets(result):
        kernel, floor = figure(entry, "kernel_us"), figure(entry, "floor_us")
        verdict = entry.get("verdict") or {}
        layers = sorted({str(f.get("layer")) for f in verdict.get("failures") or []})
        rows.append(
            [
                Markup(f'<a href="#{_anchor(entry)}">{html.escape(target_name(entry))}</a>'),
                Markup(f'<span class="{entry["status"]}">{entry["status"]}</span>'),
                "accepted" if verdict.get("accepted") else ("rejected: " + ", ".join(layers) if layers else "–"),
                fmt(figure(entry, "reward")),
                fmt(figure(entry, "speedup_vs_eager")),
                fmt(figure(entry, "speedup_vs_compile")),
                fmt(kernel),
                fmt(floor),
                fmt_share(copy_bandwidth_share(kernel, floor)),
                fmt(entry.get("iterations")),
                verdict.get("device", "–"),
            ]
        )
    return _table(TARGET_HEADERS, rows) if rows else "<p>No targets.</p>"


def _device_section(result: dict[str, Any]) -> str:
    """The device's roofs, each with where it comes from (measured, or absent from this result)."""
    roofs = device_roofs(result)
    spec = hardware_spec(result)
    copy, matmul, ridge = roofs.copy_bytes_per_s, roofs.matmul_flops_per_s, roofs.ridge
    rows = [
        ["hardware", result.get("hardware") or "unknown", spec.get("device_name") or ""],
        ["copy bandwidth", fmt_rate(copy, "B/s") if copy else "–", roofs.copy_source],
        ["matmul rate", fmt_rate(matmul, "FLOP/s") if matmul else "–", _matmul_source(roofs.matmul_source)],
        ["ridge point", f"{ridge:,.3g} FLOP/byte" if ridge else "–", "matmul rate / copy bandwidth"],
    ]
    return "<h2>Device</h2>" + _table(["", "value", "source"], rows)


def _matmul_source(source: str) -> str:
    if source != "absent":
        return source
    return "absent: measured with the profile, which this result does not carry"


def _served_row(label: str, figures: dict[str, Any] | None) -> list[str]:
    figures = figures or {}
    return [
        label,
        fmt(figures.get("tokens_per_s"), digits=1),
        fmt(figures.get("min"), digits=1),
        fmt(figures.get("max"), digits=1),
        fmt(pct(figures.get("relative_spread")), "%", 1),
        fmt(figures.get("repeats")),
    ]


def _served_batches(served: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(batch, {"before", "after", ...}) smallest batch first; empty for a result measured at one batch."""
    batches = served.get("batches")
    if not isinstance(batches, dict):
        return []
    return sorted(((str(b), v) for b, v in batches.items() if isinstance(v, dict)), key=lambda bv: int(bv[0]))


def _served_section(result: dict[str, Any]) -> str:
    served = result.get("served_speed") or {}
    e2e = result.get("e2e") or {}
    batches = _served_batches(served)
    if batches:  # every batch the campaign measured, batch 1 among them
        rows = [
            _served_row(f"batch {b}, {key}", figures.get(key)) for b, figures in batches for key in ("before", "after")
        ]
    else:
        rows = [_served_row(key, served.get(key)) for key in ("before", "after")]
    return (
        "<h2>Served speed</h2>"
        + _table(["", "tokens/s (median)", "min", "max", "spread", "repeats"], rows)
        + f"<p>e2e tokens/s: {fmt(e2e.get('tokens_per_s_before'), digits=1)} → "
        f"{fmt(e2e.get('tokens_per_s_after'), digits=1)}</p>" + served_figure(result)
    )


def _warnings(result: dict[str, Any]) -> str:
    warnings = result.get("warnings") or []
    if not warnings:
        return "<h2>Warnings</h2><p>None.</p>"
    items = "".join(f'<li class="warn">{html.escape(str(w))}</li>' for w in warnings)
    return f"<h2>Warnings</h2><ul>{items}</ul>"


# ------------------------------------------------------------------------------- per target


def _source(path: Any) -> str:
    if not path:
        return absent("Kernel source", "The verdict names no candidate file.")
    kept = kept_candidate(str(path))
    if kept is None:
        return absent(
            "Kernel source",
            f"{path} is not a candidate file kept in this state folder's candidates/ (reports read sources only "
            "from there; a campaign verified on another machine keeps them on its GPU worker).",
        )
    try:
        text = kept.read_text(errors="replace")[:MAX_SOURCE_CHARS]
    except OSError:
        return absent("Kernel source", f"{path} is not readable here (it lives on the GPU worker that verified it).")
    return f"<p>{html.escape(str(path))}</p><pre>{html.escape(text)}</pre>"


def kept_candidate(path: str) -> Path | None:
    """`path` resolved (links followed) when it is a `.py` file inside the state folder's candidates/,
    else None. A result is data anyone who can start a workflow writes: its paths are never trusted."""
    try:
        resolved = Path(os.path.realpath(path))
        folder = Path(os.path.realpath(config.candidates_dir()))
    except (OSError, ValueError):
        return None
    inside = resolved.is_relative_to(folder) and resolved != folder
    return resolved if inside and resolved.suffix == ".py" and resolved.is_file() else None


def _facts(entry: dict[str, Any]) -> str:
    """Where the kernel came from and where it went: skill, seed, swap, modules, shapes."""
    verdict = entry.get("verdict") or {}
    seed = entry.get("seed_skill_id")
    rows = [
        ["skill", entry.get("skill_id") or "–"],
        ["seed skill", seed or ("none: written without a seed" if "seed_skill_id" in entry else "–")],
        ["best iteration", fmt(entry.get("best_iteration"))],
        ["swap", entry.get("swap_id") or "–"],
        ["modules swapped", fmt(entry.get("modules"))],
        ["shapes verified", "; ".join(str(s) for s in verdict.get("shapes") or []) or "–"],
        ["dtypes", ", ".join(str(d) for d in verdict.get("dtypes") or []) or "–"],
    ]
    return _table(None, rows)


def _around(what: str, figures: dict[str, Any]) -> str:
    """One served-speed comparison around a swap: before → after with spreads, drop vs noise."""
    before, after = figures.get("before") or {}, figures.get("after") or {}
    drop, noise = fmt(pct(figures.get("drop")), "%", 1), fmt(pct(figures.get("noise")), "%", 1)
    return (
        f"{what}: {fmt(before.get('tokens_per_s'), digits=1)} → {fmt(after.get('tokens_per_s'), digits=1)} "
        f"tokens/s (spread {fmt(pct(before.get('relative_spread')), '%', 1)} → "
        f"{fmt(pct(after.get('relative_spread')), '%', 1)}); drop {drop} vs noise {noise}"
    )


def _served_around(entry: dict[str, Any]) -> str:
    served = entry.get("served_speed") or {}
    if not served:
        return ""
    batches = _served_batches(served)
    kept = entry.get("status") == "deployed"
    parts = (
        [
            _around(f"batch {b}", figures) + f" ({html.escape(batch_outcome(figures, served, kept))})"
            for b, figures in batches
        ]
        if batches
        else [_around("Served decode around this swap", served)]
    )
    prefix = "Served decode around this swap, " if batches else ""
    return f"<p>{prefix}{'; '.join(parts)}; {html.escape(judged_text(served, entry))}.</p>"


def batch_outcome(figures: dict[str, Any], served: dict[str, Any], kept: bool) -> str:
    """What happened at one batch, as the result says it: a drop beyond the noise of a swap that was
    kept reads as kept, with why (speed not judged there, or the paired check did not confirm it)."""
    decision = figures.get("decision")
    if decision != "rollback":
        return str(decision or "–")
    if not kept:
        return "rolled back"
    if not served.get("judged"):
        return "kept: speed is not judged on this device"
    return "kept: the paired on/off check did not confirm the drop"


def judged_text(served: dict[str, Any], entry: dict[str, Any]) -> str:
    if served.get("judged"):
        return "served speed judged: a confirmed drop rolls the swap back"
    device = (entry.get("verdict") or {}).get("device") or "this device"
    return f"served speed not judged: a {device} verdict is judged on correctness only"


def _verdict(verdict: dict[str, Any]) -> str:
    """The verdict layer by layer, then its failures in full."""
    parts = []
    layers = verdict_layers(verdict)
    if layers:
        parts.append("<p>Verdict, layer by layer:</p>" + _table(["layer", "outcome"], [list(row) for row in layers]))
    failures = verdict.get("failures") or []
    if failures:
        parts.append(
            "<p>Failures of the reported verdict:</p>"
            + _table(
                ["layer", "rule", "message"], [[f.get("layer"), f.get("rule"), f.get("message")] for f in failures]
            )
        )
    return "".join(parts)


def _bench(verdict: dict[str, Any]) -> str:
    bench = verdict.get("bench") or []
    if not bench:
        return ""
    rows = [
        [
            r.get("shape"),
            fmt(r.get("kernel_us")),
            fmt(r.get("eager_us")),
            fmt(r.get("compile_us")),
            fmt(r.get("compile_ro_us")),
            fmt(r.get("floor_us"), digits=3),
            fmt(r.get("bytes")),
            fmt_share(copy_bandwidth_share(r.get("kernel_us"), r.get("floor_us"))),
        ]
        for r in bench
    ]
    headers = ["shape", "kernel µs", "eager µs", "compile µs", "compile reduce-overhead µs", "floor µs", "bytes"]
    return "<p>Benchmark rows:</p>" + _table([*headers, "% of copy bandwidth"], rows)


def _attempts(entry: dict[str, Any]) -> str:
    attempts = entry.get("attempts") or []
    if not attempts:
        return ""
    rows = [
        [
            a.get("iteration"),
            a.get("author", ""),
            json.dumps(a.get("strategy"), sort_keys=True),
            a.get("reward"),
            fmt(a.get("kernel_us")),
            fmt(a.get("floor_us"), digits=3),
            "; ".join(f"{f.get('layer')}/{f.get('rule')}" for f in a.get("failures") or []) or "none",
        ]
        for a in attempts
    ]
    headers = ["iteration", "author", "strategy", "reward", "kernel µs", "floor µs", "failures"]
    return "<p>Attempts (strategies tried, with their rewards):</p>" + _table(headers, rows)


def _target_section(entry: dict[str, Any]) -> str:
    verdict = entry.get("verdict") or {}
    status = entry["status"]
    parts = [
        f'<h3 id="{_anchor(entry)}">{html.escape(target_name(entry))}: <span class="{status}">{status}</span></h3>'
    ]
    if entry.get("reason"):
        parts.append(f"<p>{html.escape(str(entry['reason']))}</p>")
    if verdict or status == "deployed":
        parts.append(_facts(entry))
    parts += [_served_around(entry), _verdict(verdict), _bench(verdict), _attempts(entry)]
    if verdict or status == "deployed":
        parts.append("<h4>Kernel source</h4>" + _source(verdict.get("candidate_path")))
    return "".join(parts)


# ------------------------------------------------------------------------------- the page


def render_html(result: dict[str, Any]) -> str:
    """The whole report: one HTML page with inline SVG, no external reference."""
    judged = (
        '<p class="note">Verified on a CPU: speed is not judged (Triton\'s interpreter times nothing '
        "meaningful); rewards stop at +1 and kernel/floor times are absent.</p>"
        if speed_not_judged(result)
        else ""
    )
    title = f"gpuyantra campaign {result.get('workflow_id', '')}"
    overview = [
        [
            result.get("model") or "unknown",
            result.get("hardware") or "unknown",
            _strip_scheme(result.get("server")),
            len(result.get("deployed") or []),
            len(result.get("rejected") or []),
        ]
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{CSS}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            _table(["model", "hardware", "server", "deployed", "rejected"], overview),
            judged,
            "<h2>Profile</h2>",
            profile_figure(result),
            "<h2>Targets</h2>",
            _targets_table(result),
            speedup_figure(result),
            _device_section(result),
            roofline_figure(result),
            _served_section(result),
            _warnings(result),
            "<h2>Per target</h2>",
            *(_target_section(entry) for entry in targets(result)),
            "</body></html>",
        ]
    )


def write_report(result: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(result), encoding="utf-8")
    return path
