"""The verifier's answer: a `Verdict` with its `Failure`s, and the reward ladder of docs/CONTRACTS.md section 4."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

LAYERS = ("static", "contract", "sandbox", "correctness", "benchmark")

# "Faster" means faster by more than this factor (docs/CONTRACTS.md section 4: by more than 5%).
FASTER_BY = 1.05


@dataclass(frozen=True)
class Failure:
    """One reason for rejection: the layer that found it, the rule it broke, and what happened."""

    layer: str
    rule: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"layer": self.layer, "rule": self.rule, "message": self.message}


@dataclass
class Verdict:
    op: str | None
    accepted: bool
    reward: int
    failures: list[Failure] = field(default_factory=list)
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    # Extras (stable, documented in docs/verifier.md).
    kernel_us: float | None = None
    eager_us: float | None = None
    compile_us: float | None = None
    compile_ro_us: float | None = None
    floor_us: float | None = None
    checks: int = 0
    seconds: float = 0.0
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    device: str = "cpu"
    module_class: str | None = None
    network_isolated: bool | None = None
    bench: list[dict[str, Any]] = field(default_factory=list)
    # SHA-256 of the exact bytes the static layer read, and, for an accepted verdict only, the signed
    # record the server checks before it swaps those bytes in (gpuyantra/attestation.py).
    source_sha256: str | None = None
    attestation: dict[str, Any] | None = None
    # Wall seconds per stage (static, contract, child_import, correctness, benchmark, recheck, judge):
    # where a verdict's time goes.
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The `verify --json` object: docs/CONTRACTS.md section 4 keys first, then the extras."""
        data = asdict(self)
        data["failures"] = [f.to_dict() for f in self.failures]
        ordered = {
            key: data.pop(key)
            for key in ("op", "accepted", "reward", "failures", "speedup_vs_eager", "speedup_vs_compile")
        }
        ordered.update(data)
        return _finite(ordered)


def compute_reward(
    failures: list[Failure], device: str, speedup_vs_eager: float | None, speedup_vs_compile: float | None
) -> int:
    """-1 wrong or cheating; +1 correct; +2 faster than eager; +3 faster than eager and torch.compile.

    Computed by the parent from its own numbers; speed is judged only on CUDA.
    """
    if failures:
        return -1
    if device != "cuda" or speedup_vs_eager is None or not speedup_vs_eager > FASTER_BY:
        return 1
    if speedup_vs_compile is not None and speedup_vs_compile > FASTER_BY:
        return 3
    return 2


def _finite(value: Any) -> Any:
    """JSON has no NaN or Infinity: write them as null so every consumer can parse the verdict."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
