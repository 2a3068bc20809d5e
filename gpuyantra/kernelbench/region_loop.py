"""A whole model optimized region by region (KernelBench level 3): partitioned, ranked by cost, a
kernel written and verified per region (costliest first, within the run's time budget), and a
ModelNew composing the kept kernels with the Model's own modules for the rest."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from gpuyantra.kernelbench.compose import ComposeError, RegionKernel, model_new_source
from gpuyantra.kernelbench.optimize import optimize
from gpuyantra.kernelbench.regions import Partition, Region, partition, rank_by_cost, signature
from gpuyantra.kernelbench.results import Attempt, ProblemResult, beats_best

# Seconds a problem's regions may take in all (verifications in Triton's interpreter on CPU take
# tens of seconds a candidate); the regions not reached by then are `not_tried`.
REGION_BUDGET_S = 3600.0


@dataclass
class RegionRun:
    """What the region loop keeps for the ModelNew it composes."""

    partition: Partition
    kernels: dict[int, RegionKernel] = field(default_factory=dict)
    family: Any = None  # a region's open-target family: its tolerances judge ModelNew

    @property
    def regions(self) -> list[Region]:
        return sorted(self.partition.regions, key=lambda r: r.index)


def plan_regions(model: torch.nn.Module, inputs: Sequence[Any]) -> Partition | None:
    """The model's partition when its forward has several regions to write kernels for, else None
    (one region: the whole forward is one open target, as for levels 1 and 2)."""
    try:
        found = partition(model, inputs)
    except Exception:  # noqa: BLE001 - a forward the partition cannot take whole: one open target, as before
        return None
    return found if len(found.regions) > 1 else None


def optimize_regions(
    found: Partition,
    problem: str,
    file: Path,
    module: ModuleType,
    folder: Path,
    device: str,
    max_iterations: int,
    log: Callable[[str], None],
    timer: Callable[[Callable[[], Any]], tuple[float, float]] | None = None,
    budget_s: float = REGION_BUDGET_S,
) -> RegionRun:
    """Rank the regions by cost and write kernels for them, costliest first. `timer` (CUDA): a
    function's (median us, relative spread), warmed; a kernel is kept only where it beats the
    region's own eager time beyond that spread."""
    started = time.perf_counter()
    run = RegionRun(found)
    us = (lambda fn: timer(fn)[0]) if timer is not None else None
    tried: dict[str, Region] = {}  # signature -> the first region of that computation tried
    for region in rank_by_cost(found.regions, device, us):
        why_not = _left_alone(region)
        if why_not:
            region.status, region.runs_as, region.reason = why_not
            continue
        same = tried.get(signature(region))
        if same is not None:  # a repeated block: the kernel (or the verdict) of its first instance
            kernel = _reuse(region, same, run.kernels.get(same.index), problem, file, module)
            if kernel is not None:
                run.kernels[region.index] = kernel
            continue
        tried[signature(region)] = region
        if time.perf_counter() - started > budget_s:
            region.reason = f"not tried: the problem's {budget_s:.0f} s for regions went to costlier ones"
            continue
        log(f"  {region.name} ({region.share:.0%} of the forward): {', '.join(region.ops)}")
        kernel = _write_region(region, problem, file, module, folder / region.name, device, max_iterations, log, timer)
        if kernel is not None:
            run.kernels[region.index] = kernel
            run.family = run.family or kernel.family
    for region in found.regions:
        region.release()
    return run


def _reuse(
    region: Region, same: Region, kernel: RegionKernel | None, problem: str, file: Path, module: ModuleType
) -> RegionKernel | None:
    """The kernel of `same`, an earlier region of the same computation, bound to this region's own
    parameters (the same kernel params, in the same order, read from this region's paths); without
    one, `same`'s verdict. ModelNew's check against Model judges every region it runs."""
    region.op, region.reward, region.candidate = same.op, same.reward, same.candidate
    if kernel is None:
        region.status = same.status
        region.reason = f"as {same.name} (the same computation): {same.reason}"
        return None
    from gpuyantra.ops.open import OpenTargetError, build_open_target

    try:
        target = build_open_target(
            region.module,
            region.inputs,
            name_hint=f"{problem}_{region.name}",
            source_file=str(file.resolve()),
            source_module=module.__name__,
        )
    except OpenTargetError as exc:
        region.status, region.reason = "unsupported", f"unsupported: {exc}"
        return None
    own = target.adapter
    leaf = [b["module_attr"].rsplit(".", 1)[-1] for b in own]
    if leaf != [b["module_attr"].rsplit(".", 1)[-1] for b in kernel.adapter]:
        region.reason = f"not tried: its parameters do not line up with {same.name}'s"
        return None
    region.status, region.runs_as = same.status, "kernel"
    region.library_calls, region.kernel_us = list(same.library_calls), same.kernel_us
    region.reason = f"{same.name}'s kernel (the same computation): {same.reason}"
    return RegionKernel(
        region=region,
        candidate=kernel.candidate,
        adapter=[
            {"kernel_param": k["kernel_param"], "module_attr": b["module_attr"]} for k, b in zip(kernel.adapter, own)
        ],
        updated_buffers=target.updated_attrs,
        buffer_steps=target.buffer_steps,
        forward_returns_tuple=target.forward_returns_tuple,
    )


def _left_alone(region: Region) -> tuple[str, str, str] | None:
    """(status, runs_as, reason) of a region no kernel is written for, or None."""
    if region.kind == "library":
        return "library", "library", "kept whole in the library (a recurrent or attention layer)"
    if region.kind == "anchor" and len(region.ops) == 1:
        return "library", "library", "a library anchor alone: nothing to fuse after it"
    if region.only_views:
        return "not_tried", "unchanged", "only views and copies: nothing to compute"
    if not region.inputs or not all(isinstance(x, torch.Tensor) for x in region.inputs):
        return "not_tried", "unchanged", "it takes numbers besides tensors"
    if not region.inputs[0].is_floating_point():
        return "not_tried", "unchanged", "its first input is not a floating tensor"
    return None


def _write_region(
    region: Region,
    problem: str,
    file: Path,
    module: ModuleType,
    folder: Path,
    device: str,
    max_iterations: int,
    log: Callable[[str], None],
    timer: Callable[[Callable[[], Any]], tuple[float, float]] | None,
) -> _Kept | None:
    """The region's open target, its optimize loop and what became of it (in `region`)."""
    from gpuyantra.ops.open import OpenTargetError, build_open_target, register_open

    try:
        target = build_open_target(
            region.module,
            region.inputs,
            name_hint=f"{problem}_{region.name}",
            source_file=str(file.resolve()),
            source_module=module.__name__,
        )
        family = register_open(target)
    except OpenTargetError as exc:
        region.status, region.reason = "unsupported", f"unsupported: {exc}"
        return None
    region.op = family.name
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("candidate_*.py"):
        stale.unlink()
    judge = _RegionJudge(region, target.adapter, timer) if timer is not None else None
    first = region.inputs[0]
    attempts, best, stop, _ = optimize(
        family,
        target.adapter,
        type(region.module),
        f"{problem}.{region.name}",
        [list(first.shape)],
        first.dtype,
        device,
        folder,
        max_iterations,
        log,
        judge=judge.won if judge is not None else None,
    )
    if not attempts:
        region.status, region.reason = "unsupported", f"unsupported: {stop}"
        return None
    if best is None:
        last = attempts[-1].failures
        why = "; ".join(f"{f['layer']}/{f['rule']}: {f['message'][:200]}" for f in last[:2])
        region.status, region.reward = "rejected", max(a.reward for a in attempts)
        region.reason = f"rejected: no candidate passed verification in {len(attempts)}; stopped: {stop}" + (
            f" ({why})" if why else ""
        )
        return None
    kept = best
    if judge is not None:
        if judge.winner is None:
            region.status, region.reward = "not_faster", best.reward
            region.candidate, region.kernel_us = best.candidate, judge.best_us
            region.reason = f"verified, not faster than the region's eager time: {judge.summary()}"
            return None
        kept = judge.winner
    region.status, region.runs_as = "verified", "kernel"
    region.candidate, region.reward, region.library_calls = kept.candidate, kept.reward, list(kept.library_calls)
    region.kernel_us = judge.best_us if judge is not None else None
    region.reason = f"{Path(kept.candidate).name}, reward {kept.reward:+d}" + (
        f"; {judge.summary()}" if judge is not None else ""
    )
    return _Kept(
        region=region,
        candidate=Path(kept.candidate),
        adapter=target.adapter,
        updated_buffers=target.updated_attrs,
        buffer_steps=target.buffer_steps,
        forward_returns_tuple=target.forward_returns_tuple,
        family=family,
    )


@dataclass
class _Kept(RegionKernel):
    family: Any = None


class _RegionJudge:
    """CUDA: a verified region kernel is kept only when it beats the region's own eager time (both
    timed on the region's live inputs) by more than the timings' spread."""

    def __init__(
        self,
        region: Region,
        adapter: list[dict[str, str]],
        timer: Callable[[Callable[[], Any]], tuple[float, float]],
    ) -> None:
        self.region, self.adapter, self.timer = region, adapter, timer
        self.eager: tuple[float, float] | None = None
        self.winner: Attempt | None = None
        self.best_us: float | None = None
        self.spread = 0.0

    def won(self, attempt: Attempt) -> bool:
        from gpuyantra.candidate import import_file
        from gpuyantra.ops.base import adapter_kwargs

        region, inputs = self.region, self.region.inputs
        if self.eager is None:
            self.eager = self.timer(lambda: region.module(*inputs))
        digest = hashlib.sha256(Path(attempt.candidate).read_bytes()).hexdigest()[:16]
        kernel = import_file(Path(attempt.candidate), f"gpuyantra_kernelbench_kernel_{digest}")
        params = adapter_kwargs(region.module, self.adapter)
        us, spread = self.timer(lambda: kernel.entry(*inputs, **params))
        if self.best_us is None or us < self.best_us:
            self.best_us, self.spread = us, spread
        if beats_best(self.eager[0] / us, max(spread, self.eager[1])):
            self.winner = attempt
            return True
        return False

    def summary(self) -> str:
        if self.eager is None or self.best_us is None:
            return "not timed"
        return (
            f"kernel {self.best_us:.1f} us, region eager {self.eager[0]:.1f} us "
            f"({self.eager[0] / self.best_us:.2f}x), noise {100 * max(self.spread, self.eager[1]):.1f}%"
        )


def write_model_new(run: RegionRun, file: Path, folder: Path) -> Path:
    """OUT/<problem>/ModelNew.py composing the kept region kernels. Raises ComposeError."""
    path = folder / "ModelNew.py"
    path.write_text(model_new_source(file.read_text(), file, run.partition, run.kernels, folder))
    return path


def describe(run: RegionRun) -> str:
    """`3 of 7 regions run verified kernels (81% of the forward's estimated cost: region_2, ...)`;
    the library calls they make follow in the reason (`_Judging.report`)."""
    kept = [r for r in run.regions if r.runs_as == "kernel"]
    share = sum(r.share for r in kept)
    basis = "measured" if any(r.cost_basis == "measured" for r in run.regions) else "estimated"
    return (
        f"{len(kept)} of {len(run.regions)} regions run verified kernels ({share:.0%} of the forward's {basis} "
        f"cost: {', '.join(r.name for r in kept) or 'none'})"
    )


def region_lines(regions: Sequence[dict[str, Any]]) -> list[str]:
    """The human summary's lines for a problem's regions (`Region.to_dict`), in the forward's order:
    `region_2  31.0%  verified   kernel    Conv2d features.3, BatchNorm2d features.4, relu: ...`."""
    return [
        f"    {r['name']:<10} {r['share']:6.1%}  {r['status']:<11} {r['runs_as']:<9} "
        + ", ".join(r["ops"])[:100]
        + (f": {r['reason'][:160]}" if r["reason"] else "")
        for r in regions
    ]


def record(result: ProblemResult, run: RegionRun) -> None:
    result.regions = [r.to_dict() for r in run.regions]
    result.library_calls = sorted({c for r in run.regions if r.runs_as == "kernel" for c in r.library_calls})
    rewards = [r.reward for r in run.regions if r.runs_as == "kernel" and r.reward is not None]
    result.reward = (
        min(rewards) if rewards else max((r.reward for r in run.regions if r.reward is not None), default=None)
    )


def no_kernel_reason(run: RegionRun) -> tuple[str, str]:
    """(status, reason) when no region kept a kernel: rejected when some region's candidates were
    verified and refused, else unsupported; the reason names each region's outcome."""
    statuses = {r.status for r in run.regions}
    status = "rejected" if statuses & {"rejected", "not_faster"} else "unsupported"
    outcomes = "; ".join(f"{r.name}: {r.reason}" for r in run.regions if r.reason)
    return status, f"no region kept a kernel ({len(run.regions)} regions): {outcomes}"


__all__ = [
    "REGION_BUDGET_S",
    "ComposeError",
    "RegionRun",
    "describe",
    "no_kernel_reason",
    "optimize_regions",
    "plan_regions",
    "record",
    "region_lines",
    "write_model_new",
]
