"""What a campaign result keeps of a served-model profile (`POST /admin/profile`): the figures the
report draws (step, regime, targets' cost before and estimated after, self time per module class),
without what only the workers need (open-target payloads, adapters, per-op breakdowns). Standard
library only: the campaign workflow calls it."""

from __future__ import annotations

from typing import Any

PROFILE_KEYS = (
    "model",
    "device",
    "hardware",
    "primary_phase",
    "step_ms",
    "busy_fraction",
    "launches_per_step",
    "regime",
    "hardware_spec",
)
TARGET_KEYS = (
    "rank",
    "op",
    "module_class",
    "qualified_class",
    "modules",
    "shapes",
    "dtype",
    "share",
    "regime",
    "cost_us",
    "est_cost_after_us",
    "est_gain_us",
    "device_us",
    "host_us",
    "floor_us",
    "arithmetic_intensity",
    "why",
)
PHASE_KEYS = ("step_ms", "busy_fraction", "device_ms", "launches_per_step", "regime", "cuda_graphs")
CLASS_KEYS = ("module_class", "qualified_class", "modules", "share", "host_us", "device_us", "launches", "covered_by")
MAX_TARGETS = 24
MAX_CLASSES = 24  # ranked by share: the rest hold little of the step


def profile_digest(profile: dict[str, Any] | None) -> dict[str, Any] | None:
    """The report's view of a profile; None when there is none (or it is not a profile)."""
    if not isinstance(profile, dict) or not (profile.get("targets") or profile.get("phases")):
        return None
    digest = {key: profile[key] for key in PROFILE_KEYS if key in profile}
    digest["targets"] = [_pick(t, TARGET_KEYS) for t in (profile.get("targets") or [])[:MAX_TARGETS]]
    phases = profile.get("phases") or {}
    digest["phases"] = {
        name: {
            **_pick(phase, PHASE_KEYS),
            "classes": [_pick(c, CLASS_KEYS) for c in (phase.get("classes") or [])[:MAX_CLASSES]],
        }
        for name, phase in phases.items()
        if isinstance(phase, dict)
    }
    return digest


def _pick(row: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: row[key] for key in keys if key in row} if isinstance(row, dict) else {}
