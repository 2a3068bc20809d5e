"""The dashboard's live line charts, as SVG written by hand.

The dashboard redraws its tokens/s and latency charts on every poll and places them with innerHTML;
a few lines of SVG per chart keep each poll cheap (no matplotlib figure per chart and poll), and
the dashboard's tests check their shape (one <polyline> per run, a <circle> for a run
of one point). The report page's charts are matplotlib's (gpuyantra/report/charts.py).
"""

from __future__ import annotations

import html

PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]
WIDTH, HEIGHT, MARGIN = 640, 300, 56


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
