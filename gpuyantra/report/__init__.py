"""A campaign's result as a self-contained HTML page and as a few lines of text.

`render_html` shows what the result holds (workflows/campaign.py): the profile when the result
carries one, per target the verdict layer by layer, speedups, % of copy bandwidth, the strategies
tried and the kernel source, a roofline of the device with every kernel and its baselines on it,
and the served speed around each swap; and says when a figure is absent and why (on a CPU speed is
not judged). Its charts are matplotlib's, inlined as SVG (no script, no external URL), so the page
opens offline and can be mailed or archived as one file; matplotlib is imported only when a chart
is drawn.

Modules: `result` (reading a result, the text summary, loading and fetching it), `charts`
(matplotlib), `figures` (which chart shows what, or why it is absent), `page` (the HTML), `live`
(the dashboard's hand-written live line charts).
"""

from gpuyantra.report.charts import PALETTE, Bars, bar_chart, hbar_chart, loglog_chart, roofline_chart, served_chart
from gpuyantra.report.figures import absent, profile_figure, roofline_figure, served_figure, speedup_figure
from gpuyantra.report.live import HEIGHT, MARGIN, WIDTH, Line, line_chart
from gpuyantra.report.page import CSS, MAX_SOURCE_CHARS, Markup, render_html, write_report
from gpuyantra.report.result import (
    ReportError,
    copy_bandwidth_share,
    devices,
    fetch_result,
    figure,
    fmt,
    load_result,
    speed_not_judged,
    target_name,
    targets,
    text_summary,
)

__all__ = [
    "CSS",
    "HEIGHT",
    "MARGIN",
    "MAX_SOURCE_CHARS",
    "PALETTE",
    "WIDTH",
    "Bars",
    "Line",
    "Markup",
    "ReportError",
    "absent",
    "bar_chart",
    "copy_bandwidth_share",
    "devices",
    "fetch_result",
    "figure",
    "fmt",
    "hbar_chart",
    "line_chart",
    "load_result",
    "loglog_chart",
    "profile_figure",
    "render_html",
    "roofline_chart",
    "roofline_figure",
    "served_chart",
    "served_figure",
    "speed_not_judged",
    "speedup_figure",
    "target_name",
    "targets",
    "text_summary",
    "write_report",
]
