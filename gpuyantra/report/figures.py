"""The report's figures: what each chart shows of a campaign result, and, when a chart cannot be
drawn, a line saying it is absent and why (on a CPU speed is not judged: nothing was timed).

Each function returns HTML (an inline SVG chart with its caption, or the absence line); the drawing
itself is gpuyantra/report/charts.py's.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable
from typing import Any

import gpuyantra.report.charts as charts
from gpuyantra.report.result import (
    bench_rows,
    copy_bandwidth_share,
    device_roofs,
    figure,
    fmt,
    fmt_rate,
    fmt_share,
    speed_not_judged,
    target_name,
    targets,
)

# Top module classes of a profile shown in its chart: the rest hold little of the step.
PROFILE_CLASSES = 10


def absent(what: str, why: str) -> str:
    return f'<p class="absent"><strong>{html.escape(what)}: absent.</strong> {html.escape(why)}</p>'


def drawn_with_matplotlib(what: str) -> Callable[[Callable[[dict[str, Any]], str]], Callable[[dict[str, Any]], str]]:
    """A figure that says it is absent, and why, where matplotlib cannot be imported (a machine with
    gpuyantra on its path but not installed), instead of failing the whole page."""

    def wrap(figure: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], str]:
        @functools.wraps(figure)
        def drawn(result: dict[str, Any]) -> str:
            try:
                return figure(result)
            except ImportError as exc:
                if not (exc.name or "").startswith("matplotlib"):
                    raise
                return absent(what, f"matplotlib cannot be imported here ({exc}); install gpuyantra's dependencies.")

        return drawn

    return wrap


def note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


@drawn_with_matplotlib("Speedup chart")
def speedup_figure(result: dict[str, Any]) -> str:
    groups: list[charts.Bars] = [
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
    return charts.bar_chart(
        "Kernel speedup (x, higher is better; dashed: 1x)",
        ["vs eager", "vs torch.compile"],
        groups,
        "speedup (x)",
        reference=1.0,
        reference_label="1x: no faster",
    )


def _served(figures: dict[str, Any] | None) -> charts.Served | None:
    if not figures or figures.get("tokens_per_s") is None:
        return None
    return charts.Served(
        float(figures["tokens_per_s"]), figures.get("min"), figures.get("max"), figures.get("relative_spread")
    )


@drawn_with_matplotlib("Served-speed chart")
def served_figure(result: dict[str, Any]) -> str:
    """Served tokens/s before and after: the campaign's start and end, then around each swap."""
    served = result.get("served_speed") or {}
    rows: list[charts.ServedRow] = [("campaign", _served(served.get("before")), _served(served.get("after")))]
    for entry in targets(result):
        around = entry.get("served_speed") or {}
        rows.append((f"{entry['op']} swap", _served(around.get("before")), _served(around.get("after"))))
    kept = [row for row in rows if row[1] is not None or row[2] is not None]
    if not kept:
        return absent("Served-speed chart", "The result holds no served-speed measurement.")
    chart = charts.served_chart(
        "Served decode tokens/s before and after (median; error bar: min..max of the repeats)", kept, "tokens/s"
    )
    if speed_not_judged(result):
        chart += note(
            "On a CPU the served model runs swapped kernels in Triton's interpreter: these tokens/s are "
            "measured but speed is not judged."
        )
    return chart


def _placed(entry: dict[str, Any]) -> dict[str, charts.Points]:
    """The target's kernel and baselines at (bytes, bytes per second), one list per kind of point."""
    rows = bench_rows(entry)
    kinds = {"kernel": "kernel_us", "eager": "eager_us", "torch.compile": "compile_us"}
    kinds["torch.compile reduce-overhead"] = "compile_ro_us"
    out: dict[str, charts.Points] = {}
    for kind, key in kinds.items():
        points = [(float(r["bytes"]), r["bytes"] / r[key] * 1e6) for r in rows if _timed(r.get(key))]
        if points:
            out[kind] = points
    return out


def _timed(value: Any) -> bool:
    return isinstance(value, (int, float)) and value > 0


@drawn_with_matplotlib("Roofline plot")
def roofline_figure(result: dict[str, Any]) -> str:
    placed = []
    for entry in targets(result):
        kinds = _placed(entry)
        if kinds:
            suffix = "" if entry["status"] == "deployed" else ", not deployed"
            placed.append((f"{target_name(entry)}: {_share_range(entry)} of copy bandwidth{suffix}", kinds))
    if not placed:
        why = (
            "The verdicts ran on a CPU: nothing was timed, so there are no bytes/time points."
            if speed_not_judged(result)
            else "No verdict holds benchmark rows with bytes and kernel time."
        )
        return absent("Roofline plot", why)
    roofs = device_roofs(result)
    copy = roofs.copy_bytes_per_s
    roof_label = f"copy roof {copy / 1e9:,.0f} GB/s" if copy else "no copy bandwidth measured"
    title = f"Roofline on {result.get('hardware') or 'the device'}: attained bandwidth vs bytes moved per call"
    chart = charts.roofline_chart(title, placed, copy, roof_label)
    return chart + note(
        "Each point is one benchmark shape: bytes moved per call over its time; the kernel's height against "
        "the roof is its % of copy bandwidth (copy floor = bytes / measured copy bandwidth, over kernel time), "
        "and eager and torch.compile are the baselines it was timed against. " + _matmul_note(roofs.matmul_flops_per_s)
    )


def _share_range(entry: dict[str, Any]) -> str:
    """The kernel's % of copy bandwidth over its benchmark shapes, as a legend says it."""
    shares = sorted(
        share
        for r in bench_rows(entry)
        if (share := copy_bandwidth_share(r.get("kernel_us"), r.get("floor_us"))) is not None
    )
    if not shares:
        return "–%"
    low, high = fmt_share(shares[0]), fmt_share(shares[-1])
    return low if low == high else f"{low[:-1]}–{high}"


def _matmul_note(matmul: float | None) -> str:
    if matmul is None:
        return (
            "The matmul roof is not drawn: the result holds no measured matmul rate, and its benchmark "
            "rows carry bytes but no FLOP counts."
        )
    return (
        f"Matmul rate {fmt_rate(matmul, 'FLOP/s')} (see Device): not drawn here, since the benchmark rows "
        "carry bytes but no FLOP counts to place a kernel against it."
    )


# ------------------------------------------------------------------------------- profile


@drawn_with_matplotlib("Profile chart")
def profile_figure(result: dict[str, Any]) -> str:
    """Where a served step's time goes (the server's /admin/profile answer, when the result carries
    it as `profile`): per target its measured cost before a swap and the profile's estimate after,
    with its regime; per module class its host and device self time."""
    profile = result.get("profile")
    if not isinstance(profile, dict) or not (profile.get("targets") or profile.get("phases")):
        return absent(
            "Profile chart",
            "The result holds no profile: the campaign ranks its targets from the server's profile "
            "(time per module class and function, and the regime of each) but does not return it.",
        )
    parts = [_profile_summary(profile)]
    rows = _profile_target_rows(result, profile)
    if rows:
        parts.append(
            charts.hbar_chart(
                "Profile targets: µs per step on the critical path, measured before and estimated after a swap",
                ["measured before", "estimated after"],
                rows,
                "µs per step",
            )
        )
        parts.append(_estimates_note(result))
    classes = _classes(profile)
    after = _classes(result.get("profile_after") or {})
    if classes and after:
        parts.append(_classes_before_after(profile, classes, after))
    elif classes:
        phase = profile.get("primary_phase") or "probe"
        parts.append(
            charts.hbar_chart(
                f"Self time per module class ({phase} step)",
                ["host µs", "device µs"],
                [(_class_label(c), [_number(c.get("host_us")), _number(c.get("device_us"))]) for c in classes],
                "µs per step",
            )
        )
    return "".join(parts)


def _profile_target_rows(result: dict[str, Any], profile: dict[str, Any]) -> list[tuple[str, list[float | None]]]:
    """Per profile target its measured cost and, only where the campaign searched it and speed is
    judged, the profile's estimate after a swap: a target not searched has no "after"."""
    searched = {(e.get("op"), e.get("module_class")) for e in targets(result)}
    estimates = not speed_not_judged(result)
    rows = []
    for t in profile.get("targets") or []:
        mine = (t.get("op"), t.get("module_class")) in searched
        label = f"{t.get('op')} · {t.get('module_class')} · {t.get('regime')}"
        after = _number(t.get("est_cost_after_us")) if mine and estimates else None
        rows.append((label, [_number(t.get("cost_us")), after]))
    return rows


def _estimates_note(result: dict[str, Any]) -> str:
    """Which targets the chart estimates after a swap, said beside it (labels stay short: long ones
    squeeze the bars away)."""
    searched = sorted({target_name(e) for e in targets(result)})
    if speed_not_judged(result):
        return note("No target is estimated after a swap: on the CPU speed is not judged.")
    return note(
        "Estimated after a swap only for the targets this campaign searched: "
        + (", ".join(searched) or "none")
        + "; the others are shown as measured."
    )


def _classes_before_after(profile: dict[str, Any], before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    """Self time per module class in the step before the campaign and once its kernels are in: GPU
    time on a GPU, host time on a CPU (where ops run on the host)."""
    key = "host_us" if profile.get("device") == "cpu" else "device_us"
    after_by_class = {row.get("qualified_class") or row.get("module_class"): row for row in after}
    rows = []
    for row in before:
        later = after_by_class.get(row.get("qualified_class") or row.get("module_class")) or {}
        rows.append((_class_label(row), [_number(row.get(key)), _number(later.get(key))]))
    phase = profile.get("primary_phase") or "probe"
    what = "host" if key == "host_us" else "GPU"
    return charts.hbar_chart(
        f"Self {what} time per module class ({phase} step), before the campaign and after its swaps",
        ["before", "after"],
        rows,
        "µs per step",
    )


def _class_label(row: dict[str, Any]) -> str:
    share = _number(row.get("share"))
    return (
        f"{row.get('module_class')} · {fmt_share(share)} of step" if share is not None else str(row.get("module_class"))
    )


def _classes(profile: dict[str, Any]) -> list[dict[str, Any]]:
    phase = (profile.get("phases") or {}).get(profile.get("primary_phase") or "") or {}
    return list(phase.get("classes") or [])[:PROFILE_CLASSES]


def _profile_summary(profile: dict[str, Any]) -> str:
    busy = profile.get("busy_fraction")
    return note(
        f"Profiled {profile.get('primary_phase') or 'probe'} step: {fmt(profile.get('step_ms'), ' ms')}, "
        f"GPU busy {fmt(None if busy is None else 100 * busy, '%', 1)}, "
        f"{fmt(profile.get('launches_per_step'), digits=0)} launches per step, regime {profile.get('regime') or '–'}."
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
