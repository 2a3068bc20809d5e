"""`verify(path, ...)`: the whole trust anchor on one candidate file, in order.

static (AST) -> contract (meta instance) -> sandbox (separate limited process) -> correctness
(judged here against float64) -> benchmark (CUDA only) -> reward (here, from our own numbers).
The candidate's source is read once; the sandbox runs a read-only copy of exactly that text.
"""

from __future__ import annotations

import ast
import importlib
import json
import time
from pathlib import Path
from typing import Any, Sequence

from gpuyantra.candidate import CandidateError, read_source, source_digest
from gpuyantra.verifier import cases as case_plan
from gpuyantra.verifier.contract import check_contract, resolve_family
from gpuyantra.verifier.judge import References, judge, sandbox_failures
from gpuyantra.verifier.sandbox import Sandbox
from gpuyantra.verifier.static import check_source
from gpuyantra.verifier.verdict import Failure, Verdict, compute_reward

DEVICES = ("cpu", "cuda")


def verify(path: str | Path, device: str = "cpu", module_class: str | None = None,
           shapes: list[list[int]] | None = None, dtypes: list[str] | None = None) -> Verdict:
    """Verify one candidate file. Never raises for a bad candidate: a rejected Verdict says why."""
    return run_verification(path, device=device, module_class=module_class, shapes=shapes, dtypes=dtypes)


def run_verification(path: str | Path, device: str = "cpu", module_class: str | None = None,
                     shapes: Sequence[Sequence[int]] | None = None, dtypes: Sequence[str] | None = None, *,
                     timeout: float | None = None, memory_limit: int | None = None, cpu_seconds: int | None = None,
                     seeds: Sequence[int] | None = None, benchmark: bool = True,
                     skip_static: bool = False, family_modules: Sequence[str] = ()) -> Verdict:
    """`verify` with knobs for tests and workers.

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
    started = time.monotonic()
    verdict = Verdict(op=None, accepted=False, reward=-1, device=device, dtypes=dtypes)
    try:
        _run(verdict, Path(path), device, module_class, live, dtypes, (timeout, memory_limit, cpu_seconds),
             tuple(seeds) if seeds else case_plan.SEEDS, benchmark, skip_static, tuple(family_modules))
    except Exception as exc:  # noqa: BLE001 - a verifier bug must reject, never crash the caller
        verdict.failures.append(Failure("sandbox", "internal-error", f"verifier error: {type(exc).__name__}: {exc}"))
    verdict.seconds = round(time.monotonic() - started, 3)
    verdict.reward = compute_reward(verdict.failures, device, verdict.speedup_vs_eager, verdict.speedup_vs_compile)
    verdict.accepted = verdict.reward >= 1
    return verdict


def _read_op(source: str) -> str | None:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "OP" for t in stmt.targets) \
                and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            return stmt.value.value
    return None


def _run(verdict: Verdict, path: Path, device: str, module_class: str | None, live: list[list[int]],
         dtypes: list[str], limits: tuple[float | None, int | None, int | None], seeds: tuple[int, ...],
         benchmark: bool, skip_static: bool, family_modules: tuple[str, ...]) -> None:
    for name in family_modules:
        importlib.import_module(name)
    # Layer 1: static, on the one copy of the source everything downstream uses.
    try:
        source = read_source(path)
    except CandidateError as exc:
        verdict.failures.append(Failure("static", "unreadable", str(exc)))
        return
    op = _read_op(source)
    verdict.op = op
    family, _ = resolve_family(op)
    report = check_source(source, str(path), family)
    if report.op:
        verdict.op = report.op
    static_failures = [f for f in report.failures if not skip_static or f.rule == "syntax-error"]
    verdict.failures.extend(static_failures)
    if not report.parsed:
        return
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            verdict.failures.append(Failure("sandbox", "device-unavailable", "--device cuda, but CUDA is not "
                                            "available on this machine"))
            return
    timeout, memory_limit, cpu_seconds = limits
    sandbox = Sandbox(device, timeout=timeout, memory_limit=memory_limit, cpu_seconds=cpu_seconds)
    try:
        if not verdict.failures:
            sandbox.start()  # imports torch and triton while the contract layer runs here
        # Layer 2: contract.
        contract = check_contract(report, module_class)
        verdict.module_class = contract.module_class
        verdict.failures.extend(contract.failures)
        if verdict.failures:
            return
        family = contract.family
        shapes = case_plan.correctness_shapes(device, live)
        run_bench = benchmark and device == "cuda"
        plan = case_plan.plan(device, shapes, dtypes, seeds, recheck=run_bench)
        verdict.shapes = shapes
        staged = sandbox.stage_file(f"candidate_{source_digest(source)}.py", source)
        job: dict[str, Any] = {
            "path": str(staged), "op": family.name, "adapter": contract.adapter, "device": device,
            "param_specs": contract.param_specs, "cases": [c.to_json() for c in plan],
            "threads": sandbox.threads, "family_modules": list(family_modules), "benchmark": run_bench,
            "bench_shapes": live or case_plan.DEFAULT_BENCH_SHAPES, "bench_dtype": dtypes[0],
            "bandwidth_cache": _bandwidth_cache() if run_bench else {},
        }
        # Layer 3: the sandbox.
        outcome = sandbox.run(job)
        failures = sandbox_failures(outcome, sandbox.timeout, sandbox.memory_limit)
        verdict.failures.extend(failures)
        if outcome.results is None:
            return
        verdict.network_isolated = outcome.results.get("network_isolated")
        if outcome.results.get("bandwidth_measured"):
            _store_bandwidth(outcome.results.get("device_name"), outcome.results.get("copy_bandwidth_gbs"))
        # Layers 4 and 5, judged here.
        judgement = judge(outcome, family, plan, References(family, contract.param_specs), device, run_bench)
        verdict.failures.extend(judgement.failures)
        verdict.checks = judgement.checks
        verdict.bench = judgement.bench
        for key in ("speedup_vs_eager", "speedup_vs_compile", "kernel_us", "eager_us", "compile_us",
                    "compile_ro_us", "floor_us"):
            setattr(verdict, key, getattr(judgement, key))
        if verdict.failures:
            verdict.speedup_vs_eager = verdict.speedup_vs_compile = None
    finally:
        sandbox.close()


def _bandwidth_file() -> Path:
    from gpuyantra.config import state_dir

    return state_dir() / "verifier" / "copy_bandwidth.json"


def _bandwidth_cache() -> dict[str, float]:
    try:
        data = json.loads(_bandwidth_file().read_text())
        return {str(k): float(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _store_bandwidth(device_name: str | None, gbs: float | None) -> None:
    if not device_name or not gbs:
        return
    cache = _bandwidth_cache()
    cache[device_name] = float(gbs)
    path = _bandwidth_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
    tmp.replace(path)
