"""The verifier's answer: a `Verdict` with its `Failure`s, and the reward ladder of docs/CONTRACTS.md section 4."""

from __future__ import annotations

import math
from collections.abc import Sequence
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
    # Per plan class beyond the seeds x scales grid (cases.class_cases): "full", "reduced" (a smaller
    # instance: the CPU interpreter's budget) or why it did not run.
    plan_classes: dict[str, str] = field(default_factory=dict)
    dtypes: list[str] = field(default_factory=list)
    device: str = "cpu"
    module_class: str | None = None
    network_isolated: bool | None = None
    # The layers that held around the candidate's process (landlock ABI, seccomp, ...; docs/verifier.md).
    isolation: dict[str, Any] | None = None
    bench: list[dict[str, Any]] = field(default_factory=list)
    # SHA-256 of the exact bytes the static layer read, and, for an accepted verdict only, the signed
    # record the server checks before it swaps those bytes in (gpuyantra/attestation.py).
    source_sha256: str | None = None
    attestation: dict[str, Any] | None = None
    # Wall seconds per stage (static, contract, child_import, correctness, benchmark, recheck, judge):
    # where a verdict's time goes. Beside them two strings: how the outputs reached the parent
    # (`outputs_transport`) and, where they fell back to the host, why (`outputs_fallback`).
    timings: dict[str, float | str] = field(default_factory=dict)
    # Library primitives the candidate calls (an open target's convolution, GEMM or attention,
    # gpuyantra/ops/open/library.py): timed with the rest of entry, everything else is Triton.
    library_calls: list[str] = field(default_factory=list)

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


def reward_on_shapes(verdict: dict[str, Any], shapes: list[list[int]]) -> dict[str, Any] | None:
    """`compute_reward` from the verdict's timed rows at `shapes` alone: the speedups and reward a
    campaign judges a served target on (its decode shapes), or None where the verdict has failures
    or timed none of `shapes`. Same geometric means as the judge: kernel vs eager, kernel vs the
    faster torch.compile mode."""
    wanted = [list(s) for s in shapes]
    rows = [r for r in verdict.get("bench") or [] if list(r.get("shape") or []) in wanted]
    if verdict.get("failures") or not rows or any(not r.get("kernel_us") for r in rows):
        return None
    eager, vs_compile = speedups(rows)
    return {
        "shapes": [list(r["shape"]) for r in rows],
        "reward": compute_reward([], str(verdict.get("device") or "cuda"), eager, vs_compile),
        "speedup_vs_eager": eager,
        "speedup_vs_compile": vs_compile,
    }


def speedups(rows: Sequence[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(vs eager, vs the faster torch.compile mode): geometric means over timed `rows` (each with a
    `kernel_us`); vs compile is None unless every row has a compile time."""
    eager, compiled = [], []
    for row in rows:
        eager.append(row["eager_us"] / row["kernel_us"] if row.get("eager_us") else None)
        times = [t for t in (row.get("compile_us"), row.get("compile_ro_us")) if t]
        compiled.append(min(times) / row["kernel_us"] if times else None)
    return geomean(eager), geomean(compiled) if all(r is not None for r in compiled) else None


def geomean(values: Sequence[float | None]) -> float | None:
    """Geometric mean of the finite positive values (None when there are none): speedups over shapes."""
    kept = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in kept) / len(kept)) if kept else None
