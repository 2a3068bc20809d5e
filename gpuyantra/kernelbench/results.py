"""What a kernelbench run reports: one `Attempt` per verified candidate, one `ProblemResult` per
problem file, the `RunResult` of a whole run, and KernelBench's fast_p figure over them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("optimized", "incorrect", "rejected", "unsupported", "skipped", "error")


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
    max_abs_err: float | None = None
    attempts: list[Attempt] = field(default_factory=list)
    verified_against: str | None = None
    reduced: str | None = None  # "live shape -> reduced shape" when run on reduced sizes
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per stage of the run

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "problems": [p.to_dict() for p in self.problems],
            "fast_0": self.fast_0,
            "fast_1": self.fast_1,
            "fast_2": self.fast_2,
            "out": self.out,
            "note": self.note,
        }


def fast_p(results: Sequence[ProblemResult], p: float, device: str) -> float | None:
    """KernelBench's fast_p: share of all problems with a correct ModelNew more than p times as fast."""
    if not results:
        return None
    if p == 0:
        return sum(1 for r in results if r.correct) / len(results)
    if device != "cuda":
        return None
    return sum(1 for r in results if r.correct and r.speedup is not None and r.speedup > p) / len(results)
