"""What a kernelbench run reports: one `Attempt` per verified candidate, one `ProblemResult` per
problem file, the `RunResult` of a whole run, and KernelBench's fast_p figure over them."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# `not_faster`: ModelNew is correct but, on CUDA, not faster than the better of eager and
# torch.compile beyond the measured noise: correct (fast_0 counts it), never called a win.
STATUSES = ("optimized", "not_faster", "incorrect", "rejected", "unsupported", "skipped", "error")
# The smallest margin a win needs over the better baseline, whatever the measured spread (do_bench
# medians of the same kernel move by about 1% between runs on an idle H200).
MIN_NOISE = 0.02


@dataclass
class Attempt:
    iteration: int
    candidate: str
    strategy: dict[str, Any]
    reward: int
    accepted: bool
    failures: list[dict[str, str]] = field(default_factory=list)
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    timings: dict[str, float] = field(default_factory=dict)  # the verdict's seconds per layer
    library_calls: list[str] = field(default_factory=list)  # library primitives the candidate calls


@dataclass
class ProblemResult:
    name: str
    path: str
    op: str | None = None
    status: str = "error"
    correct: bool = False
    speedup: float | None = None
    reward: int | None = None
    model_new: str | None = None
    reason: str = ""
    adapter: list[dict[str, str]] | None = None
    shapes: list[list[int]] = field(default_factory=list)
    dtype: str | None = None
    model_us: float | None = None
    model_new_us: float | None = None
    speedup_vs_best: float | None = None  # against the better of eager and torch.compile (CUDA)
    compile_us: float | None = None  # torch.compile(Model), timed as Model and ModelNew are (CUDA)
    speedup_vs_compile: float | None = None  # compile_us / model_new_us
    noise: float | None = None  # relative margin a win needs: the timings' spread, at least MIN_NOISE
    library_calls: list[str] = field(default_factory=list)  # library primitives ModelNew's kernel calls
    max_abs_err: float | None = None
    attempts: list[Attempt] = field(default_factory=list)
    verified_against: str | None = None
    reduced: str | None = None  # "live shape -> reduced shape" when run on reduced sizes
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per stage of the run
    # A whole model optimized region by region (level 3): each region's ops, share of the forward's
    # cost, status and what runs it in ModelNew (`Region.to_dict`); empty for one-target problems.
    regions: list[dict[str, Any]] = field(default_factory=list)

    @contextlib.contextmanager
    def phase(self, name: str) -> Any:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - started, 3)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        ordered = {
            key: data.pop(key)
            for key in ("name", "op", "status", "correct", "speedup", "reward", "model_new", "reason")
        }
        ordered.update(data)
        return ordered


@dataclass
class RunResult:
    device: str
    out: str
    problems: list[ProblemResult]
    fast_0: float | None
    fast_1: float | None
    fast_2: float | None
    note: str = ""
    # fast_1 against torch.compile and against the better of eager and compile (CUDA), and the
    # geometric-mean speedups of the correct problems timed (`geomean_speedups`).
    fast_1_vs_compile: float | None = None
    fast_1_vs_best: float | None = None
    geomean: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "problems": [p.to_dict() for p in self.problems],
            "fast_0": self.fast_0,
            "fast_1": self.fast_1,
            "fast_2": self.fast_2,
            "fast_1_vs_compile": self.fast_1_vs_compile,
            "fast_1_vs_best": self.fast_1_vs_best,
            "geomean": self.geomean,
            "out": self.out,
            "note": self.note,
        }


SPEEDUPS = {"eager": "speedup", "compile": "speedup_vs_compile", "best": "speedup_vs_best"}


def fast_p(results: Sequence[ProblemResult], p: float, device: str, against: str = "eager") -> float | None:
    """KernelBench's fast_p: share of all problems with a correct ModelNew more than p times as fast
    as Model (`against` "eager"), its torch.compile ("compile") or the better of both ("best")."""
    if not results:
        return None
    if p == 0:
        return sum(1 for r in results if r.correct) / len(results)
    if device != "cuda":
        return None
    key = SPEEDUPS[against]
    return sum(1 for r in results if r.correct and (getattr(r, key) or 0.0) > p) / len(results)


def geomean_speedups(results: Sequence[ProblemResult]) -> dict[str, float | None]:
    """Geometric mean of each speedup (against eager, compile, the better of both) over the correct
    problems where it was measured; None where none was."""
    out: dict[str, float | None] = {}
    for against, key in SPEEDUPS.items():
        values = [getattr(r, key) for r in results if r.correct and (getattr(r, key) or 0.0) > 0]
        out[against] = math.exp(sum(math.log(v) for v in values) / len(values)) if values else None
    return out


def beats_best(speedup_vs_best: float | None, noise: float | None) -> bool:
    """A win: faster than the better of eager and torch.compile by more than the measured noise."""
    return speedup_vs_best is not None and speedup_vs_best > 1.0 + max(noise or 0.0, MIN_NOISE)
