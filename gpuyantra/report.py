"""A campaign's result as a self-contained HTML page and as a few lines of text.

`render_html` draws its charts as inline SVG written here (no plotting library, no script, no
external URL), so the page opens offline and can be mailed or archived as one file. It shows what the
result holds (workflows/campaign.py): per target the verdict digest, the attempts and the served
speed around its swap; and says when a figure is absent and why (on a CPU speed is not judged).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Bars = tuple[str, list[float | None], list[Any]]  # label, one value per series, one (low, high) or None each

PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
WIDTH, HEIGHT, MARGIN = 640, 300, 56
MAX_SOURCE_CHARS = 200_000


class ReportError(RuntimeError):
    """The result cannot be fetched or read."""


# ------------------------------------------------------------------------------- the result


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Deployed then rejected entries, each with `status` added."""
    return [{**entry, "status": "deployed"} for entry in result.get("deployed") or []] + [
        {**entry, "status": "rejected"} for entry in result.get("rejected") or []
    ]


def target_name(entry: dict[str, Any]) -> str:
    return f"{entry['op']} ({entry['module_class']})" if entry.get("module_class") else str(entry.get("op"))


def devices(result: dict[str, Any]) -> set[str]:
    return {str(e["verdict"]["device"]) for e in targets(result) if (e.get("verdict") or {}).get("device")}


def speed_not_judged(result: dict[str, Any]) -> bool:
    return "cpu" in devices(result)


def copy_bandwidth_share(kernel_us: Any, floor_us: Any) -> float | None:
    """How close the kernel came to copy bandwidth: floor time (bytes / copy bandwidth) over kernel time."""
    if isinstance(kernel_us, (int, float)) and isinstance(floor_us, (int, float)) and kernel_us > 0:
        return floor_us / kernel_us
    return None


def figure(entry: dict[str, Any], key: str) -> Any:
    """A figure of the target's entry, else of its verdict digest."""
    value = entry.get(key)
    return value if value is not None else (entry.get("verdict") or {}).get(key)


def fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def text_summary(result: dict[str, Any]) -> list[str]:
    """The human summary `optimize --wait` prints at the end."""
    deployed, rejected = result.get("deployed") or [], result.get("rejected") or []
    lines = [
        f"Campaign {result.get('workflow_id')} finished: {len(deployed)} deployed, {len(rejected)} rejected "
        f"(model {result.get('model') or 'unknown'}, hardware {result.get('hardware') or 'unknown'})"
    ]
    for entry in targets(result):
        if entry["status"] == "deployed":
            lines.append(
                f"  {target_name(entry)}: deployed, reward {entry.get('reward'):+d}, "
                f"{entry.get('iterations')} iteration(s), {entry.get('modules')} module(s), "
                f"x{fmt(figure(entry, 'speedup_vs_eager'))} vs eager, "
                f"x{fmt(figure(entry, 'speedup_vs_compile'))} vs torch.compile"
            )
        else:
            lines.append(f"  {target_name(entry)}: not deployed: {entry.get('reason')}")
    served = result.get("served_speed") or {}
    before, after = served.get("before") or {}, served.get("after") or {}
    if before.get("tokens_per_s") is not None and after.get("tokens_per_s") is not None:
        lines.append(
            f"  served decode: {before['tokens_per_s']:.1f} -> {after['tokens_per_s']:.1f} tokens/s "
            f"(spread {before.get('relative_spread', 0):.1%} / {after.get('relative_spread', 0):.1%})"
            + ("; on CPU speed is not judged" if speed_not_judged(result) else "")
        )
    lines += [f"  warning: {warning}" for warning in result.get("warnings") or []]
    return lines


# ------------------------------------------------------------------------------- SVG charts


def _svg(title: str, body: list[str], width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<svg role="img" aria-label="{html.escape(title)}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'
        f"<title>{html.escape(title)}</title>"
        f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>'
        + "".join(body)
        + "</svg>"
    )


def _legend(names: list[str], x: float, y: float) -> list[str]:
    out = []
    for i, name in enumerate(names):
        out.append(
            f'<rect x="{x}" y="{y + 14 * i}" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{x + 14}" y="{y + 9 + 14 * i}">{html.escape(name)}</text>'
        )
    return out


def bar_chart(title: str, series: list[str], groups: list[Bars], ylabel: str, reference: float | None = None) -> str:
    """Grouped bars, one group per label."""
    values = [v for _, vals, _ in groups for v in vals if v is not None]
    highs = [hi for _, _, errs in groups for e in errs if e for hi in e[1:]]
    top = max([*values, *highs, reference or 0.0, 1e-9]) * 1.15
    x0, y0, plot_w, plot_h = MARGIN, HEIGHT - MARGIN, WIDTH - MARGIN - 130, HEIGHT - 2 * MARGIN + 10
    scale = lambda v: y0 - plot_h * v / top  # noqa: E731
    body = _linear_axes(top, ylabel, x0, y0, plot_w, plot_h)
    slot = plot_w / max(len(groups), 1)
    bar = slot * 0.8 / max(len(series), 1)
    for g, (label, vals, errs) in enumerate(groups):
        left = x0 + g * slot + slot * 0.1
        body.append(f'<text x="{left + slot * 0.4:.1f}" y="{y0 + 14}" text-anchor="middle">{html.escape(label)}</text>')
        for s, value in enumerate(vals):
            if value is None:
                continue
            x = left + s * bar
            body.append(
                f'<rect x="{x:.1f}" y="{scale(value):.1f}" width="{bar * 0.9:.1f}" '
                f'height="{max(y0 - scale(value), 0):.1f}" fill="{PALETTE[s % len(PALETTE)]}">'
                f"<title>{html.escape(f'{label} {series[s]}: {value:.4g}')}</title></rect>"
                f'<text x="{x + bar * 0.45:.1f}" y="{scale(value) - 3:.1f}" text-anchor="middle" '
                f'font-size="9">{value:.3g}</text>'
            )
            err = errs[s] if s < len(errs) else None
            if err:
                cx = x + bar * 0.45
                body.append(
                    f'<line x1="{cx:.1f}" y1="{scale(err[0]):.1f}" x2="{cx:.1f}" y2="{scale(err[1]):.1f}" '
                    f'stroke="#000"/>'
                )
    if reference is not None:
        body.append(
            f'<line x1="{x0}" y1="{scale(reference):.1f}" x2="{x0 + plot_w}" y2="{scale(reference):.1f}" '
            f'stroke="#c00" stroke-dasharray="4 3"/>'
        )
    return _svg(title, body + _legend(series, x0 + plot_w + 12, MARGIN))


def _linear_axes(top: float, ylabel: str, x0: float, y0: float, plot_w: float, plot_h: float) -> list[str]:
    """Axes from 0 to `top` with five labelled gridlines, shared by the bar and line charts."""
    scale = lambda v: y0 - plot_h * v / top  # noqa: E731
    body = [
        f'<line x1="{x0}" y1="{y0}" x2="{x0 + plot_w}" y2="{y0}" stroke="#333"/>',
        f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 - plot_h}" stroke="#333"/>',
        f'<text x="14" y="{y0 - plot_h / 2}" transform="rotate(-90 14 {y0 - plot_h / 2})" '
        f'text-anchor="middle">{html.escape(ylabel)}</text>',
    ]
    for k in range(5):
        tick = top * k / 4
        body.append(
            f'<text x="{x0 - 4}" y="{scale(tick) + 4:.1f}" text-anchor="end">{tick:.3g}</text>'
            f'<line x1="{x0}" y1="{scale(tick):.1f}" x2="{x0 + plot_w}" y2="{scale(tick):.1f}" '
            f'stroke="#ddd"/>'
        )
    return body


Line = tuple[str, list[tuple[float, float | None]]]  # name, (x, y) points; y None: no value there


def line_chart(title: str, series: list[Line], xlabel: str, ylabel: str) -> str:
    """Lines over a shared linear x axis (y from 0), one colour per series; a None y breaks its
    line, so a gap in the data (a server restart, an idle interval) shows as a gap."""
    points = [(x, y) for _, pts in series for x, y in pts if y is not None]
    xs = [x for x, _ in points] or [0.0, 1.0]
    low, high = min(xs), max(xs)
    high = high if high > low else low + 1.0
    highest = max((y for _, y in points), default=0.0)
    top = highest * 1.15 if highest > 0 else 1.0  # no data (or all zero): a 0..1 axis, not 0..1e-9
    x0, y0, plot_w, plot_h = MARGIN, HEIGHT - MARGIN, WIDTH - MARGIN - 130, HEIGHT - 2 * MARGIN + 10
    sx = lambda v: x0 + plot_w * (v - low) / (high - low)  # noqa: E731
    sy = lambda v: y0 - plot_h * v / top  # noqa: E731
    body = _linear_axes(top, ylabel, x0, y0, plot_w, plot_h)
    body.append(f'<text x="{x0 + plot_w / 2}" y="{HEIGHT - 12}" text-anchor="middle">{html.escape(xlabel)}</text>')
    for k in range(5):
        tick = low + (high - low) * k / 4
        body.append(f'<text x="{sx(tick):.1f}" y="{y0 + 14}" text-anchor="middle">{tick:.3g}</text>')
    for i, (name, pts) in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        for run in _runs(pts):
            if len(run) == 1:
                body.append(f'<circle cx="{sx(run[0][0]):.1f}" cy="{sy(run[0][1]):.1f}" r="2" fill="{colour}"/>')
                continue
            coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in run)
            body.append(
                f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.5">'
                f"<title>{html.escape(f'{name}: last {run[-1][1]:.4g}')}</title></polyline>"
            )
    return _svg(title, body + _legend([name for name, _ in series], x0 + plot_w + 12, MARGIN))


def _runs(points: list[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """The stretches of consecutive points that have a y."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None:
            runs.append([])
        else:
            runs[-1].append((x, y))
    return [run for run in runs if run]


def loglog_chart(
    title: str,
    series: list[tuple[str, list[tuple[float, float]]]],
    xlabel: str,
    ylabel: str,
    links: Sequence[tuple[tuple[float, float], tuple[float, float]]] = (),
) -> str:
    """Points on log-log axes, one colour per series; `links` join pairs of points (kernel to floor)."""
    points = [p for _, pts in series for p in pts if p[0] > 0 and p[1] > 0]
    lx = [math.log10(x) for x, _ in points] or [0.0]
    ly = [math.log10(y) for _, y in points] or [0.0]
    xmin, xmax = math.floor(min(lx)), math.ceil(max(lx) + 1e-9)
    ymin, ymax = math.floor(min(ly)), math.ceil(max(ly) + 1e-9)
    xmax, ymax = max(xmax, xmin + 1), max(ymax, ymin + 1)
    x0, y0, plot_w, plot_h = MARGIN + 10, HEIGHT - MARGIN, WIDTH - MARGIN - 160, HEIGHT - 2 * MARGIN + 10
    sx = lambda v: x0 + plot_w * (math.log10(v) - xmin) / (xmax - xmin)  # noqa: E731
    sy = lambda v: y0 - plot_h * (math.log10(v) - ymin) / (ymax - ymin)  # noqa: E731
    body = [
        f'<rect x="{x0}" y="{y0 - plot_h}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>',
        f'<text x="{x0 + plot_w / 2}" y="{HEIGHT - 12}" text-anchor="middle">{html.escape(xlabel)}</text>',
        f'<text x="14" y="{y0 - plot_h / 2}" transform="rotate(-90 14 {y0 - plot_h / 2})" '
        f'text-anchor="middle">{html.escape(ylabel)}</text>',
    ]
    for e in range(xmin, xmax + 1):
        body.append(f'<text x="{sx(10**e):.1f}" y="{y0 + 14}" text-anchor="middle">1e{e}</text>')
    for e in range(ymin, ymax + 1):
        body.append(
            f'<text x="{x0 - 4}" y="{sy(10**e) + 4:.1f}" text-anchor="end">1e{e}</text>'
            f'<line x1="{x0}" y1="{sy(10**e):.1f}" x2="{x0 + plot_w}" y2="{sy(10**e):.1f}" stroke="#eee"/>'
        )
    for a, b in links:
        if min(*a, *b) > 0:
            body.append(
                f'<line x1="{sx(a[0]):.1f}" y1="{sy(a[1]):.1f}" x2="{sx(b[0]):.1f}" y2="{sy(b[1]):.1f}" '
                f'stroke="#999" stroke-dasharray="2 2"/>'
            )
    for i, (name, pts) in enumerate(series):
        for x, y in pts:
            if x > 0 and y > 0:
                body.append(
                    f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{PALETTE[i % len(PALETTE)]}">'
                    f"<title>{html.escape(f'{name}: {x:.4g} bytes, {y:.4g} us')}</title></circle>"
                )
    return _svg(title, body + _legend([name for name, _ in series], x0 + plot_w + 12, MARGIN))


# ------------------------------------------------------------------------------- figures


def absent(what: str, why: str) -> str:
    return f'<p class="absent"><strong>{html.escape(what)}: absent.</strong> {html.escape(why)}</p>'


def speedup_figure(result: dict[str, Any]) -> str:
    groups: list[Bars] = [
        (str(e["op"]), [figure(e, "speedup_vs_eager"), figure(e, "speedup_vs_compile")], []) for e in targets(result)
    ]
    groups = [g for g in groups if any(v is not None for v in g[1])]
    if not groups:
        why = (
            "The verdicts ran on a CPU, where speed is not judged (Triton's interpreter): no kernel was timed."
            if speed_not_judged(result)
            else "No verdict reached the benchmark layer."
        )
        return absent("Speedup chart", why)
    return bar_chart(
        "Kernel speedup (x, higher is better; dashed: 1x)",
        ["vs eager", "vs torch.compile"],
        groups,
        "speedup (x)",
        reference=1.0,
    )


def _speed_bar(label: str, figures: dict[str, Any] | None) -> Bars | None:
    if not figures or figures.get("tokens_per_s") is None:
        return None
    low, high = figures.get("min"), figures.get("max")
    return label, [figures["tokens_per_s"]], [(low, high) if low is not None and high is not None else None]


def served_figure(result: dict[str, Any]) -> str:
    served = result.get("served_speed") or {}
    bars = [_speed_bar("campaign before", served.get("before"))]
    for entry in targets(result):
        around = entry.get("served_speed") or {}
        bars += [
            _speed_bar(f"{entry['op']} before", around.get("before")),
            _speed_bar(f"{entry['op']} after", around.get("after")),
        ]
    bars.append(_speed_bar("campaign after", served.get("after")))
    kept = [b for b in bars if b is not None]
    if not kept:
        return absent("Served-speed chart", "The result holds no served-speed measurement.")
    note = (
        '<p class="note">On a CPU the served model runs swapped kernels in Triton\'s interpreter: these '
        "tokens/s are measured but speed is not judged.</p>"
        if speed_not_judged(result)
        else ""
    )
    return (
        bar_chart("Served decode tokens/s (median; bar: min..max of the repeats)", ["tokens/s"], kept, "tokens/s")
        + note
    )


def roofline_figure(result: dict[str, Any]) -> str:
    series, links = [], []
    for entry in targets(result):
        rows = [r for r in (entry.get("verdict") or {}).get("bench") or [] if r.get("bytes") and r.get("kernel_us")]
        if not rows:
            continue
        series.append((f"{entry['op']} kernel", [(r["bytes"], r["kernel_us"]) for r in rows]))
        floors = [(r["bytes"], r["floor_us"]) for r in rows if r.get("floor_us")]
        if floors:
            series.append((f"{entry['op']} copy floor", floors))
            links += [((r["bytes"], r["kernel_us"]), (r["bytes"], r["floor_us"])) for r in rows if r.get("floor_us")]
        eager = [(r["bytes"], r["eager_us"]) for r in rows if r.get("eager_us")]
        if eager:
            series.append((f"{entry['op']} eager", eager))
    if not series:
        why = (
            "The verdicts ran on a CPU: nothing was timed, so there are no bytes/time points."
            if speed_not_judged(result)
            else "No verdict holds benchmark rows with bytes and kernel time."
        )
        return absent("Roofline plot", why)
    return loglog_chart(
        "Time vs bytes moved (copy floor = bytes / measured copy bandwidth)",
        series,
        "bytes moved per call",
        "microseconds",
        links,
    )


# ------------------------------------------------------------------------------- HTML

CSS = """body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;
vertical-align:top}th{background:#f3f3f3}.deployed{color:#1a7f37}.rejected{color:#b35900}.absent{color:#666;
background:#f6f6f6;padding:0.6em;border-left:4px solid #bbb}.note{color:#666}pre{background:#f7f7f7;padding:0.8em;
overflow:auto;font-size:12px;max-height:40em}.warn{color:#a00}"""


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{cell if isinstance(cell, Markup) else html.escape(str(cell))}</td>" for cell in row)
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


class Markup(str):
    """Already-escaped HTML for a table cell."""


def _strip_scheme(url: Any) -> str:
    """The server as host:port: the page links to nothing outside itself."""
    return str(url or "unknown").split("://", 1)[-1].rstrip("/")


def _source(path: Any) -> str:
    if not path:
        return absent("Kernel source", "The verdict names no candidate file.")
    try:
        text = Path(str(path)).read_text(errors="replace")[:MAX_SOURCE_CHARS]
    except OSError:
        return absent("Kernel source", f"{path} is not readable here (it lives on the GPU worker that verified it).")
    return f"<p>{html.escape(str(path))}</p><pre>{html.escape(text)}</pre>"


def _target_section(entry: dict[str, Any]) -> str:
    verdict = entry.get("verdict") or {}
    status = entry["status"]
    parts = [
        f'<h3 id="{html.escape(str(entry["op"]))}">{html.escape(target_name(entry))}: '
        f'<span class="{status}">{status}</span></h3>'
    ]
    if entry.get("reason"):
        parts.append(f"<p>{html.escape(str(entry['reason']))}</p>")
    served = entry.get("served_speed") or {}
    if served:
        before, after = served.get("before") or {}, served.get("after") or {}
        drop, noise = fmt(_pct(served.get("drop")), "%", 1), fmt(_pct(served.get("noise")), "%", 1)
        parts.append(
            f"<p>Served decode around this swap: {fmt(before.get('tokens_per_s'), digits=1)} → "
            f"{fmt(after.get('tokens_per_s'), digits=1)} tokens/s; drop {drop} vs noise {noise}; "
            f"judged: {html.escape(str(served.get('judged')))}.</p>"
        )
    failures = verdict.get("failures") or []
    if failures:
        parts.append(
            "<p>Failures of the reported verdict:</p>"
            + _table(
                ["layer", "rule", "message"], [[f.get("layer"), f.get("rule"), f.get("message")] for f in failures]
            )
        )
    bench = verdict.get("bench") or []
    if bench:
        parts.append(
            "<p>Benchmark rows:</p>"
            + _table(
                ["shape", "kernel µs", "eager µs", "compile µs", "floor µs", "bytes", "% of copy bandwidth"],
                [
                    [
                        r.get("shape"),
                        fmt(r.get("kernel_us")),
                        fmt(r.get("eager_us")),
                        fmt(r.get("compile_us")),
                        fmt(r.get("floor_us")),
                        fmt(r.get("bytes")),
                        fmt(_pct(copy_bandwidth_share(r.get("kernel_us"), r.get("floor_us"))), "%", 1),
                    ]
                    for r in bench
                ],
            )
        )
    attempts = entry.get("attempts") or []
    if attempts:
        parts.append(
            "<p>Attempts:</p>"
            + _table(
                ["iteration", "author", "strategy", "reward", "kernel µs", "floor µs", "failures"],
                [
                    [
                        a.get("iteration"),
                        a.get("author", ""),
                        json.dumps(a.get("strategy"), sort_keys=True),
                        a.get("reward"),
                        fmt(a.get("kernel_us")),
                        fmt(a.get("floor_us")),
                        "; ".join(f"{f.get('layer')}/{f.get('rule')}" for f in a.get("failures") or []) or "none",
                    ]
                    for a in attempts
                ],
            )
        )
    if verdict or entry["status"] == "deployed":
        parts.append("<h4>Kernel source</h4>" + _source(verdict.get("candidate_path")))
    return "".join(parts)


def _pct(share: float | None) -> float | None:
    return None if share is None else 100.0 * share


def render_html(result: dict[str, Any]) -> str:
    """The whole report: one HTML page with inline SVG, no external reference."""
    rows = []
    for entry in targets(result):
        kernel, floor = figure(entry, "kernel_us"), figure(entry, "floor_us")
        verdict = entry.get("verdict") or {}
        layers = sorted({f.get("layer") for f in verdict.get("failures") or []})
        rows.append(
            [
                Markup(f'<a href="#{html.escape(str(entry["op"]))}">{html.escape(target_name(entry))}</a>'),
                Markup(f'<span class="{entry["status"]}">{entry["status"]}</span>'),
                "accepted" if verdict.get("accepted") else ("rejected: " + ", ".join(layers) if layers else "–"),
                fmt(figure(entry, "reward")),
                fmt(figure(entry, "speedup_vs_eager")),
                fmt(figure(entry, "speedup_vs_compile")),
                fmt(kernel),
                fmt(floor),
                fmt(_pct(copy_bandwidth_share(kernel, floor)), "%", 1),
                fmt(entry.get("iterations")),
                verdict.get("device", "–"),
            ]
        )
    served = result.get("served_speed") or {}
    e2e = result.get("e2e") or {}
    speed_rows = [
        [
            label,
            fmt((served.get(key) or {}).get("tokens_per_s"), digits=1),
            fmt((served.get(key) or {}).get("min"), digits=1),
            fmt((served.get(key) or {}).get("max"), digits=1),
            fmt(_pct((served.get(key) or {}).get("relative_spread")), "%", 1),
            fmt((served.get(key) or {}).get("repeats")),
        ]
        for label, key in (("before", "before"), ("after", "after"))
    ]
    warnings = result.get("warnings") or []
    judged = (
        '<p class="note">Verified on a CPU: speed is not judged (Triton\'s interpreter times nothing '
        "meaningful); rewards stop at +1 and kernel/floor times are absent.</p>"
        if speed_not_judged(result)
        else ""
    )
    title = f"gpuyantra campaign {result.get('workflow_id', '')}"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{CSS}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            _table(
                ["model", "hardware", "server", "deployed", "rejected"],
                [
                    [
                        result.get("model") or "unknown",
                        result.get("hardware") or "unknown",
                        _strip_scheme(result.get("server")),
                        len(result.get("deployed") or []),
                        len(result.get("rejected") or []),
                    ]
                ],
            ),
            judged,
            "<h2>Targets</h2>",
            _table(
                [
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
                ],
                rows,
            )
            if rows
            else "<p>No targets.</p>",
            speedup_figure(result),
            roofline_figure(result),
            "<h2>Served speed</h2>",
            _table(["", "tokens/s (median)", "min", "max", "spread", "repeats"], speed_rows),
            f"<p>e2e tokens/s: {fmt(e2e.get('tokens_per_s_before'), digits=1)} → "
            f"{fmt(e2e.get('tokens_per_s_after'), digits=1)}</p>",
            served_figure(result),
            "<h2>Warnings</h2>",
            ("<ul>" + "".join(f'<li class="warn">{html.escape(str(w))}</li>' for w in warnings) + "</ul>")
            if warnings
            else "<p>None.</p>",
            "<h2>Per target</h2>",
            *(_target_section(entry) for entry in targets(result)),
            "</body></html>",
        ]
    )


def write_report(result: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(result), encoding="utf-8")
    return path


def load_result(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read a campaign result from {path}: {exc}") from None
    if not isinstance(data, dict) or not ("deployed" in data or "rejected" in data):
        raise ReportError(f"{path} holds no campaign result (no `deployed` / `rejected`)")
    return data


async def fetch_result(address: str, workflow_id: str) -> dict[str, Any]:
    """The result of a finished campaign; ReportError while it runs or when it did not complete."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    from gpuyantra.campaign_client import connect

    client = await connect(address)
    handle = client.get_workflow_handle(workflow_id)
    try:
        status = (await handle.describe()).status
    except RPCError as exc:
        raise ReportError(f"no campaign {workflow_id} at {address}: {exc}") from None
    if status != WorkflowExecutionStatus.COMPLETED:
        name = status.name.lower() if status is not None else "unknown"
        # Only a running campaign will have a result later; a failed or terminated one never will.
        when = "no result to report yet" if status == WorkflowExecutionStatus.RUNNING else "it has no result to report"
        raise ReportError(f"campaign {workflow_id} is {name}, not completed: {when}")
    return await handle.result()
