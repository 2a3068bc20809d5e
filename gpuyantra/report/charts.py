"""The report's charts, drawn with matplotlib and inlined in the page as SVG text.

matplotlib is imported by the first chart drawn, not with gpuyantra: the CLI and the workers start
without it. It draws headless (the Agg backend, no GUI toolkit). Its SVG is made fit for one offline
page: `svg.fonttype = "none"` keeps every label a <text> element (searchable, copyable, testable), a
fixed `svg.hashsalt` per chart makes one result give the same bytes every time, and the XML prologue,
the metadata and the namespace URLs are dropped so the page names nothing outside itself.
"""

from __future__ import annotations

import html
import io
import math
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Bars = tuple[str, list[float | None], list[Any]]  # label, one value per series, one (low, high) or None each
Points = list[tuple[float, float]]


@dataclass(frozen=True)
class Served:
    """One served-speed measurement: median tokens/s, min and max of the repeats, relative spread."""

    tokens: float
    low: float | None = None
    high: float | None = None
    spread: float | None = None


ServedRow = tuple[str, Served | None, Served | None]  # label, before, after

PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
ROLE_COLOURS = {"before": "#4c72b0", "after": "#dd8452"}
# Marker per kind of point on the roofline: the kernel and the baselines it was timed against.
MARKERS = {"kernel": "o", "eager": "x", "torch.compile": "^", "torch.compile reduce-overhead": "v"}
WIDTH_IN, HEIGHT_IN = 7.2, 3.3
RC = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 9,
    "axes.titlesize": 10.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e4e4e4",
    "legend.fontsize": 8,
    "legend.frameon": False,
}
_DRAWING = threading.Lock()  # rcParams are process-global: one chart at a time (the dashboard serves reports)


def _matplotlib() -> Any:
    """matplotlib, headless. Agg is chosen unless pyplot is already up (an embedding program's own
    backend is left alone: these charts never touch pyplot)."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    return matplotlib


@contextmanager
def _figure(title: str, width: float = WIDTH_IN, height: float = HEIGHT_IN) -> Iterator[Figure]:
    """A figure drawn under the report's style, with a salt of its own so its SVG ids are stable."""
    matplotlib = _matplotlib()
    from matplotlib.figure import Figure

    with _DRAWING, matplotlib.rc_context({**RC, "svg.hashsalt": f"gpuyantra-report:{title}"}):
        yield Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Figure, title: str) -> str:
    """The figure as SVG text for inline use: no prologue, metadata or namespace URL, a <title>."""
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"\s*<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text)
    text = text.replace("xlink:href=", "href=")  # SVG 2 spelling: no xlink namespace needed inline
    label = html.escape(title)
    return re.sub(
        r"<svg\b([^>]*)>",
        lambda m: f'<svg class="chart" role="img" aria-label="{label}"{m.group(1)}><title>{label}</title>',
        text,
        count=1,
    )


def plain(text: str) -> str:
    """Text matplotlib shows as written: a `$` would start math mode."""
    return str(text).replace("$", r"\$")


def _title(ax: Axes, title: str) -> None:
    """The chart's title over the whole figure, left-aligned: long tick labels cannot push it off."""
    ax.figure.suptitle(plain(title), x=0.01, ha="left", fontsize=RC["axes.titlesize"])


def _legend(ax: Axes, **kwargs: Any) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kwargs)


def _xtick_labels(ax: Axes, labels: list[str]) -> None:
    """Group labels under their bars; slanted when long, so they do not run into each other."""
    slant = len(labels) > 3 and max((len(label) for label in labels), default=0) > 12
    ax.set_xticks(range(len(labels)), [plain(label) for label in labels], rotation=20 if slant else 0)
    if slant:
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")


def bar_chart(
    title: str,
    series: list[str],
    groups: list[Bars],
    ylabel: str,
    reference: float | None = None,
    reference_label: str | None = None,
) -> str:
    """Grouped bars, one group per label, each bar labelled with its value; a (low, high) pair draws
    an error bar; `reference` a dashed line (1x: no faster)."""
    with _figure(title) as fig:
        ax = fig.subplots()
        width = 0.8 / max(len(series), 1)
        for s, name in enumerate(series):
            xs, values, lows, highs = [], [], [], []
            for g, (_, vals, errs) in enumerate(groups):
                value = vals[s] if s < len(vals) else None
                if value is None:
                    continue
                err = errs[s] if s < len(errs) else None
                xs.append(g - 0.4 + width * (s + 0.5))
                values.append(value)
                lows.append(value - err[0] if err else 0.0)
                highs.append(err[1] - value if err else 0.0)
            bars = ax.bar(xs, values, width * 0.9, color=PALETTE[s % len(PALETTE)], label=plain(name))
            if any(lows) or any(highs):
                ax.errorbar(xs, values, yerr=[lows, highs], fmt="none", ecolor="#222", capsize=3, linewidth=1)
            ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], padding=2, fontsize=7.5)
        if reference is not None:
            ax.axhline(
                reference,
                color="#c00",
                linestyle="--",
                linewidth=1,
                label=plain(reference_label or f"reference {reference:g}"),
            )
        _xtick_labels(ax, [label for label, _, _ in groups])
        ax.set_ylabel(plain(ylabel))
        ax.set_ylim(0, _top([v for _, vals, errs in groups for v in [*vals, *_highs(errs)]], reference))
        ax.grid(axis="x", visible=False)
        _title(ax, title)
        _legend(ax)
        return _svg(fig, title)


def _highs(errs: list[Any]) -> list[float]:
    return [float(e[1]) for e in errs if e]


def _top(values: Sequence[float | None], reference: float | None = None) -> float:
    """The y limit: room above the highest bar for its label."""
    highest = max([v for v in values if v is not None] + [reference or 0.0], default=0.0)
    return highest * 1.18 if highest > 0 else 1.0


def hbar_chart(title: str, series: list[str], rows: list[tuple[str, list[float | None]]], xlabel: str) -> str:
    """Horizontal grouped bars, one row per label, first row on top: long labels (a module class and
    its regime) stay readable."""
    height = max(HEIGHT_IN * 0.6, 0.9 + 0.16 * len(rows) * max(len(series), 1))
    with _figure(title, height=height) as fig:
        ax = fig.subplots()
        bar = 0.8 / max(len(series), 1)
        for s, name in enumerate(series):
            ys = [r - 0.4 + bar * (s + 0.5) for r, (_, vals) in enumerate(rows) if vals[s] is not None]
            values = [float(v) for _, vals in rows if (v := vals[s]) is not None]
            bars = ax.barh(ys, values, bar * 0.9, color=PALETTE[s % len(PALETTE)], label=plain(name))
            ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.3g}" for v in values], padding=2, fontsize=7)
        ax.set_yticks(range(len(rows)), [plain(label) for label, _ in rows])
        ax.invert_yaxis()
        ax.set_xlim(0, _top([v for _, vals in rows for v in vals]))
        ax.xaxis.set_major_locator(_locator(5))
        ax.set_xlabel(plain(xlabel))
        ax.grid(axis="y", visible=False)
        _title(ax, title)
        _legend(ax)
        return _svg(fig, title)


def served_chart(title: str, rows: list[ServedRow], xlabel: str) -> str:
    """Served tokens/s as horizontal bar pairs, one row per measurement pair (the campaign's start and
    end, then before and after each swap), each bar with its min..max error bar and its spread."""
    height = max(HEIGHT_IN * 0.6, 1.0 + 0.45 * len(rows))
    with _figure(title, height=height) as fig:
        ax = fig.subplots()
        for s, (role, colour) in enumerate(ROLE_COLOURS.items()):
            picked = [(r, m) for r, (_, *pair) in enumerate(rows) if (m := pair[s]) is not None]
            if picked:
                _served_bars(ax, [r - 0.2 + 0.4 * s for r, _ in picked], [m for _, m in picked], colour, role)
        ax.set_yticks(range(len(rows)), [plain(row[0]) for row in rows])
        ax.invert_yaxis()
        highs = [m.high or m.tokens for _, *pair in rows for m in pair if m is not None]
        ax.set_xlim(0, _top(highs) * 1.15)
        ax.set_xlabel(plain(xlabel))
        ax.grid(axis="y", visible=False)
        _title(ax, title)
        _legend(ax)
        return _svg(fig, title)


def _served_bars(ax: Axes, ys: list[float], measured: list[Served], colour: str, label: str) -> None:
    """One role's bars: the median, a min..max error bar, the median and spread written beside."""
    values = [m.tokens for m in measured]
    lows = [m.tokens - m.low if m.low is not None else 0.0 for m in measured]
    highs = [m.high - m.tokens if m.high is not None else 0.0 for m in measured]
    drawn = ax.barh(ys, values, 0.36, color=colour, label=label)
    ax.errorbar(values, ys, xerr=[lows, highs], fmt="none", ecolor="#222", capsize=2, linewidth=1)
    labels = [
        f"{m.tokens:.1f}" + (f" (spread {100 * m.spread:.1f}%)" if m.spread is not None else "") for m in measured
    ]
    ax.bar_label(drawn, labels=labels, padding=8, fontsize=7.5)


def loglog_chart(
    title: str,
    series: list[tuple[str, Points]],
    xlabel: str,
    ylabel: str,
    links: Sequence[tuple[tuple[float, float], tuple[float, float]]] = (),
) -> str:
    """Points on log-log axes, one colour per series; `links` join pairs of points (kernel to floor)."""
    with _figure(title) as fig:
        ax = fig.subplots()
        for a, b in links:
            if min(*a, *b) > 0:
                ax.plot([a[0], b[0]], [a[1], b[1]], color="#999", linestyle=":", linewidth=1)
        for i, (name, points) in enumerate(series):
            kept = [(x, y) for x, y in points if x > 0 and y > 0]
            if kept:
                xs, ys = [x for x, _ in kept], [y for _, y in kept]
                ax.scatter(xs, ys, s=22, color=PALETTE[i % len(PALETTE)], label=plain(name), zorder=3)
        points = [p for _, pts in series for p in pts if p[0] > 0 and p[1] > 0]
        _log_axes(ax, [x for x, _ in points], [y for _, y in points])
        ax.set_xlabel(plain(xlabel))
        ax.set_ylabel(plain(ylabel))
        _title(ax, title)
        _legend(ax)
        return _svg(fig, title)


def roofline_chart(
    title: str,
    placed: list[tuple[str, dict[str, Points]]],
    roof: float | None,
    roof_label: str,
    xlabel: str = "bytes moved per call",
    ylabel: str = "attained bandwidth (GB/s)",
) -> str:
    """The bandwidth roofline on log-log axes: per target (one colour) its kernel and baselines (one
    marker per kind) at (bytes, bytes/s) under the copy roof."""
    from matplotlib.lines import Line2D

    with _figure(title, height=HEIGHT_IN + 0.35 * len(placed) + 0.6) as fig:
        ax = fig.subplots()
        handles = []
        if roof:
            handles.append(ax.axhline(roof / 1e9, color="#c00", linewidth=1.5, label=plain(roof_label)))
        for i, (name, kinds) in enumerate(placed):
            colour = PALETTE[i % len(PALETTE)]
            for kind, points in kinds.items():
                ax.scatter(
                    [x for x, _ in points],
                    [y / 1e9 for _, y in points],
                    marker=MARKERS.get(kind, "o"),
                    s=30,
                    color=colour,
                    zorder=3,
                )
            handles.append(Line2D([], [], color=colour, marker="s", linestyle="none", label=plain(name)))
        markers = [Line2D([], [], color="#444", marker=m, linestyle="none", label=k) for k, m in MARKERS.items()]
        ax.add_artist(ax.legend(handles=markers, loc="best", frameon=True, framealpha=0.9))
        every = [point for _, kinds in placed for points in kinds.values() for point in points]
        _log_axes(ax, [x for x, _ in every], [y / 1e9 for _, y in every] + ([roof / 1e9] if roof else []))
        ax.xaxis.set_major_formatter(_formatter(_bytes_text))
        ax.yaxis.set_major_formatter(_formatter(lambda v: f"{v:g}"))
        ax.set_xlabel(plain(xlabel))
        ax.set_ylabel(plain(ylabel))
        _title(ax, title)
        fig.legend(handles=handles, loc="outside lower left", ncols=1)
        return _svg(fig, title)


def _log_axes(ax: Axes, xs: Sequence[float], ys: Sequence[float]) -> None:
    """Log axes from the power of ten below the data to the one above: at least two labelled decades,
    so no axis falls back to unlabelled or scientific minor ticks."""
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for values, set_limits, axis in ((xs, ax.set_xlim, ax.xaxis), (ys, ax.set_ylim, ax.yaxis)):
        kept = [v for v in values if v > 0]
        if kept:
            low, high = math.floor(math.log10(min(kept))), math.ceil(math.log10(max(kept)))
            set_limits(10.0**low, 10.0 ** max(high, low + 1))
        axis.set_minor_formatter(NullFormatter())


def _locator(ticks: int) -> Any:
    """At most `ticks` round ticks: five-digit labels in a narrow chart would run together."""
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(ticks)


def _formatter(text: Any) -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _pos: text(value))


def _bytes_text(value: float) -> str:
    """A byte count in decimal units, as tick labels on a log axis read best."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:g} {unit}"
    return f"{value:g} B"
