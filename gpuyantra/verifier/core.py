"""`verify(path, ...)`: the whole trust anchor on one candidate file, in order.

static (AST) -> contract (meta instance) -> sandbox (separate limited process) -> correctness
(judged here against float64) -> benchmark (CUDA only) -> reward (here, from our own numbers).
The candidate's source is read once; the sandbox runs a read-only copy of exactly that text.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gpuyantra.verifier.baselines as baselines
import gpuyantra.verifier.cases as case_plan
import gpuyantra.verifier.precompile_beside as precompile_beside
from gpuyantra import attestation
from gpuyantra.candidate import CandidateError, read_op, read_source, source_digest
from gpuyantra.config import state_dir
from gpuyantra.ops.open import stage_open_target
from gpuyantra.verifier import compiler_cache
from gpuyantra.verifier.contract import check_contract, resolve_family
from gpuyantra.verifier.judge import Judgement, OutputValues, References, judge, sandbox_failures
from gpuyantra.verifier.sandbox import Sandbox, SandboxOutcome, keep_spare, protect_parent, take_sandbox, take_spare
from gpuyantra.verifier.static import check_source
from gpuyantra.verifier.transport import TRANSPORTS
from gpuyantra.verifier.verdict import Failure, Verdict, compute_reward

DEVICES = ("cpu", "cuda")


def verify(
    path: str | Path,
    device: str = "cpu",
    module_class: str | None = None,
    shapes: list[list[int]] | None = None,
    dtypes: list[str] | None = None,
    param_shapes: Mapping[str, Sequence[int] | None] | None = None,
    layouts: Sequence[Mapping[str, Any]] | None = None,
) -> Verdict:
    """Verify one candidate file. Never raises for a bad candidate: a rejected Verdict says why.

    `param_shapes` are the live module's tensor shapes (`{"weight": [2048, 1536], "bias": None}`):
    cases and timings then use them (a linear's out-features) instead of the contract's defaults.
    `layouts` are the served activations' strided layouts (the profile target's `layouts`): cases
    draw them exactly (plan class `live_layout`)."""
    return run_verification(
        path,
        device=device,
        module_class=module_class,
        shapes=shapes,
        dtypes=dtypes,
        param_shapes=param_shapes,
        layouts=layouts,
    )


def run_verification(
    path: str | Path,
    device: str = "cpu",
    module_class: str | None = None,
    shapes: Sequence[Sequence[int]] | None = None,
    dtypes: Sequence[str] | None = None,
    *,
    timeout: float | None = None,
    memory_limit: int | None = None,
    cpu_seconds: int | None = None,
    seeds: Sequence[int] | None = None,
    benchmark: bool = True,
    skip_static: bool = False,
    family_modules: Sequence[str] = (),
    keep_warm: bool = False,
    param_shapes: Mapping[str, Sequence[int] | None] | None = None,
    layouts: Sequence[Mapping[str, Any]] | None = None,
) -> Verdict:
    """`verify` with knobs for tests and workers.

    `keep_warm` (long-lived workers): as soon as this verification has taken its sandbox, start a
    spare child for the next one with the same limits, so it finds torch, triton and its CUDA
    context loaded (started only afterwards, back-to-back verifications waited for its imports).

    `skip_static` exists only so the test suite can show the sandbox and runtime layers stop what the
    static layer already stops; `family_modules` imports extra op-family modules (parent and child).
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {device!r}")
    dtypes = list(dtypes) if dtypes else list(case_plan.DEFAULT_DTYPES[device])
    for name in dtypes:
        case_plan.dtype_of(name)  # ValueError on a bad name: a usage error, not a candidate's fault
    live = [list(map(int, s)) for s in shapes] if shapes else []
    if any(len(s) < 1 or any(d < 1 for d in s) for s in live):
        raise ValueError(f"shapes must be lists of positive sizes, got {live}")
    live_params = {k: None if v is None else [int(d) for d in v] for k, v in (param_shapes or {}).items()}
    if any(v is not None and (not v or min(v) < 1) for v in live_params.values()):
        raise ValueError(f"param_shapes must map names to positive sizes or None, got {live_params}")
    live_layouts = case_plan.check_live_layouts(layouts if layouts is not None else [])  # ValueError naming the field
    started, started_cpu = time.monotonic(), time.thread_time()
    verdict = Verdict(op=None, accepted=False, reward=-1, device=device, dtypes=dtypes)
    try:
        _run(
            verdict,
            Path(path),
            device,
            module_class,
            live,
            dtypes,
            (timeout, memory_limit, cpu_seconds),
            tuple(seeds) if seeds else case_plan.SEEDS,
            benchmark,
            skip_static,
            tuple(family_modules),
            live_params,
            keep_warm,
            live_layouts,
        )
    except Exception as exc:  # noqa: BLE001 - a verifier bug must reject, never crash the caller
        verdict.failures.append(Failure("sandbox", "internal-error", f"verifier error: {type(exc).__name__}: {exc}"))
    if keep_warm:  # a no-op when the sandbox layer already started it
        keep_spare(device, timeout=timeout, memory_limit=memory_limit, cpu_seconds=cpu_seconds)
    verdict.seconds = round(time.monotonic() - started, 3)
    # What this verification's own thread cost the process's interpreter (a worker's verifications
    # and its Temporal event loop share one): with `load_outputs_cpu` and `judge_outputs_cpu`, the
    # reading thread's, all it cost here.
    verdict.timings["parent_cpu"] = round(time.thread_time() - started_cpu, 3)
    verdict.reward = compute_reward(verdict.failures, device, verdict.speedup_vs_eager, verdict.speedup_vs_compile)
    verdict.accepted = verdict.reward >= 1
    if verdict.accepted and verdict.source_sha256 and verdict.op:
        verdict.attestation = attestation.record(verdict.source_sha256, verdict.op, verdict.reward, device)
    return verdict


def _warm_judge_kernel(dtypes: Sequence[str]) -> None:
    """Load the judge kernel's variants while the sandbox child starts (`judge_kernel.warm`): a new
    process's first judging paid for them while the child waited on it. Its launches are GPU work
    outside any child's hold, so they share the GPU through the locks (never while anything is
    timed); the judging never waits for those locks, only for a launch in progress."""

    def warm() -> None:
        import torch

        from gpuyantra.verifier.gpu_locks import share_gpu
        from gpuyantra.verifier.judge_kernel import warm

        # A head start only: judging loads whatever is missing.
        with contextlib.suppress(Exception), share_gpu(baselines.timing_lock()):
            warm([case_plan.dtype_of(name) for name in dtypes], torch.device("cuda", torch.cuda.current_device()))

    threading.Thread(target=warm, name="judge-kernel-warm", daemon=True).start()


def _run(
    verdict: Verdict,
    path: Path,
    device: str,
    module_class: str | None,
    live: list[list[int]],
    dtypes: list[str],
    limits: tuple[float | None, int | None, int | None],
    seeds: tuple[int, ...],
    benchmark: bool,
    skip_static: bool,
    family_modules: tuple[str, ...],
    live_params: dict[str, list[int] | None] | None = None,
    keep_warm: bool = False,
    live_layouts: Sequence[Mapping[str, Any]] = (),
) -> None:
    for name in family_modules:
        importlib.import_module(name)
    # Layer 1: static, on the one copy of the source everything downstream uses.
    try:
        source = read_source(path)
    except CandidateError as exc:
        verdict.failures.append(Failure("static", "unreadable", str(exc)))
        return
    verdict.source_sha256 = attestation.source_sha256(source)
    op = read_op(source)
    verdict.op = op
    family, _ = resolve_family(op)
    clock = time.monotonic()
    report = check_source(source, str(path), family)
    verdict.timings["static"] = round(time.monotonic() - clock, 3)
    if report.op:
        verdict.op = report.op
    verdict.library_calls = list(report.library_calls)
    static_failures = [f for f in report.failures if not skip_static or f.rule == "syntax-error"]
    verdict.failures.extend(static_failures)
    if not report.parsed:
        return
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            verdict.failures.append(
                Failure("sandbox", "device-unavailable", "--device cuda, but CUDA is not available on this machine")
            )
            return
    timeout, memory_limit, cpu_seconds = limits
    sandbox = take_sandbox(device, timeout=timeout, memory_limit=memory_limit, cpu_seconds=cpu_seconds)
    beside: precompile_beside.Beside | None = None
    try:
        if not verdict.failures:
            sandbox.start()  # imports torch and triton while the contract layer runs here
            if device == "cuda":
                _warm_judge_kernel(dtypes)
        if keep_warm:  # the next verification's child starts while this one runs
            keep_spare(device, timeout=timeout, memory_limit=memory_limit, cpu_seconds=cpu_seconds)
        # Layer 2: contract.
        clock = time.monotonic()
        contract = check_contract(report, module_class)
        verdict.timings["contract"] = round(time.monotonic() - clock, 3)
        verdict.module_class = contract.module_class
        verdict.failures.extend(contract.failures)
        if verdict.failures:
            return
        family = contract.family
        assert family is not None  # a contract without a family has failures, returned above
        # The live module's parameter shapes (a linear's out-features) replace the contract's defaults.
        contract.param_specs = case_plan.live_param_specs(contract.param_specs, live_params, live)
        shapes = case_plan.correctness_shapes(device, live, family)
        run_bench = benchmark and device == "cuda"
        extras = (
            case_plan.class_cases(device, family, shapes, dtypes, contract.param_specs, live_params, live_layouts)
            if case_plan.classes_enabled()
            else []
        )
        plan = case_plan.plan(
            device,
            shapes,
            dtypes,
            seeds,
            recheck=run_bench,
            stress=case_plan.stress_shapes(device, family),
            extras=extras,
        )
        verdict.shapes = shapes
        verdict.plan_classes = case_plan.plan_classes(device, plan, family)
        staged = sandbox.stage_file(f"candidate_{source_digest(source)}.py", source)
        open_target = family.open_target
        default_bench = (
            [list(open_target.inputs[0].shape)] if open_target is not None else case_plan.DEFAULT_BENCH_SHAPES
        )
        job_bench_shapes = live or default_bench
        device_name = _device_name(device)
        params = baselines.params_digest(contract.param_specs)  # baselines are kept per parameter set too
        job: dict[str, Any] = {
            "path": str(staged),
            "op": family.name,
            "adapter": contract.adapter,
            "device": device,
            "param_specs": contract.param_specs,
            "cases": [c.to_json() for c in plan],
            "threads": sandbox.threads,
            "family_modules": list(family_modules),
            # A copy in the sandbox's folder: the child reads nothing of the state folder.
            "open_target": str(stage_open_target(family.name, sandbox.workdir / "open_target"))
            if open_target is not None
            else None,
            "benchmark": run_bench,
            "bench_shapes": job_bench_shapes,
            "bench_dtype": dtypes[0],
            "bandwidth_cache": baselines.bandwidth_cache() if run_bench else {},
            "cached_baselines": baselines.cached_baselines(
                family.name, contract.module_class, job_bench_shapes, dtypes[0], device_name, params
            )
            if run_bench
            else {},
            # On CUDA the child's GPU work takes the GPU's locks (named by the timing lock's path).
            "timing_lock": str(baselines.timing_lock()) if device == "cuda" else None,
        }
        # The baselines compile in a second child meanwhile, a warm spare: one that had to start first
        # (7-10 s of imports) would make the candidate's child wait longer than compiling them itself.
        compiler = take_spare(device, timeout, memory_limit, cpu_seconds) if precompile_beside.needed(job) else None
        if compiler is not None:
            beside = _start_beside(job, family.name, sandbox.workdir, compiler)
            if keep_warm:
                keep_spare(device, timeout=timeout, memory_limit=memory_limit, cpu_seconds=cpu_seconds)
        # Layer 3: the sandbox; outputs are judged (layer 4's values) as they arrive.
        references = References(family, contract.param_specs, device)
        values = OutputValues(family, plan, references)
        clock = time.monotonic()
        outcome = sandbox.run(job, values.consume)
        verdict.timings.update(sandbox_timings(outcome, time.monotonic() - clock))
        verdict.timings["judge_outputs_device_wait"] = round(values.wait_seconds, 3)
        verdict.timings["judge_settles"] = values.settles
        record_transport(verdict.timings, outcome)
        verdict.timings["sandbox_child_started_by"] = outcome.started_by
        failures = sandbox_failures(outcome, sandbox.timeout, sandbox.memory_limit)
        verdict.failures.extend(failures)
        if outcome.results is None:
            return
        verdict.network_isolated = outcome.results.get("network_isolated")
        verdict.isolation = isolation_held(outcome.results)
        if outcome.results.get("bandwidth_measured"):
            baselines.store_bandwidth(outcome.results.get("device_name"), outcome.results.get("copy_bandwidth_gbs"))
        # Layers 4 and 5, judged here.
        clock = time.monotonic()
        bench_rows = copy.deepcopy(outcome.results.get("bench"))  # judging marks them (floors, dropped baselines)
        judgement = judge(outcome, family, plan, references, device, run_bench, values)
        if _floor_in_doubt(judgement, outcome.results, bench_rows):
            judgement = judge(outcome, family, plan, references, device, run_bench, values)
        verdict.timings["judge"] = round(time.monotonic() - clock, 3)
        verdict.failures.extend(judgement.failures)
        verdict.checks = judgement.checks
        verdict.bench = judgement.bench
        if run_bench and not judgement.failures:
            baselines.store_baselines(family.name, contract.module_class, judgement.bench, device_name, params)
        for key in (
            "speedup_vs_eager",
            "speedup_vs_compile",
            "kernel_us",
            "eager_us",
            "compile_us",
            "compile_ro_us",
            "floor_us",
        ):
            setattr(verdict, key, getattr(judgement, key))
        if verdict.failures:
            verdict.speedup_vs_eager = verdict.speedup_vs_compile = None
    finally:
        if device == "cuda" and compiler_cache.is_template(source):
            # A repository template ran, byte for byte: its kernels warm the shared cache for every
            # later verdict (a candidate's artefacts never leave its folder: `compiler_cache`).
            with contextlib.suppress(Exception):
                compiler_cache.promote(sandbox.workdir, state_dir())
        sandbox.close()
        if beside is not None:
            beside.stop()
            verdict.timings.update(beside.timings())


def isolation_held(results: dict[str, Any]) -> dict[str, Any] | None:
    """The layers that held around the candidate's process (the child's word, `isolation`), with this
    process's own: `parent_non_dumpable`."""
    held = results.get("isolation")
    if not isinstance(held, dict):
        return None
    return {**held, "parent_non_dumpable": protect_parent()}


def _start_beside(job: dict[str, Any], op: str, candidate_folder: Path, compiler: Sandbox) -> precompile_beside.Beside:
    """`precompile_beside.start`, the compiling child given its own copy of an open target (it reads
    neither the state folder nor the candidate's sandbox folder); the candidate's job keeps its copy."""
    own = job.get("open_target")
    if own:
        job["open_target"] = str(stage_open_target(op, compiler.workdir / "open_target"))
    try:
        return precompile_beside.start(job, candidate_folder, compiler)
    finally:
        job["open_target"] = own


def _floor_in_doubt(judgement: Judgement, results: dict[str, Any], bench_rows: Any) -> bool:
    """A kernel faster than the physical floor is a cheat, or the kept copy bandwidth read low (an
    idle GPU's clocks, someone else's work). Measure it again here, with the GPU alone, in this
    process (the child's own reading could come from the candidate's code), and say whether the
    verdict must be judged again against the better reading (`results` then carry it and the bench
    rows as the child wrote them)."""
    if not any(f.rule == "implausible-speed" for f in judgement.failures):
        return False
    import gpuyantra.verifier.bench as bench

    kept = results.get("copy_bandwidth_gbs") or 0.0
    device_name = results.get("device_name") or _device_name("cuda")
    better = baselines.remeasure_bandwidth(device_name, bench.measure_copy_bandwidth)
    if not better or better <= kept:
        return False
    results["copy_bandwidth_gbs"], results["bench"] = better, bench_rows
    return True


# What the sandbox's wall time is made of, in order; `sandbox_other` is what they leave. The child's
# parts (`child_*`) are its own clocks; `load_outputs` and `judge_outputs` ran beside them.
SANDBOX_PARTS = (
    "sandbox_child_start",  # the job waiting for the child's imports and CUDA context
    "child_setup",
    "child_correctness_lock_wait",  # CUDA: the GPU's quiet lock, shared (gpu_locks)
    "child_correctness",
    "child_output_drain",
    "child_precompile",  # torch.compile baselines compiled before the timing lock (bench.precompile_baselines)
    "child_timing_lock_wait",  # the timing lock: a pending served-speed check and others' timing first
    "child_quiet_lock_wait",  # the quiet lock, exclusive: others' correctness ends
    "child_benchmark",
    "child_recheck",
    "child_recheck_drain",
    "child_save_outputs",
    "child_other",
    "child_exit",  # results written to the child's process gone, where that was waited for
    "child_results_seen",  # results written to them seen, the child left to end by itself
    "sandbox_collect",  # the child gone, or finished, to the outcome complete (stragglers, last outputs)
)


def sandbox_timings(outcome: SandboxOutcome, seconds: float) -> dict[str, float]:
    """`sandbox` and every part of it (SANDBOX_PARTS, the child's sub-parts, `sandbox_other`)."""
    timings = {"sandbox": round(seconds, 3)}
    child = (outcome.results or {}).get("timings") or {}
    timings.update({f"child_{k}": float(v) for k, v in child.items() if isinstance(v, (int, float))})
    warm = (outcome.results or {}).get("warm_timings") or {}
    timings.update({f"child_{k}": float(v) for k, v in warm.items() if isinstance(v, (int, float))})
    if outcome.start_wait_seconds is not None:
        timings["sandbox_child_start"] = outcome.start_wait_seconds
    if outcome.exit_seconds is not None:
        timings["child_exit"] = outcome.exit_seconds
    if outcome.results_seen_seconds is not None:
        timings["child_results_seen"] = outcome.results_seen_seconds
    timings["sandbox_collect"] = outcome.collect_seconds
    timings["load_outputs"] = outcome.load_seconds
    timings["load_outputs_cpu"] = outcome.load_cpu_seconds
    timings["judge_outputs"] = outcome.consume_seconds
    timings["judge_outputs_cpu"] = outcome.consume_cpu_seconds
    named = sum(timings.get(part, 0.0) for part in SANDBOX_PARTS)
    timings["sandbox_other"] = round(seconds - named, 3)
    return timings


def record_transport(timings: dict[str, float | str], outcome: SandboxOutcome) -> None:
    """How the outputs reached the parent, beside the timings: `outputs_transport` (`cuda_ipc`,
    `host`, or both joined by `+`; absent when no chunk was judged) and, where outputs of a CUDA run
    went by the host, `outputs_fallback` (the first reason, one line)."""
    used = [t for t in TRANSPORTS if outcome.transports.get(t)]
    if used:
        timings["outputs_transport"] = "+".join(used)
    if outcome.transport_fallback:
        timings["outputs_fallback"] = outcome.transport_fallback


def _device_name(device: str) -> str:
    if device != "cuda":
        return device
    import torch

    return torch.cuda.get_device_name()
