"""Judging one accepted candidate as KernelBench does: its ModelNew checked against Model, then on
CUDA timed against Model eager and Model under torch.compile, and called a win only when it beats
the better of both by more than the timings' own spread.

Why here and not in the verifier: the verifier times the kernel on its own cases, kernelbench the
problem's whole forward on its own inputs. A kernel the verifier rated +3 was still 0.07x of eager
as a whole ModelNew (a softmax of large logits), so the search goes on until the whole forward wins.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from gpuyantra.kernelbench.results import Attempt, beats_best


@dataclass
class Timing:
    us: float  # median
    spread: float  # (80th - 20th percentile) / median: how far this measurement moves


@dataclass
class Baselines:
    """Model eager and under torch.compile, timed once per problem (with the first correct ModelNew)."""

    eager: Timing | None = None
    compiled: Timing | None = None
    compile_error: str | None = None

    @property
    def best(self) -> Timing | None:
        times = [t for t in (self.eager, self.compiled) if t is not None]
        return min(times, key=lambda t: t.us) if times else None


@dataclass
class Evaluation:
    attempt: Attempt
    correct: bool
    why: str
    max_abs_err: float | None = None
    model_new: Timing | None = None
    timing_error: str | None = None

    def speedups(self, baselines: Baselines) -> tuple[float | None, float | None, float | None]:
        """(vs eager, vs torch.compile, vs the better of both) of the timed ModelNew."""
        if self.model_new is None or self.model_new.us <= 0:
            return None, None, None
        us = self.model_new.us

        def ratio(t: Timing | None) -> float | None:
            return t.us / us if t is not None else None

        return ratio(baselines.eager), ratio(baselines.compiled), ratio(baselines.best)

    def noise(self, baselines: Baselines) -> float | None:
        """The relative margin a win needs: the wider spread of ModelNew's and the best baseline's timing."""
        best = baselines.best
        if self.model_new is None or best is None:
            return None
        return max(self.model_new.spread, best.spread)

    def won(self, baselines: Baselines) -> bool:
        return self.correct and beats_best(self.speedups(baselines)[2], self.noise(baselines))

    def rank(self, baselines: Baselines) -> tuple[bool, bool, float]:
        """Order of preference: a win, then correct, then faster against the better baseline."""
        return self.won(baselines), self.correct, self.speedups(baselines)[2] or 0.0


def time_cuda(fn: Callable[[], Any]) -> Timing:
    """Median and spread of `fn` (triton.testing.do_bench: CUDA events, L2 flushed between runs)."""
    import triton.testing

    with torch.no_grad():
        low, median, high = triton.testing.do_bench(fn, warmup=25, rep=200, quantiles=[0.2, 0.5, 0.8])
    return Timing(us=float(median) * 1000.0, spread=(float(high) - float(low)) / float(median) if median else 0.0)


def time_baselines(model: torch.nn.Module, inputs: list[Any], warm: Callable[[], Any], alone: Any) -> Baselines:
    """Model eager and torch.compile(Model) on `inputs`. The compile (host work) and its first call
    run under `warm` (the GPU shared), the timings under `alone` (nothing else on the GPU). A Model
    torch.compile cannot compile is timed eager only and the reason kept."""
    baselines = Baselines()
    compiled: Any = None
    with warm():
        try:
            compiled = torch.compile(model)
            with torch.no_grad():
                compiled(*inputs)  # compiles
        except Exception as exc:  # noqa: BLE001 - dynamo/inductor refusing a Model is a baseline fact
            compiled, baselines.compile_error = None, f"{type(exc).__name__}: {exc}"[:300]
    with alone():
        baselines.eager = time_cuda(lambda: model(*inputs))
        if compiled is not None:
            baselines.compiled = time_cuda(lambda: compiled(*inputs))
    compiled = None  # its graphs hold memory: gone before ModelNew is timed
    _forget_compiled()
    return baselines


def _forget_compiled() -> None:
    """Drop dynamo's compiled graphs (and the memory they hold) before the next problem."""
    import torch._dynamo

    torch._dynamo.reset()


def free_device_memory(device: str) -> None:
    """Give cached GPU memory back between checks and timings: the next draw or a shard beside
    this one may need it (a float64 check of a multi-GB problem needs tens of GB at once)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def nothing() -> Iterator[None]:
    yield


def summary(evaluation: Evaluation, baselines: Baselines) -> str:
    """`ModelNew 12.0 us; Model eager 20.0 us (1.67x), torch.compile 15.0 us (1.25x); ...`"""
    eager, vs_compile, _ = evaluation.speedups(baselines)
    parts = [f"ModelNew {evaluation.model_new.us:.1f} us" if evaluation.model_new else "ModelNew not timed"]
    if baselines.eager is not None:
        parts.append(f"Model eager {baselines.eager.us:.1f} us ({eager:.2f}x)" if eager else "")
    if baselines.compiled is not None:
        parts.append(f"torch.compile {baselines.compiled.us:.1f} us ({vs_compile:.2f}x)" if vs_compile else "")
    elif baselines.compile_error:
        parts.append(f"torch.compile failed ({baselines.compile_error})")
    noise = evaluation.noise(baselines)
    if noise is not None:
        parts.append(f"noise {100 * noise:.1f}%")
    return ", ".join(p for p in parts if p) + " (medians of triton.testing.do_bench)"
