"""The sandbox child: the only process where candidate code ever runs.

    python -m gpuyantra.verifier.child --device cpu --cpu-seconds N --address-space BYTES

It limits itself and leaves the network namespace before anything else, imports torch and triton
while the parent finishes the contract layer, then reads one JSON job on stdin. It records raw
observations (launch counts, host-side aten ops, input mutation, output aliasing and reuse, types,
devices, timings) into the results file the parent named, and the outputs into a tensor file; it
judges nothing. Its stdout and stderr belong to the candidate and are ignored by the verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import sys
import time
from typing import Any

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000

# aten ops host code may run around the kernel launches: allocation, views, copies, metadata.
ALLOWED_ATEN = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "zeros",
        "zeros_like",
        "new_zeros",
        "zero_",
        "fill_",
        "view",
        "_unsafe_view",
        "reshape",
        "_reshape_alias",
        "as_strided",
        "expand",
        "unsqueeze",
        "squeeze",
        "permute",
        "transpose",
        "t",
        "select",
        "slice",
        "split",
        "split_with_sizes",
        "unbind",
        "narrow",
        "chunk",
        "detach",
        "alias",
        "lift_fresh",
        "lift_fresh_copy",
        "clone",
        "copy_",
        "_to_copy",
        "to",
        "contiguous",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_contiguous",
        "is_non_overlapping_and_dense",
        "_local_scalar_dense",
        "promote_types",
        "result_type",
        "movedim",
        "unflatten",
        "flatten",
        "resolve_conj",
        "resolve_neg",
        "view_as",
        "reshape_as",
        "expand_as",
        "_has_compatible_shallow_copy_type",
        "is_same_size",
    }
)


def _apply_limits(cpu_seconds: int, address_space: int, file_size: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cpu_seconds > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    if address_space > 0:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    if file_size > 0:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))


def _isolate_network(device: str) -> bool:
    """Leave the network namespace where the OS allows it; silently keep going where it does not."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNET) == 0:
            return True
        # Unprivileged: a user namespace first. Only on CPU, where device-file access cannot suffer.
        if device == "cpu" and libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
            return True
    except (OSError, AttributeError):
        pass
    return False


class _Counter:
    def __init__(self) -> None:
        self.launches = 0
        self.depth = 0  # > 0 while a kernel launch runs (the interpreter's own torch ops are not host ops)
        self.wrapped: list[Any] = []  # kernels whose `run` is wrapped

    def unwrap(self) -> None:
        """Restore the kernels' own `run` (for timing: the wrapper must not cost the candidate)."""
        for inner in self.wrapped:
            inner.__dict__.pop("run", None)

    def rewrap(self) -> None:
        for inner in self.wrapped:
            inner.run = inner.__dict__.get("_gy_counted_run") or inner.run


def _instrument(module: Any, path: str, counter: _Counter) -> list[str]:
    """Wrap `run` of every @triton.jit kernel the candidate file defines, to count launches.

    While a launch runs, the host-op recorder is popped: what the kernel (or Triton's interpreter)
    does is not host code, and the interpreter's many tensor copies would only slow it down.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    own: list[str] = []
    seen: set[int] = set()
    for name, obj in list(vars(module).items()):
        inner = obj
        while hasattr(inner, "fn") and hasattr(inner.fn, "run"):
            inner = inner.fn  # Autotuner / Heuristics wrap the JIT function
        fn = getattr(inner, "fn", None)
        code = getattr(fn, "__code__", None)
        if not hasattr(inner, "run") or code is None or id(inner) in seen:
            continue
        if os.path.realpath(code.co_filename) != os.path.realpath(path):
            continue
        seen.add(id(inner))
        original = inner.run

        def run(*args: Any, __original=original, **kwargs: Any) -> Any:
            if not kwargs.get("warmup", False):
                counter.launches += 1
            counter.depth += 1
            try:
                with _disable_current_modes():
                    return __original(*args, **kwargs)
            finally:
                counter.depth -= 1

        inner.run = run
        inner._gy_counted_run = run
        counter.wrapped.append(inner)
        own.append(name)
    return own


def _recorder(counter: _Counter) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostOpRecorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bad: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if counter.depth == 0:
                name = func._schema.name
                namespace, _, op = name.partition("::")
                if namespace != "aten" or op not in ALLOWED_ATEN:
                    self.bad.add(name)
            return func(*args, **(kwargs or {}))

    return HostOpRecorder()


def _span(t: Any) -> tuple[int, int]:
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def _overlaps(a: Any, b: Any) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a1 > a0 and b1 > b0 and a0 < b1 and b0 < a1


def _type_name(obj: Any) -> str:
    cls = type(obj)
    return (
        "torch.Tensor"
        if cls.__module__ == "torch" and cls.__qualname__ == "Tensor"
        else f"{cls.__module__}.{cls.__qualname__}"
    )


def _poison(activations: Any) -> None:
    """Fill recently freed memory with NaN so unwritten output elements show up (stale memory)."""
    import torch

    junk = []
    for a in activations:
        if a.is_floating_point():
            junk.append(torch.full(a.shape, float("nan"), dtype=a.dtype, device=a.device))
            junk.append(torch.full(a.shape, float("nan"), dtype=torch.float32, device=a.device))
    del junk


def _hard_finding(record: dict[str, Any]) -> bool:
    """Observations that reject on their own: no need to run the remaining cases."""
    return bool(
        record.get("launches", 0) < 1
        or record.get("host_ops")
        or record.get("mutated")
        or record.get("aliases")
        or record.get("reused")
        or record.get("stream_changed")
        or any(t != "torch.Tensor" for t in record.get("types", []))
        or any(d != record.get("input_device") for d in record.get("devices", []))
    )


def run_cases(cases: list, ctx: dict[str, Any], results: dict[str, Any], outputs: dict[str, Any]) -> bool:
    """Calls entry on every case; False once a call raised or showed a hard finding."""
    import torch

    from gpuyantra.verifier.cases import make_case

    family, entry, counter, recorder = ctx["family"], ctx["entry"], ctx["counter"], ctx["recorder"]
    device = ctx["device"]
    for _, group in itertools.groupby(cases, key=lambda c: (c.phase, c.dtype, c.shape)):
        alive: list[tuple[int, list[tuple[int, Any]]]] = []
        for case in group:
            acts, params = make_case(family, case, ctx["param_specs"], device)
            named = [
                (f"activation {family.activations[i] if i < len(family.activations) else i}", a)
                for i, a in enumerate(acts)
            ]
            named += [(f"parameter {k}", v) for k, v in params.items() if isinstance(v, torch.Tensor)]
            snapshots = [t.clone() for _, t in named]
            record: dict[str, Any] = {"id": case.id, "input_device": str(acts[0].device)}
            _poison(acts)
            counter.launches = 0
            recorder.bad = set()
            started = time.perf_counter()
            try:
                with torch.no_grad(), recorder:
                    out = entry(*acts, **params)
                if device == "cuda":
                    torch.cuda.synchronize()
            except BaseException as exc:  # noqa: BLE001 - whatever the candidate raises is a finding
                record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                record["launches"] = counter.launches
                results["checks"].append(record)
                return False
            record["seconds"] = round(time.perf_counter() - started, 6)
            record["launches"] = counter.launches
            record["host_ops"] = sorted(recorder.bad)
            if device == "cuda":
                record["stream_changed"] = torch.cuda.current_stream() != torch.cuda.default_stream()
                if record["stream_changed"]:
                    torch.cuda.set_stream(torch.cuda.default_stream())
            items = list(out) if type(out) in (tuple, list) else [out]
            record["container"] = type(out).__name__ if type(out) in (tuple, list) else None
            record["types"] = [_type_name(o) for o in items]
            plain = [(j, o) for j, o in enumerate(items) if type(o) is torch.Tensor and o.device.type not in ("meta",)]
            record["devices"] = [str(o.device) if isinstance(o, torch.Tensor) else None for o in items]
            record["aliases"] = [[j, name] for j, o in plain for name, t in named if _overlaps(o, t)]
            reused = [[j, other] for j, o in plain for other, outs in alive for _, p in outs if _overlaps(o, p)]
            reused += [[j, case.id] for (j, o), (k, p) in itertools.combinations(plain, 2) if _overlaps(o, p)]
            record["reused"] = reused
            record["mutated"] = [
                name
                for (name, t), snap in zip(named, snapshots)
                if t.shape != snap.shape or t.dtype != snap.dtype or not torch.equal(t, snap)
            ]
            alive.append((case.id, [(j, o) for j, o in plain if str(o.device) == record["input_device"]]))
            results["checks"].append(record)
            if _hard_finding(record):
                results["stopped"] = f"stopped after call {case.id}: the parent rejects on this record alone"
                _save(alive, outputs)
                return False
        _save(alive, outputs)
    return True


def _save(alive: list, outputs: dict[str, Any]) -> None:
    """Outputs are saved only after their whole group ran: a buffer returned twice now holds the last answer."""
    import torch

    for case_id, outs in alive:
        for j, o in outs:
            outputs[f"{case_id}:{j}"] = o.detach().to("cpu").clone(memory_format=torch.contiguous_format)


def execute(job: dict[str, Any], results: dict[str, Any], outputs: dict[str, Any]) -> None:
    import importlib

    import torch

    from gpuyantra.candidate import CandidateError, load_candidate
    from gpuyantra.ops import get_op
    from gpuyantra.verifier.cases import Case

    setup_started = time.perf_counter()
    device = job["device"]
    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    if device == "cuda":
        from gpuyantra.verifier import bench

        bench.float32_as_float32()
        name = torch.cuda.get_device_name()
        results["device_name"] = name
        bandwidth = (job.get("bandwidth_cache") or {}).get(name)
        if job.get("benchmark") and not bandwidth:
            with _timed(results.setdefault("timings", {}), "setup_bandwidth"):
                bandwidth = bench.measure_copy_bandwidth()  # before any candidate code has run
            results["bandwidth_measured"] = True
        results["copy_bandwidth_gbs"] = bandwidth
    with _timed(results.setdefault("timings", {}), "setup_family"):
        for module_name in job.get("family_modules", []):
            importlib.import_module(module_name)
        if job.get("open_target"):
            from pathlib import Path

            from gpuyantra.ops.open import load_open_target, register_open

            register_open(load_open_target(Path(job["open_target"])), save=False)
        family = get_op(job["op"])
    results["stage"] = "import"
    try:
        with _timed(results.setdefault("timings", {}), "setup_import"):
            candidate = load_candidate(job["path"])
    except CandidateError as exc:
        results["error"] = {"rule": "import-failed", "message": str(exc)}
        return
    except BaseException as exc:  # noqa: BLE001
        results["error"] = {"rule": "import-failed", "message": f"{type(exc).__name__}: {exc}"}
        return
    module = candidate.module
    mismatches = []
    if candidate.op != job["op"]:
        mismatches.append(f"OP is {candidate.op!r} at runtime, {job['op']!r} in the source")
    if candidate.adapter != job["adapter"]:
        mismatches.append("ADAPTER at runtime differs from the literal in the source")
    entry = candidate.entry
    code = getattr(entry, "__code__", None)
    if (
        code is None
        or code.co_name != "entry"
        or getattr(entry, "__module__", None) != module.__name__
        or os.path.realpath(code.co_filename) != os.path.realpath(job["path"])
    ):
        mismatches.append("entry at runtime is not the `def entry` of the file")
    if mismatches:
        results["error"] = {"rule": "runtime-mismatch", "message": "; ".join(mismatches)}
        return
    counter = _Counter()
    results["kernels"] = _instrument(module, job["path"], counter)
    ctx = {
        "family": family,
        "entry": entry,
        "counter": counter,
        "recorder": _recorder(counter),
        "device": device,
        "param_specs": job["param_specs"],
    }
    cases = [Case.from_json(c) for c in job["cases"]]
    timings = results.setdefault("timings", {})
    timings["setup"] = round(time.perf_counter() - setup_started, 3)  # job read to first case
    results["stage"] = "correctness"
    with _timed(timings, "correctness"):
        if not run_cases([c for c in cases if c.phase == "main"], ctx, results, outputs):
            return
    if device == "cuda" and job.get("benchmark"):
        from gpuyantra.verifier import bench

        results["stage"] = "benchmark"
        counter.unwrap()
        waited_from = time.perf_counter()
        try:
            with _exclusive(job.get("timing_lock")):
                timings["timing_lock_wait"] = round(time.perf_counter() - waited_from, 3)
                with _timed(timings, "benchmark"):
                    for shape in job["bench_shapes"]:
                        cached = (job.get("cached_baselines") or {}).get("x".join(str(d) for d in shape))
                        row = bench.bench_shape(family, entry, shape, job["bench_dtype"], job["param_specs"], cached)
                        results["bench"].append(row)
                        if row.get("kernel_us") is None:
                            return
        finally:
            counter.rewrap()
        results["stage"] = "recheck"
        with _timed(timings, "recheck"):
            if not run_cases([c for c in cases if c.phase == "recheck"], ctx, results, outputs):
                return
    results["stage"] = "done"


@contextlib.contextmanager
def _exclusive(lock_path: str | None):
    """Hold an exclusive flock on `lock_path` (no other verification times on this GPU meanwhile)."""
    if not lock_path:
        yield
        return
    import fcntl

    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def _timed(timings: dict[str, float], name: str):
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = round(time.perf_counter() - started, 3)


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuyantra.verifier.child")
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--cpu-seconds", type=int, default=0)
    parser.add_argument("--address-space", type=int, default=0)
    parser.add_argument("--file-size", type=int, default=0)
    args = parser.parse_args(argv)
    _apply_limits(args.cpu_seconds, args.address_space, args.file_size)
    network_isolated = _isolate_network(args.device)
    # Heavy imports while the parent is still busy with the contract layer.
    import torch
    import triton  # noqa: F401

    import gpuyantra.candidate
    import gpuyantra.verifier.cases  # noqa: F401
    from gpuyantra.ops import all_ops

    all_ops()
    if args.device == "cuda":
        torch.cuda.init()  # a warm spare has its context before the job arrives
    raw = sys.stdin.read()
    if not raw.strip():
        return 0  # the parent rejected the candidate before running it
    job = json.loads(raw)
    results: dict[str, Any] = {"network_isolated": network_isolated, "checks": [], "bench": [], "stage": "start"}
    outputs: dict[str, Any] = {}
    try:
        execute(job, results, outputs)
    except BaseException as exc:  # noqa: BLE001 - record what happened; the parent decides
        results["harness_error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        import torch as _torch

        try:
            with _timed(results.setdefault("timings", {}), "save_outputs"):
                _torch.save(outputs, job["outputs_path"])
        except BaseException as exc:  # noqa: BLE001
            results["harness_error"] = f"saving outputs failed: {type(exc).__name__}: {exc}"[:2000]
        # When the results were complete: the parent attributes the rest (the interpreter's and the
        # CUDA context's teardown) to `child_exit`.
        results["finished_at"] = time.time()
        _write_json(job["results_path"], results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
