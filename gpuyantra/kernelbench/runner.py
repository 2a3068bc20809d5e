# Over 600 lines: one problem read top to bottom, file to result, for a single target and for a model in regions.
"""One problem from file to result (load, size, bind, optimize, ModelNew, timing) and a whole run
over PATH, whose summary with fast_0/fast_1/fast_2 is written to OUT/kernelbench.json."""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from gpuyantra.kernelbench.bind import bind_family, bind_open_target, probe_inputs
from gpuyantra.kernelbench.judge import Baselines, Evaluation, free_device_memory, summary, time_baselines, time_cuda
from gpuyantra.kernelbench.model_new import _forward_params, check_model_new, model_new_source
from gpuyantra.kernelbench.optimize import DEFAULT_MAX_ITERATIONS, optimize
from gpuyantra.kernelbench.problems import (
    SEED,
    KernelBenchError,
    build_model,
    check_problem_module,
    find_problems,
    input_elements,
    load_module,
    make_inputs,
    output_elements,
    parameter_elements,
    safe_name,
)
from gpuyantra.kernelbench.region_loop import (
    ComposeError,
    RegionRun,
    describe,
    no_kernel_reason,
    optimize_regions,
    plan_regions,
    record,
    write_model_new,
)
from gpuyantra.kernelbench.regions import Partition
from gpuyantra.kernelbench.results import Attempt, ProblemResult, RunResult, fast_p, geomean_speedups
from gpuyantra.kernelbench.sizes import (
    CPU_MAX_ELEMENTS,
    REDUCED_ELEMENTS,
    Shapes,
    plan_reduced_model,
    plan_reduced_sizes,
)


@contextlib.contextmanager
def on_gpu(device: str, timing: bool) -> Iterator[None]:
    """This process's GPU work under the verifier's GPU locks, as its sandbox children's: Model
    against ModelNew timed alone on the GPU (`time_alone`), other GPU work (running the Model,
    checking ModelNew) shared but never during anyone's timing (`share_gpu`). Without them a run's
    shards timed Model and ModelNew while other shards ran float64 references: Model's own time
    moved by 2x between runs. Only on CUDA; never around a verification (its child takes the
    locks itself)."""
    if device != "cuda":
        yield
        return
    from gpuyantra.verifier import baselines
    from gpuyantra.verifier.gpu_locks import share_gpu, time_alone

    with time_alone(baselines.timing_lock()) if timing else share_gpu(baselines.timing_lock()):
        yield


def shared_or_alone_on_oom(device: str, work: Callable[[], Any]) -> Any:
    """`work` with the GPU shared; where it runs out of memory beside other processes' work, once
    more with the GPU alone (the others' shared phases done and their cached memory freed where
    they finish a problem). A float64 check of a problem of several GB needs tens of GB at once."""
    try:
        with on_gpu(device, timing=False):
            return work()
    except torch.cuda.OutOfMemoryError:
        gc.collect()
        torch.cuda.empty_cache()
    with on_gpu(device, timing=True):
        return work()


def run_problem(
    name: str,
    file: Path,
    device: str,
    out: Path,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    max_elements: int | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> ProblemResult:
    started = time.perf_counter()
    result = ProblemResult(name=name, path=str(file))
    try:
        # Problem code may print: keep stdout for the report.
        with contextlib.redirect_stdout(sys.stderr):
            _run_problem(result, file, device, out, max_iterations, max_elements, log)
    except Exception as exc:  # noqa: BLE001 - one broken problem must not stop the run
        result.status, result.correct = "error", False
        result.reason = f"{type(exc).__name__}: {exc}"
        log("".join(traceback.format_exception(exc)).rstrip())
    finally:
        if device == "cuda":  # the next problem (or a shard beside this one) gets the memory back
            gc.collect()
            torch.cuda.empty_cache()
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def _run_problem(
    result: ProblemResult,
    file: Path,
    device: str,
    out: Path,
    max_iterations: int,
    max_elements: int | None,
    log: Callable[[str], None],
) -> None:
    # 1. load
    try:
        module = load_module(file)
    except SyntaxError as exc:
        result.reason = f"cannot load the problem: SyntaxError: {exc.msg} (line {exc.lineno})"
        return
    except BaseException as exc:  # noqa: BLE001 - SystemExit and friends from problem code included
        if isinstance(exc, KeyboardInterrupt):
            raise
        result.reason = f"cannot load the problem: {type(exc).__name__}: {exc}"
        return
    why_not = check_problem_module(module)
    if why_not:
        result.reason = why_not
        return
    sized = _sized_model(result, module, device, max_elements, log)
    if sized is None:
        return
    model, sizes, init = sized
    try:
        with result.phase("inputs"):
            inputs = make_inputs(module, device, SEED, sizes)
    except Exception as exc:  # noqa: BLE001
        result.reason = f"cannot build the problem's inputs: {type(exc).__name__}: {exc}"
        return
    if max_elements is not None:
        total = sum(t.numel() for t in inputs if isinstance(t, torch.Tensor))
        total += sum(p.numel() for p in model.parameters())
        if total > max_elements:
            result.status = "skipped"
            result.reason = (
                f"skipped for size: inputs and parameters hold {total:,} elements, over the "
                f"{max_elements:,} cap on {device}; run on --device cuda or raise --max-elements"
            )
            return
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    result.shapes = [list(t.shape) for t in tensors]
    result.dtype = str(tensors[0].dtype).replace("torch.", "") if tensors else None
    try:
        with torch.no_grad(), on_gpu(device, timing=False):
            model(*inputs)
    except Exception as exc:  # noqa: BLE001
        if result.reduced:  # a size the meta device let through and the real op refuses
            result.status = "skipped"
            result.reason = (
                f"skipped for size: over the {max_elements:,} cap on {device}, and the Model refuses its "
                f"reduced inputs ({result.reduced}): {type(exc).__name__}: {exc}; run on --device cuda"
            )
            return
        result.reason = f"the problem's Model does not run on its inputs: {type(exc).__name__}: {exc}"
        return

    # 2. bind by computation: a registered family first, else an open target (the Model itself)
    with result.phase("bind"):  # small probe inputs; tracing is host work: no GPU lock held through it
        probe = probe_inputs(model, inputs)  # binding needs values, not the problem's full size
        bound = bind_family(model, probe)
        # A whole model (level 3): its forward in regions, a kernel per region; else one open target.
        found = plan_regions(model, inputs) if bound is None else None
        if bound is None and found is None:
            bound = bind_open_target(model, inputs, file, module, result)
    if found is not None:
        del probe, model
        _run_regions(result, found, module, file, out, device, sizes, init, len(inputs), max_iterations, log)
        return
    if bound is None:
        return
    family, adapter = bound
    result.op, result.adapter = family.name, adapter
    log(f"  {result.name}: computes {family.name} (ADAPTER {adapter})")

    # 3. optimize
    folder = out / safe_name(result.name)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in [*folder.glob("candidate_*.py"), folder / "ModelNew.py"]:
        stale.unlink(missing_ok=True)  # files of an earlier run of this problem
    shapes, dtype, n_inputs = [list(tensors[0].shape)], tensors[0].dtype, len(inputs)
    # The verifier's sandbox draws its own inputs, and each ModelNew check builds its own Model: give
    # the device memory back before they run (KernelBench inputs reach several GB each).
    del inputs, probe, model
    free_device_memory(device)
    judging = _Judging(result, module, family, adapter, file, folder, device, sizes, init, n_inputs)
    try:
        with result.phase("optimize"):
            attempts, best, stop, verified_against = optimize(
                family,
                adapter,
                module.Model,
                f"{module.__name__}.Model",
                shapes,
                dtype,
                device,
                folder,
                max_iterations,
                log,
                judge=judging.won if device == "cuda" else None,
            )
    except ImportError as exc:
        result.reason = f"the verifier is not available: {exc}"
        return
    result.attempts, result.verified_against = attempts, verified_against
    if not attempts:
        result.status, result.reason = "unsupported", f"unsupported: {stop}"
        return
    if best is None:
        result.status = "rejected"
        result.reward = max((a.reward for a in attempts), default=None)
        last = attempts[-1].failures if attempts else []
        why = "; ".join(f"{f['layer']}/{f['rule']}: {f['message']}" for f in last[:2])
        result.reason = f"no candidate passed verification in {len(attempts)} iteration(s); stopped: {stop}" + (
            f" ({why})" if why else ""
        )
        return
    # 4. ModelNew.py of the chosen candidate (on CUDA the fastest judged; on CPU the verifier's best)
    chosen = judging.chosen() or judging.evaluate(best)
    judging.write_model_new(chosen.attempt)
    judging.report(chosen)


class _Judging:
    """Steps 4 and 5 for one problem: each accepted candidate's ModelNew checked against Model and
    (CUDA) timed against Model eager and torch.compile, the best of them reported."""

    def __init__(
        self,
        result: ProblemResult,
        module: ModuleType,
        family: Any,
        adapter: list[dict[str, str]],
        file: Path,
        folder: Path,
        device: str,
        sizes: Shapes | None,
        init: list[Any] | None,
        n_inputs: int,
    ) -> None:
        self.result, self.module, self.family, self.adapter = result, module, family, adapter
        self.file, self.folder, self.device, self.sizes, self.init = file, folder, device, sizes, init
        self.n_inputs = n_inputs
        self.baselines = Baselines()
        self.evaluations: list[Evaluation] = []

    def won(self, attempt: Attempt) -> bool:
        return self.evaluate(attempt).won(self.baselines)

    def chosen(self) -> Evaluation | None:
        return max(self.evaluations, key=lambda e: e.rank(self.baselines), default=None)

    def write_model_new(self, attempt: Attempt) -> Path:
        path = self.folder / "ModelNew.py"
        path.write_text(
            model_new_source(
                self.file.read_text(),
                self.file,
                Path(attempt.candidate),
                self.family.name,
                self.adapter,
                _forward_params(self.module.Model, self.n_inputs),
                attempt.reward,
                **_open_target_call(self.family),
            )
        )
        self.result.model_new = str(path)
        return path

    def evaluate(self, attempt: Attempt) -> Evaluation:
        """The candidate's ModelNew checked against Model and, where correct on CUDA, timed."""
        path = self.write_model_new(attempt)
        device = self.device
        try:
            with self.result.phase("check_model_new"):
                correct, why, worst, (model, model_new) = shared_or_alone_on_oom(
                    device,
                    lambda: check_model_new(self.module, path, self.family, device, sizes=self.sizes, init=self.init),
                )
        except Exception as exc:  # noqa: BLE001 - a ModelNew that does not import or run is not correct
            evaluation = Evaluation(attempt, False, f"ModelNew.py failed against Model: {type(exc).__name__}: {exc}")
        else:
            evaluation = Evaluation(attempt, correct, why, worst)
            try:
                if correct and device == "cuda":
                    with self.result.phase("time_model_new"):
                        self._time(evaluation, model, model_new)
            finally:
                del model, model_new
        free_device_memory(device)
        self.evaluations.append(evaluation)
        return evaluation

    def _time(self, evaluation: Evaluation, model: torch.nn.Module, model_new: torch.nn.Module) -> None:
        device = self.device
        try:
            with on_gpu(device, timing=False):
                timing_inputs = make_inputs(self.module, device, SEED)
            if self.baselines.eager is None:
                self.baselines = time_baselines(
                    model, timing_inputs, lambda: on_gpu(device, timing=False), lambda: on_gpu(device, timing=True)
                )
            with on_gpu(device, timing=True):
                evaluation.model_new = time_cuda(lambda: model_new(*timing_inputs))
        except Exception as exc:  # noqa: BLE001 - correct, but the timing itself failed: say so
            evaluation.timing_error = f"{type(exc).__name__}: {exc}"[:300]

    def describe(self, attempt: Attempt) -> str:
        return f"candidate_{attempt.iteration}.py, reward {attempt.reward:+d}"

    def report(self, chosen: Evaluation) -> None:
        result, attempt, baselines = self.result, chosen.attempt, self.baselines
        result.reward, result.library_calls = attempt.reward, list(attempt.library_calls)
        result.correct, result.max_abs_err = chosen.correct, chosen.max_abs_err
        if not chosen.correct:
            result.status, result.reason = "incorrect", chosen.why
            return
        result.reason = f"{self.describe(attempt)}; {chosen.why}"
        if attempt.library_calls:
            result.reason += f"; library calls: {', '.join(attempt.library_calls)} (the rest is Triton)"
        if result.reduced:
            result.reason += f"; verified on reduced sizes of the problem ({result.reduced})"
        if self.device != "cuda":
            result.status = "optimized"
            result.reason += "; speed not measured on CPU"
            return
        if chosen.timing_error or chosen.model_new is None:
            result.status = "not_faster"  # never a win without figures
            result.reason += f"; correct, not faster: timing failed: {chosen.timing_error}"
            return
        result.speedup, result.speedup_vs_compile, result.speedup_vs_best = chosen.speedups(baselines)
        result.model_us = baselines.eager.us if baselines.eager else None
        result.compile_us = baselines.compiled.us if baselines.compiled else None
        result.model_new_us, result.noise = chosen.model_new.us, chosen.noise(baselines)
        won = chosen.won(baselines)
        result.status = "optimized" if won else "not_faster"
        verdict = "faster than the better of eager and torch.compile" if won else "correct, not faster"
        result.reason += f"; {verdict}: {summary(chosen, baselines)}"


def _run_regions(
    result: ProblemResult,
    found: Partition,
    module: ModuleType,
    file: Path,
    out: Path,
    device: str,
    sizes: Shapes | None,
    init: list[Any] | None,
    n_inputs: int,
    max_iterations: int,
    log: Callable[[str], None],
) -> None:
    """Steps 3 to 5 for a partitioned model: a kernel per region (costliest first), then ModelNew
    composing the kept ones, checked and timed as any ModelNew."""
    result.op, result.adapter = "regions", []
    log(
        f"  {result.name}: {len(found.regions)} regions"
        + ("" if found.traced else f" (module tree: {found.why_untraced})")
    )
    folder = out / safe_name(result.name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ModelNew.py").unlink(missing_ok=True)

    def timer(fn: Callable[[], Any]) -> tuple[float, float]:
        with on_gpu(device, timing=True):
            timing = time_cuda(fn)
        return timing.us, timing.spread

    try:
        with result.phase("optimize"):
            run = optimize_regions(
                found,
                result.name,
                file,
                module,
                folder,
                device,
                max_iterations,
                log,
                timer if device == "cuda" else None,
            )
    except ImportError as exc:
        result.reason = f"the verifier is not available: {exc}"
        return
    record(result, run)
    if not run.kernels:
        result.status, result.reason = no_kernel_reason(run)
        return
    judging = _RegionJudging(result, module, run.family, [], file, folder, device, sizes, init, n_inputs, run)
    attempt = Attempt(
        iteration=0,
        candidate=str(folder / "ModelNew.py"),
        strategy={},
        reward=result.reward if result.reward is not None else 1,
        accepted=True,
        library_calls=list(result.library_calls),
    )
    try:
        chosen = judging.evaluate(attempt)
    except ComposeError as exc:
        result.status, result.reason = "error", f"cannot write ModelNew from the regions: {exc}"
        return
    judging.report(chosen)
    result.regions = [r.to_dict() for r in run.regions]


class _RegionJudging(_Judging):
    """ModelNew composed from the regions' kept kernels, judged as any ModelNew."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.run: RegionRun = args[-1]
        super().__init__(*args[:-1], **kwargs)

    def write_model_new(self, attempt: Attempt) -> Path:
        path = write_model_new(self.run, self.file, self.folder)
        self.result.model_new = str(path)
        return path

    def describe(self, attempt: Attempt) -> str:
        return describe(self.run)


def _sized_model(
    result: ProblemResult,
    module: ModuleType,
    device: str,
    max_elements: int | None,
    log: Callable[[str], None],
) -> tuple[torch.nn.Module, Shapes | None, list[Any] | None] | None:
    """(model, {live input shape: reduced shape} or None, reduced init inputs or None) for the
    problem under the size cap; None, with the reason in `result`, when it is skipped or its Model
    does not build. Over the cap on CPU the problem runs at reduced sizes of itself: its inputs, and
    its Model's dimensions too when its parameters are over the cap (never on CUDA)."""
    sizes: Shapes | None = None
    init: list[Any] | None = None
    elements: int | None = None
    params: int | None = None
    if max_elements is not None:
        elements, params = input_elements(module), parameter_elements(module)
        if elements is not None:
            elements += output_elements(module) or 0  # the interpreter writes the outputs too
        if params is not None and params > max_elements:
            reduction, why = plan_reduced_model(module, max_elements) if device == "cpu" else (None, "")
            if reduction is None:
                result.status = "skipped"
                result.reason = (
                    f"skipped for size: the Model's parameters hold {params:,} elements, over the "
                    f"{max_elements:,} cap on {device} (kernels run in Triton's interpreter there)"
                    + (f", and they cannot be reduced: {why}" if why else "")
                    + "; run on --device cuda or raise --max-elements"
                )
                return None
            sizes, init, result.reduced = reduction.sizes, reduction.init, reduction.how
            log(f"  {result.name}: Model and inputs reduced for the {device} interpreter: {reduction.how}")
    try:
        model = build_model(module, module.Model, device, init=init)
    except Exception as exc:  # noqa: BLE001
        result.reason = f"cannot build the problem's Model: {type(exc).__name__}: {exc}"
        return None
    if init is None and max_elements is not None and elements is not None and elements + (params or 0) > max_elements:
        # Too large for the interpreter: the same problem at reduced sizes, drawn by its own get_inputs().
        sizes, how = plan_reduced_sizes(module, model, REDUCED_ELEMENTS)
        if sizes is None and device == "cpu":
            # The fixed dims may be the Model's own sizes (its in_features): reduce the Model with them.
            reduction, _ = plan_reduced_model(module, max_elements)
            if reduction is not None:
                try:
                    model = build_model(module, module.Model, device, init=reduction.init)
                except Exception:  # noqa: BLE001 - the live model and the first reason stand
                    reduction = None
            if reduction is not None:
                sizes, init, how = reduction.sizes, reduction.init, reduction.how
        if sizes is None:
            result.status = "skipped"
            result.reason = (
                f"skipped for size: inputs and outputs hold {elements:,} elements, over the {max_elements:,} cap on "
                f"{device}, and they cannot be reduced: {how}; run on --device cuda or raise --max-elements"
            )
            return None
        result.reduced = how
        log(f"  {result.name}: {'Model and inputs' if init else 'inputs'} reduced for the {device} interpreter: {how}")
    return model, sizes, init


def default_out() -> Path:
    """Where a run writes when no folder is given: `kernelbench/` in the state folder, not the working directory."""
    from gpuyantra.config import state_dir

    return state_dir() / "kernelbench"


@contextlib.contextmanager
def gpu_memory(device: str, alone: bool = False) -> Iterator[None]:
    """A problem's hold on the GPU's memory beside other processes' problems (`problem_memory`):
    shared, or `alone` after they finish. Only on CUDA."""
    if device != "cuda":
        yield
        return
    from gpuyantra.verifier import baselines
    from gpuyantra.verifier.gpu_locks import problem_memory

    with problem_memory(baselines.timing_lock(), alone=alone):
        yield


def ran_out_of_memory(result: ProblemResult) -> bool:
    """Whether the problem failed for GPU memory (anywhere: inputs, Model, verification, check)."""
    return not result.correct and "out of memory" in (result.reason or "").lower()


def problems_in_order(paths: Sequence[str | Path]) -> list[tuple[str, Path]]:
    """The problems of every path, in the order the paths are given; a problem named twice runs once."""
    problems: dict[str, Path] = {}
    for path in paths:
        for name, file in find_problems(path):
            problems.setdefault(name, file)
    if not problems:
        raise KernelBenchError("no problem path was given")
    return list(problems.items())


def run(
    path: str | Path | Sequence[str | Path],
    device: str = "cpu",
    out: str | Path | None = None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    max_elements: int | None = -1,
    log: Callable[[str], None] = lambda _: None,
    on_result: Callable[[ProblemResult], None] = lambda _: None,
) -> RunResult:
    """Every problem under PATH (or under each of several, in the order given). `max_elements=-1`
    means the device default (CPU_MAX_ELEMENTS on CPU, no cap on CUDA); None means no cap.
    `out=None`: the state folder's `kernelbench/`. Raises KernelBenchError when PATH holds no problems."""
    problems = problems_in_order([path] if isinstance(path, (str, Path)) else path)
    if max_elements == -1:
        max_elements = CPU_MAX_ELEMENTS if device == "cpu" else None
    out = Path(out).resolve() if out is not None else default_out()
    out.mkdir(parents=True, exist_ok=True)
    results: list[ProblemResult] = []
    try:
        for name, file in problems:
            log(f"[{len(results) + 1}/{len(problems)}] {name}")
            with gpu_memory(device):
                result = run_problem(name, file, device, out, max_iterations, max_elements, log)
            if device == "cuda" and ran_out_of_memory(result):
                # Shards beside this one held the memory at their peaks (measured: five shards, a
                # float64 check and a verification each, 139 GB full): once more, with the GPU's
                # memory to itself (the others' problems finish first, new ones wait).
                log(f"  {name}: out of GPU memory beside other work; once more with the GPU's memory alone")
                with gpu_memory(device, alone=True):
                    result = run_problem(name, file, device, out, max_iterations, max_elements, log)
            results.append(result)
            on_result(result)
            _summary(results, device, out)  # after every problem: an interrupted run keeps what it did
    finally:
        from gpuyantra.verifier.sandbox import close_spares

        close_spares()  # the warm child kept for a next verification (CUDA) has none
    return _summary(results, device, out)


def _summary(results: list[ProblemResult], device: str, out: Path) -> RunResult:
    """The run so far, also written to OUT/kernelbench.json."""
    note = (
        "fast_p: share of all problems whose ModelNew is correct and more than p times faster than Model "
        "(fast_1_vs_compile: than torch.compile(Model); fast_1_vs_best: than the better of both); "
        "geomean: geometric-mean speedups over the correct problems timed"
    )
    if device != "cuda":
        note += "; speed is not measured on CPU (Triton's interpreter), so fast_1 and fast_2 are null"
    run_result = RunResult(
        device=device,
        out=str(out),
        problems=list(results),
        fast_0=fast_p(results, 0, device),
        fast_1=fast_p(results, 1, device),
        fast_2=fast_p(results, 2, device),
        note=note,
        fast_1_vs_compile=fast_p(results, 1, device, against="compile"),
        fast_1_vs_best=fast_p(results, 1, device, against="best"),
        geomean=geomean_speedups(results) if device == "cuda" else {},
    )
    (out / "kernelbench.json").write_text(json.dumps(run_result.to_dict(), indent=2, default=str) + "\n")
    return run_result


def _open_target_call(family: Any) -> dict[str, Any]:
    """model_new_source's arguments for an open target's forward: the numbers it takes as
    arguments, the buffers it updates (none for a registered family)."""
    target = getattr(family, "open_target", None)
    out: dict[str, Any] = {}
    if target is None:
        return out
    if target.arguments:
        out["arguments"] = [(p.argument, p.kernel_param) for p in target.arguments]
    if target.updates_state:
        out.update(
            updated_buffers=target.updated_attrs,
            buffer_steps=target.buffer_steps,
            forward_returns_tuple=target.forward_returns_tuple,
        )
    return out
