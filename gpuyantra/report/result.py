"""Reading a campaign result (workflows/campaign.py): its targets, figures, device roofs and verdict
layers, the text summary `optimize --wait` prints, and where a result comes from (a file, Temporal).

Nothing here draws: the figures and the page build on these readers, so what a number means is
decided once.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The verifier's layers in the order it runs them (gpuyantra/verifier/verdict.py: LAYERS); it stops
# after the first layer that fails.
LAYERS = ("static", "contract", "sandbox", "correctness", "benchmark")


class ReportError(RuntimeError):
    """The result cannot be fetched or read."""


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
    if _positive(kernel_us) and isinstance(floor_us, (int, float)):
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


def fmt_rate(value: float, unit: str) -> str:
    """A rate with the prefix that keeps three significant digits: 50 GFLOP/s, not 0 TFLOP/s."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:,.3g} {prefix}{unit}"
    return f"{value:,.3g} {unit}"


def pct(share: float | None) -> float | None:
    return None if share is None else 100.0 * share


def fmt_share(share: float | None) -> str:
    """A share as a percentage that keeps small shares readable (0.15%, not 0.1%)."""
    value = pct(share)
    if value is None:
        return "–"
    return f"{value:.1f}%" if abs(value) >= 1 else f"{value:.2g}%"


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def bench_rows(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdict's benchmark rows that can be placed on the roofline (bytes and a kernel time)."""
    rows = (entry.get("verdict") or {}).get("bench") or []
    return [r for r in rows if _positive(r.get("bytes")) and _positive(r.get("kernel_us"))]


# ------------------------------------------------------------------------------- device roofs


@dataclass(frozen=True)
class Roofs:
    """The device's two roofs and where each number comes from (a page must say which are measured)."""

    copy_bytes_per_s: float | None
    copy_source: str
    matmul_flops_per_s: float | None
    matmul_source: str

    @property
    def ridge(self) -> float | None:
        """FLOP per byte where the matmul roof meets the copy roof."""
        if self.copy_bytes_per_s and self.matmul_flops_per_s:
            return self.matmul_flops_per_s / self.copy_bytes_per_s
        return None


def hardware_spec(result: dict[str, Any]) -> dict[str, Any]:
    """The measured hardware facts (gpuyantra/hardware.py: HardwareSpec.to_dict) the result carries,
    at its top level or inside a profile; {} when it carries none."""
    for holder in (result, result.get("profile") or {}):
        spec = holder.get("hardware_spec") if isinstance(holder, dict) else None
        if isinstance(spec, dict) and spec:
            return spec
    return {}


def device_roofs(result: dict[str, Any]) -> Roofs:
    """Copy bandwidth and matmul rate: from the hardware spec when the result has one, else the copy
    bandwidth the verifier measured, read back from its floors (floor_us = bytes / copy bandwidth)."""
    spec = hardware_spec(result)
    copy, matmul = _rate(spec.get("copy_bytes_per_s")), _rate(spec.get("matmul_flops_per_s"))
    # A spec that says it was not measured (the CPU's) holds nominal figures: the page must not call them measured.
    spec_source = "nominal (hardware spec, not measured on this device)" if spec.get("measured") is False else None
    copy_source = spec_source or "measured (hardware spec)"
    if copy is None:
        derived = [
            r["bytes"] / r["floor_us"] * 1e6
            for e in targets(result)
            for r in bench_rows(e)
            if _positive(r.get("floor_us"))
        ]
        copy = float(statistics.median(derived)) if derived else None
        copy_source = "measured by the verifier (bytes / floor time of its benchmark rows)" if derived else "absent"
    return Roofs(
        copy_bytes_per_s=copy,
        copy_source=copy_source,
        matmul_flops_per_s=matmul,
        matmul_source=(spec_source or "measured (hardware spec)") if matmul is not None else "absent",
    )


def _rate(value: Any) -> float | None:
    return float(value) if _positive(value) else None


# ------------------------------------------------------------------------------- verdict layers


def verdict_layers(verdict: dict[str, Any]) -> list[tuple[str, str]]:
    """(layer, outcome) for each verifier layer: passed, failed with its rules, or not judged after an
    earlier failure; the benchmark layer of a CPU verdict says speed is not judged there."""
    if not verdict:
        return []
    failures = verdict.get("failures") or []
    failed = {layer: [f.get("rule") for f in failures if f.get("layer") == layer] for layer in LAYERS}
    first = next((i for i, layer in enumerate(LAYERS) if failed[layer]), None)
    rows = []
    for i, layer in enumerate(LAYERS):
        if failed[layer]:
            outcome = "failed: " + ", ".join(str(rule) for rule in failed[layer])
        elif first is not None and i > first:
            outcome = "not judged (an earlier layer failed)"
        elif layer == "benchmark":
            outcome = _benchmark_outcome(verdict)
        else:
            outcome = "passed"
        rows.append((layer, outcome))
    return rows


def _benchmark_outcome(verdict: dict[str, Any]) -> str:
    device = str(verdict.get("device") or "")
    if device and not device.startswith("cuda"):
        return f"not timed: speed is not judged on {device}"
    eager, compiled = verdict.get("speedup_vs_eager"), verdict.get("speedup_vs_compile")
    if eager is None:
        return "passed (no timing)"
    return f"passed: x{fmt(eager)} vs eager, x{fmt(compiled)} vs torch.compile"


# ------------------------------------------------------------------------------- text and sources


def text_summary(result: dict[str, Any]) -> list[str]:
    """The human summary `optimize --wait` and `demo` print at the end: what was deployed into which
    server, served decode speed before and after at each batch, what was rejected and why."""
    deployed, rejected = result.get("deployed") or [], result.get("rejected") or []
    lines = [
        f"Campaign {result.get('workflow_id')} finished: {len(deployed)} deployed into "
        f"{result.get('server') or 'the server'}, {len(rejected)} rejected "
        f"(model {result.get('model') or 'unknown'}, hardware {result.get('hardware') or 'unknown'})"
    ]
    lines += [f"  deployed {target_name(entry)}: {deployed_text(entry)}" for entry in deployed]
    lines += [f"  rejected {target_name(entry)}: {entry.get('reason')}" for entry in rejected]
    lines += skipped_lines(result.get("skipped") or [])
    lines += speed_lines(result)
    if not deployed and not rejected:
        lines.append("  no target was searched")
    return lines


def skipped_lines(skipped: list[dict[str, Any]]) -> list[str]:
    """Targets already swapped, one line each; the others skipped (gain within the noise, beyond
    max_targets) counted in one line, so a profile of many small targets keeps the summary short."""
    swapped = [entry for entry in skipped if str(entry.get("reason", "")).startswith("already swapped")]
    lines = [f"  skipped {target_name(entry)}: {entry.get('reason')}" for entry in swapped]
    others = len(skipped) - len(swapped)
    if others:
        lines.append(
            f"  skipped {others} more target(s): estimated gain within the measured noise, or beyond max_targets"
        )
    return lines


def deployed_text(entry: dict[str, Any]) -> str:
    """Reward, modules and, where speed was judged, the verdict's speedups."""
    text = f"reward {entry.get('reward'):+d}, {entry.get('modules')} module(s), swap {entry.get('swap_id')}"
    eager, compiled = figure(entry, "speedup_vs_eager"), figure(entry, "speedup_vs_compile")
    if eager is None:
        device = (entry.get("verdict") or {}).get("device") or "this device"
        return f"{text}; speed not judged on {device}"
    return f"{text}; kernel x{fmt(eager)} vs eager, x{fmt(compiled)} vs torch.compile"


def speed_lines(result: dict[str, Any]) -> list[str]:
    """Served decode tokens/s before the campaign and after it, one line per batch."""
    served = result.get("served_speed") or {}
    measured_apart = served.get("batches")
    batches: dict[str, Any] = measured_apart if isinstance(measured_apart, dict) else {"": served}
    lines = []
    for batch, figures in sorted(batches.items(), key=lambda bf: int(bf[0] or 0)):
        before, after = (figures or {}).get("before") or {}, (figures or {}).get("after") or {}
        if before.get("tokens_per_s") is None or after.get("tokens_per_s") is None:
            continue
        change = after["tokens_per_s"] / before["tokens_per_s"] - 1 if before["tokens_per_s"] else 0.0
        lines.append(
            f"  served decode{f' at batch {batch}' if batch else ''}: {before['tokens_per_s']:.1f} -> "
            f"{after['tokens_per_s']:.1f} tokens/s ({change:+.1%}; spread "
            f"{before.get('relative_spread', 0):.1%} / {after.get('relative_spread', 0):.1%})"
        )
    if lines and speed_not_judged(result):
        lines.append(
            "  on the CPU kernels run in Triton's interpreter: slower served speed is expected, and only "
            "correctness is judged (reward +1)"
        )
    elif lines:
        lines += [f"  warning: {warning}" for warning in result.get("warnings") or []]
    return lines


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
