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


def judged_on_served_decode(verdict: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """The verdict a campaign acts on for a served target: reward and speedups from its served decode
    shapes (the target's `served_shapes` of the `decode@<batch>` workloads).

    Why: served tokens/s is decode steps, each one call per shape per step, while the prefill shape
    runs once per request; an equal-weight mean over both let a prefill loss outvote a decode gain
    (and the reverse). Every shape stays timed and reported: the whole-verdict figures move to
    `all_shapes`, and `judged_on` says which shapes decided. Unchanged when the target names no
    decode shapes or the verdict timed only those."""
    decode = [
        s for name, shapes in (target.get("served_shapes") or {}).items() if name.startswith("decode") for s in shapes
    ]
    judged = reward_on_shapes(verdict, decode) if decode else None
    timed = [list(r.get("shape") or []) for r in verdict.get("bench") or []]
    if judged is None or sorted(judged["shapes"]) == sorted(timed):
        return verdict
    keys = ("reward", "speedup_vs_eager", "speedup_vs_compile")
    return {
        **verdict,
        **{key: judged[key] for key in keys},
        "all_shapes": {key: verdict.get(key) for key in keys},
        "judged_on": {"shapes": judged["shapes"], "why": "served decode shapes"},
    }


def rows_gate(verdict: dict[str, Any]) -> dict[str, list[int]] | None:
    """Which row counts the kernel should serve: {"kernel": rows, "original": rows} from the timed rows
    (rows: the product of the activation shape's leading dims), or None where the kernel was faster at
    every timed row count, or speed was not judged (CPU, failures).

    Why: one verdict times a kernel at several row counts (decode at batch 1 and 8, a prefill), and a
    GEMV that halves the one-row projection can lose to cuBLAS at eight rows. The server then serves
    each call with the kernel or the original forward, whichever was faster at the nearest timed row
    count (`gpuyantra.swap.guards.serves_kernel`). Ratios of several dtypes at one row count are
    combined by their geometric mean."""
    if verdict.get("failures") or str(verdict.get("device") or "") != "cuda":
        return None
    ratios: dict[int, list[float]] = {}
    for row in verdict.get("bench") or []:
        shape, kernel, eager = row.get("shape"), row.get("kernel_us"), row.get("eager_us")
        if not shape or not kernel or not eager or not all(isinstance(d, int) and d > 0 for d in shape):
            continue  # untimed, or not one activation's shape (nothing to count rows by)
        rows = math.prod(shape[:-1])
        ratios.setdefault(rows, []).append(eager / kernel)
    faster = {rows: (geomean(values) or 0.0) > 1.0 for rows, values in ratios.items()}
    original = sorted(rows for rows, wins in faster.items() if not wins)
    if not original:
        return None
    return {"kernel": sorted(rows for rows, wins in faster.items() if wins), "original": original}
