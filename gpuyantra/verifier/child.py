# Over 600 lines: the only process where candidate code runs, one module so its imports stay audited.
"""The sandbox child: the only process where candidate code ever runs.

    python -m gpuyantra.verifier.child --device cpu --cpu-seconds N --address-space BYTES

It limits itself and leaves the network namespace before anything else, does everything that does
not depend on the job (imports, on CUDA the context) while the parent finishes the contract layer
(or, as a warm spare, before the job exists), then reads one JSON job on stdin. It records raw
observations (launch counts, host-side aten ops, input mutation, output aliasing and reuse, types,
devices, timings) into the results file the parent named, and hands the outputs to the parent in
numbered chunk files of bounded size (`OutputSink`; on CUDA the files carry the CUDA IPC handle of
one buffer per chunk on the GPU, `transport`); it judges nothing. Its stdout and stderr belong
to the candidate and are ignored by the verdict.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuyantra.files import write_whole
from gpuyantra.verifier import compiler_cache, isolation

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


# Niceness of a sandbox child: on a machine that also serves the model, the server's decode loop gets
# the CPU first. A verdict's times are device times (bench.time_cuda), so the child loses nothing
# there; measured without it, eight children importing and compiling moved an unchanged server's
# tokens/s by up to 25% between two served-speed checks.
CHILD_NICENESS = 10
# A spare creates its CUDA context once the GPU has been free of others' work this long, when its job
# comes, or after the longest wait (a worker that never idles): forked spares would otherwise create
# theirs about a second after their fork, inside the round of six verifications that forked them.
SPARE_IDLE_S = 0.1
SPARE_IDLE_MAX_WAIT_S = 5.0


def _apply_limits(cpu_seconds: int, address_space: int, file_size: int) -> None:
    import resource

    with contextlib.suppress(OSError):  # at least CHILD_NICENESS (a forked child has it already)
        current = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, max(current, CHILD_NICENESS))
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


def _recorder(counter: _Counter, library_aten: frozenset[str] = frozenset()) -> Any:
    """Records host-side torch ops outside kernel launches: `bad` the forbidden ones, `library` the
    library primitives the family permits (`library_aten`: aten names, gpuyantra/ops/open/library.py)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class HostOpRecorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bad: set[str] = set()
            self.library: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if counter.depth == 0:
                name = func._schema.name
                namespace, _, op = name.partition("::")
                if namespace == "aten" and op in library_aten:
                    self.library.add(name)
                elif namespace != "aten" or op not in ALLOWED_ATEN:
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


# Inputs and their snapshots a CUDA group of calls keeps for one synchronize, at most (bytes). A
# synchronize after each call was a wait per call (170 calls in a norm's verdict): with six
# verifications' children taking turns on one GPU, each wait was a turn of theirs.
SETTLE_BYTES = 1 << 30


class _Unsettled:
    """Calls whose device work may still be running (on CUDA, none is waited for one by one): their
    records, with their inputs and the snapshots to compare them to once every stream is done (a
    kernel the candidate left running on a stream of its own may still write an input)."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], list[tuple[str, Any]], list[Any]]] = []
        self.nbytes = 0

    def add(self, record: dict[str, Any], named: list[tuple[str, Any]], snapshots: list[Any]) -> None:
        self.calls.append((record, named, snapshots))
        self.nbytes += 2 * sum(t.numel() * t.element_size() for _, t in named)


def _settle(
    unsettled: _Unsettled, unread: list, device: str, results: dict[str, Any], part: str = "correctness"
) -> bool:
    """Wait for the unsettled calls' device work, then queue their input comparisons into `unread`.
    False when the wait raised (a device fault of one of them): the first of them carries the error
    and the records after it are dropped, since which call faulted cannot be told."""
    import torch

    calls, unsettled.calls, unsettled.nbytes = unsettled.calls, [], 0
    if not calls:
        return True
    if device == "cuda":
        try:
            with _timed(results.setdefault("timings", {}), f"{part}_sync", add=True):
                torch.cuda.synchronize()
        except BaseException as exc:  # noqa: BLE001 - an asynchronous fault is the candidate's
            first, last = calls[0][0], calls[-1][0]
            first["error"] = (
                f"{type(exc).__name__}: {exc}"[:2000]
                + f" (reported by the synchronize after calls {first['id']}-{last['id']}, one of which faulted)"
            )
            dropped = {id(record) for record, _, _ in calls[1:]}
            results["checks"] = [r for r in results["checks"] if id(r) not in dropped]
            return False
    for record, named, snapshots in calls:
        unread.append((record, [(name, _changed(t, snap)) for (name, t), snap in zip(named, snapshots)]))
    return True


def run_cases(
    cases: list, ctx: dict[str, Any], results: dict[str, Any], sink: OutputSink, part: str = "correctness"
) -> bool:
    """Calls entry on every case; False once a call raised or showed a hard finding. On CUDA the calls
    of a group run without a synchronize between them (`_settle` waits once for up to SETTLE_BYTES
    of their inputs); on the CPU each call is settled as it returns."""
    import torch

    from gpuyantra.verifier.cases import make_case

    family, entry, counter, recorder = ctx["family"], ctx["entry"], ctx["counter"], ctx["recorder"]
    device = ctx["device"]
    settle_bytes = SETTLE_BYTES if device == "cuda" else 0
    parts = results.setdefault("timings", {})  # where the phase's wall time goes: `{part}_inputs`, `_calls`, `_sync`
    for _, group in itertools.groupby(cases, key=lambda c: (c.phase, c.dtype, c.shape)):
        alive: list[tuple[int, list[tuple[int, Any]]]] = []
        unread: list[tuple[dict[str, Any], list[tuple[str, Any]]]] = []  # records whose `mutated` is unread
        unsettled = _Unsettled()
        for case in group:
            with _timed(parts, f"{part}_inputs", add=True):
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
            recorder.bad, recorder.library = set(), set()
            started = time.perf_counter()
            try:
                with torch.no_grad(), recorder, _timed(parts, f"{part}_calls", add=True):
                    out = entry(*acts, **params)
            except BaseException as exc:  # noqa: BLE001 - whatever the candidate raises is a finding
                record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                record["launches"] = counter.launches
                with contextlib.suppress(BaseException):  # after a device fault nothing more can be read
                    if _settle(unsettled, unread, device, results, part):
                        _read_mutations(unread)
                results["checks"].append(record)
                return False
            record["seconds"] = round(time.perf_counter() - started, 6)  # host time: the launches
            record["launches"] = counter.launches
            record["host_ops"] = sorted(recorder.bad)
            if recorder.library:
                record["library_ops"] = sorted(recorder.library)
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
            unsettled.add(record, named, snapshots)
            alive.append((case.id, [(j, o) for j, o in plain if str(o.device) == record["input_device"]]))
            results["checks"].append(record)
            hard = _hard_finding(record)
            if (hard or unsettled.nbytes > settle_bytes) and not _settle(unsettled, unread, device, results, part):
                return False
            if hard:
                _read_mutations(unread)
                results["stopped"] = f"stopped after call {case.id}: the parent rejects on this record alone"
                _save(alive, sink, results)
                return False
        if not _settle(unsettled, unread, device, results, part):
            return False
        with _timed(parts, f"{part}_sync", add=True):
            mutated = next((record for record in _read_mutations(unread) if record["mutated"]), None)
        if mutated is not None:
            results["stopped"] = f"stopped after call {mutated['id']}: the parent rejects on this record alone"
            _save(alive, sink, results)
            return False
        if not _save(alive, sink, results):
            return False
    return True


def _changed(t: Any, snapshot: Any) -> Any:
    """Whether an input differs from its snapshot: True where its shape or dtype changed, else a
    one-element tensor on its device, read with the group's others (`_read_mutations`)."""
    if t.shape != snapshot.shape or t.dtype != snapshot.dtype:
        return True
    return (t != snapshot).any()  # NaN != NaN: a NaN written into an input counts, as in torch.equal


def _read_mutations(unread: list[tuple[dict[str, Any], list[tuple[str, Any]]]]) -> list[dict[str, Any]]:
    """Fill each record's `mutated` (inputs that differ from their snapshots) with one read from the
    device for all of them, and return those records (`unread` is emptied). A read per input was a
    wait per input: with six verifications' children taking turns on one GPU, each wait was a turn
    of theirs."""
    import torch

    flags = [flag for _, changes in unread for _, flag in changes if isinstance(flag, torch.Tensor)]
    values = iter(torch.stack(flags).tolist() if flags else [])
    for record, changes in unread:
        record["mutated"] = [
            name for name, flag in changes if (next(values) if isinstance(flag, torch.Tensor) else flag)
        ]
    records = [record for record, _ in unread]
    unread.clear()
    return records


def _save(alive: list, sink: OutputSink, results: dict[str, Any]) -> bool:
    """Outputs are saved only after their whole group ran: a buffer returned twice now holds the last answer.
    False when a call's outputs exceed what the sandbox hands over at once (recorded for the parent)."""
    for case_id, outs in alive:
        refused = sink.add(case_id, outs)
        if refused is not None:
            results["output_limit"] = refused
            return False
    sink.end_group()
    return True


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


CHUNK_PREFIX = "chunk-"
CHUNKS_PER_BUDGET = 4  # chunk size = budget / 4: the parent judges one chunk while the next ones are written
# On CUDA a group's outputs become a chunk once the chunk holds this much. Each chunk costs the
# parent a mapping, a copy and a wait for the device, under the GIL it shares with the other
# verifications' judging: one chunk per group made 19 chunks of the rms_norm plan (bfloat16, two
# live shapes), most of them groups of a few KiB (one row, the recheck's); this makes them 8.
GROUP_CHUNK_BYTES = 32 * 2**20
WAIT_POLL_SECONDS = 0.005
# How often a child waiting for the baselines compiled beside it looks for the parent's word.
BESIDE_POLL_SECONDS = 0.02


def chunk_name(sequence: int) -> str:
    return f"{CHUNK_PREFIX}{sequence:06d}.pt"


def _without_crc32() -> None:
    """torch.save computes a CRC-32 of every record, a second pass over the bytes that nobody checks
    here (the chunk goes to the parent beside it; torch.load does not read it): 1.0 s of 1.3 s for
    240 MiB of outputs, measured on a 2-core machine. Torch versions without the setting keep it."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return
    save = getattr(config, "save", None)
    if save is not None and hasattr(save, "compute_crc32"):
        save.compute_crc32 = False


class OutputSink:
    """Hands the outputs of checked calls to the parent in numbered chunk files (`chunk-000000.pt`,
    ...) in `folder`. The parent judges and deletes each chunk while the harness goes on, and the
    harness never leaves more than `budget` bytes of outputs unread there: outputs of any total size
    pass through a bounded folder and stay far below the sandbox's file-size limit. One call whose
    outputs alone exceed the budget is refused (the verdict names the limit).

    With `cuda_ipc` (CUDA runs) each output is cloned on the GPU, a chunk's clones are packed into
    one buffer there, and the chunk carries the CUDA IPC handle of that buffer and each output's place
    in it instead of their bytes (`transport`): the buffer is held (`held`, counted in the budget as
    the unread bytes it is) until the parent has deleted the chunk, which it does once it has copied
    it. Where exporting fails, or the parent leaves a nack for a chunk it could
    not map, those outputs go by the host, and so does everything after (`cuda_ipc` is cleared: a
    failure repeats, and a clone nobody maps is never released by torch)."""

    def __init__(
        self,
        folder: str,
        budget: int,
        chunk_per_group: bool = False,
        cuda_ipc: bool = False,
        notify_fd: int = -1,
        group_chunk_bytes: int = 0,
    ) -> None:
        from gpuyantra.verifier.transport import export_cuda_ipc

        self.folder = folder
        # The parent's reader sleeps until a byte arrives here (non-blocking: a full pipe, or one the
        # candidate closed, costs the parent a poll of its own, never a wait here).
        self.notify_fd = notify_fd
        if notify_fd >= 0:
            with contextlib.suppress(OSError):
                os.set_blocking(notify_fd, False)
        self.budget = max(1, int(budget))
        # On CUDA each group of calls is a chunk: the parent judges it (on the GPU) while the next group
        # runs. On CPU chunks go by size: judging beside the interpreter only slowed a small worker.
        self.chunk_per_group = chunk_per_group
        self.chunk_bytes = max(1, self.budget // CHUNKS_PER_BUDGET)
        # A group's outputs short of this wait for the next group's in the same chunk (`end_group`).
        self.group_chunk_bytes = min(max(0, group_chunk_bytes), self.chunk_bytes)
        self.cuda_ipc = cuda_ipc
        # outputs -> (entries, the exported tensors: what must stay alive until the chunk is read)
        self.export: Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]] = export_cuda_ipc
        self.pending: dict[str, Any] = {}
        self.pending_bytes = 0
        self.held: dict[int, tuple[int, dict[str, Any]]] = {}  # cuda_ipc chunk -> (bytes, exported) until read
        self.written = 0
        self.parent = os.getppid()
        self.wait_seconds = 0.0  # waiting for the parent to read earlier chunks (back-pressure)
        self.copy_seconds = 0.0  # outputs cloned on the GPU (cuda_ipc) or copied to the host
        self.write_seconds = 0.0  # chunk files written (with cuda_ipc: the clones exported too)

    def add(self, case_id: int, outs: list[tuple[int, Any]]) -> str | None:
        """Queue one call's outputs (cloned on their GPU for cuda_ipc, else copied to the host,
        either way detached from the candidate's buffers); the refusal message when they exceed the
        budget."""
        import torch

        size = sum(o.numel() * o.element_size() for _, o in outs)
        if size > self.budget:
            return (
                f"call {case_id} returned {_bytes(size)} of outputs; the sandbox hands outputs to the "
                f"parent at most {_bytes(self.budget)} at a time (its output budget)"
            )
        if self.pending and self.pending_bytes + size > self.chunk_bytes:
            self.flush()
        started = time.perf_counter()
        for j, o in outs:
            # One copy, contiguous: on the GPU where it goes by CUDA IPC, else to the host.
            where = o.device if self.cuda_ipc and o.device.type == "cuda" else "cpu"
            self.pending[f"{case_id}:{j}"] = o.detach().to(where, memory_format=torch.contiguous_format, copy=True)
        self.pending_bytes += size
        self.copy_seconds += time.perf_counter() - started
        return None

    def end_group(self) -> None:
        if self.chunk_per_group and self.pending_bytes >= self.group_chunk_bytes:
            self.flush()

    def flush(self) -> None:
        """Write the queued outputs as the next chunk, once the unread ones leave room for it."""
        if not self.pending:
            return
        from gpuyantra.verifier.transport import choose_transport, host_chunk, ipc_chunk

        self._wait(lambda count, unread: count == 0 or unread + self.pending_bytes <= self.budget)
        started, copied = time.perf_counter(), self.copy_seconds
        outputs, nbytes = self.pending, self.pending_bytes
        self.pending, self.pending_bytes = {}, 0
        transport, exported, reason = choose_transport("cuda" if self.cuda_ipc else "cpu", lambda: self.export(outputs))
        if exported is not None:
            entries, shared = exported  # the clones go: what was exported is a copy of them
            self.held[self._write(ipc_chunk(entries))] = (nbytes, shared)
        else:
            if reason is not None:
                self.cuda_ipc = False
            self._write(host_chunk(self._to_host(outputs), reason))
        self.write_seconds += time.perf_counter() - started - (self.copy_seconds - copied)

    def close(self) -> None:
        """Flush, and wait until the parent has copied every clone it was handed by CUDA IPC: they must
        outlive its reading (host chunks the parent reads after the child is gone)."""
        self.flush()
        self._wait(lambda count, unread: not self.held)

    def drain(self) -> None:
        """Flush and wait until the parent has read every chunk (its GPU work must not overlap timing)."""
        self.flush()
        self._wait(lambda count, unread: count == 0)

    def _to_host(self, outputs: dict[str, Any]) -> dict[str, Any]:
        import torch

        started = time.perf_counter()
        host = {k: t.to("cpu", memory_format=torch.contiguous_format) for k, t in outputs.items()}
        self.copy_seconds += time.perf_counter() - started
        return host

    def _write(self, chunk: dict[str, Any]) -> int:
        """Write `chunk` as the next numbered file (whole or not at all); its number."""
        import torch

        from gpuyantra.verifier.transport import CUDA_IPC

        sequence = self.written
        name = chunk_name(sequence)
        partial = os.path.join(self.folder, f".{name}.partial")
        try:
            if chunk.get("transport") == CUDA_IPC:
                # Descriptions only (str, int, lists of int): JSON, which the parent parses in C;
                # torch.load's weights_only unpickler, in Python, took 2.6 ms of its GIL per chunk.
                with open(partial, "w", encoding="ascii") as handle:
                    json.dump(chunk, handle)
            else:
                _without_crc32()
                torch.save(chunk, partial)
        except Exception as exc:  # a full disk or the file-size limit: say which chunk, not just "zip error"
            raise RuntimeError(
                f"cannot hand outputs to the parent (chunk {sequence}): {type(exc).__name__}: {exc}"
            ) from exc
        os.replace(partial, os.path.join(self.folder, name))  # the parent never sees a half-written chunk
        self.written += 1
        if self.notify_fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self.notify_fd, b"\n")
        return sequence

    def _collect(self) -> None:
        """Release the clones of every cuda_ipc chunk the parent has read; where it left a nack (it
        could not map them), send them again by the host."""
        from gpuyantra.verifier.transport import host_chunk, nack_name

        if not self.held:
            return
        present = set(os.listdir(self.folder))
        for sequence in sorted(self.held):
            if chunk_name(sequence) in present:
                continue
            _, clones = self.held.pop(sequence)
            if nack_name(sequence) in present or os.path.exists(os.path.join(self.folder, nack_name(sequence))):
                self.cuda_ipc = False
                self._write(host_chunk(self._to_host(clones)))
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.folder, nack_name(sequence)))
            del clones  # the parent's copy is complete and its mapping released

    def _unread(self) -> tuple[int, int]:
        """(chunks, bytes of outputs) written and not yet read by the parent."""
        self._collect()
        count = total = 0
        held = {chunk_name(sequence): nbytes for sequence, (nbytes, _) in self.held.items()}
        for name in os.listdir(self.folder):
            if name.startswith(CHUNK_PREFIX):
                count += 1
                if name in held:
                    total += held[name]
                    continue
                with contextlib.suppress(OSError):  # read and deleted meanwhile
                    total += os.path.getsize(os.path.join(self.folder, name))
        return count, total

    def _wait(self, ready: Callable[[int, int], bool]) -> None:
        started = time.perf_counter()
        while not ready(*self._unread()):
            if os.getppid() != self.parent:  # nobody will ever read them: stop instead of waiting forever
                raise RuntimeError("the parent stopped reading the outputs (it exited)")
            time.sleep(WAIT_POLL_SECONDS)
        self.wait_seconds += time.perf_counter() - started


def execute(job: dict[str, Any], results: dict[str, Any], sink: OutputSink) -> None:
    timings = results["timings"]
    if job.get("precompile_only"):
        _precompile_only(job, results)
        return
    with _timed(timings, "setup"):  # job read to first case
        ctx = _setup(job, results)
    timings["setup_other"] = _rest(timings, timings["setup"], SETUP_PARTS)
    if ctx is None:
        return
    cases = ctx["cases"]
    cuda = ctx["device"] == "cuda"
    # On CUDA, GPU work that is not timing shares the GPU (gpu_locks: never while anything is timed).
    lock = job.get("timing_lock") if cuda else None
    results["stage"] = "correctness"
    with _shared(lock, timings, "correctness_lock_wait"):
        with _timed(timings, "correctness"), _timed(timings, "correctness_cpu", time.process_time):
            passed = run_cases([c for c in cases if c.phase == "main"], ctx, results, sink)
        if cuda:
            # The parent judges on the GPU as chunks arrive: all of that ends before anything is timed,
            # and before this verification stops sharing the GPU.
            with _timed(timings, "output_drain"):
                sink.drain()
    if not passed:
        return
    if cuda and job.get("benchmark"):
        results["stage"] = "precompile"
        # No GPU lock: compiling is CPU work but for one call per baseline, too little to move another
        # verdict's timing; under the shared lock the first wave of a campaign waited up to 22 s here.
        with _timed(timings, "precompile"):
            _compiled_beside(job, timings)
            # Then here too, from the caches that child filled: a process's first compile costs seconds
            # beyond the caches' hits (H200: the timed compile took 4.8-5.3 s after a compile beside
            # alone, 2.1 s after one here), and here it holds no lock.
            _precompile(job, ctx)
        results["stage"] = "benchmark"
        with _alone(lock, timings, "timing_lock_wait", "quiet_lock_wait"):
            if not _benchmark(job, ctx, results):
                return
            results["stage"] = "recheck"
            # In the same turn: the GPU is still this verification's alone, so the recheck and the
            # parent's judging of it take a few milliseconds; after the other verifications' turns,
            # all six rechecks and child exits of six at once came together at the end.
            with _timed(timings, "recheck"):
                passed = run_cases([c for c in cases if c.phase == "recheck"], ctx, results, sink, "recheck")
            with _timed(timings, "recheck_drain"):
                sink.drain()  # the parent's judging of them on the GPU
        if not passed:
            return
    results["stage"] = "done"


# Within `correctness` and `recheck` (sums over their calls, not adding to JOB_PARTS): the CPU the
# process used, making the cases' inputs and snapshots, the candidate's calls (launches), and waiting
# for the device; what they leave is handing outputs over (`outputs_*`) and the records.
PHASE_PARTS = tuple(
    f"{phase}_{part}" for phase in ("correctness", "recheck") for part in ("inputs", "calls", "sync")
) + ("correctness_cpu",)

# The named parts of `setup`; what they leave is `setup_other`.
SETUP_PARTS = (
    "setup_device",
    "setup_bandwidth_lock_wait",
    "setup_bandwidth",
    "setup_family",
    "setup_import",
    "setup_harness",
)


def _setup(job: dict[str, Any], results: dict[str, Any]) -> dict[str, Any] | None:
    """Family, candidate import, runtime checks and instrumentation; None when the candidate cannot run."""
    import torch

    import gpuyantra.verifier.bench as bench
    from gpuyantra.candidate import CandidateError, load_candidate
    from gpuyantra.verifier.cases import Case

    timings = results["timings"]
    device = job["device"]
    with _timed(timings, "setup_device"):
        torch.set_num_threads(max(1, int(job.get("threads", 1))))
        if device == "cuda":
            bench.float32_as_float32()  # done in `_warm_up` (with its imports); cheap to be sure here
            results["device_name"] = torch.cuda.get_device_name()
    if device == "cuda":
        bandwidth = (job.get("bandwidth_cache") or {}).get(results["device_name"])
        if job.get("benchmark") and not bandwidth:
            # A timing too: the GPU alone, as for the kernels (both waits in one key).
            wait = "setup_bandwidth_lock_wait"
            with _alone(job.get("timing_lock"), timings, wait, wait), _timed(timings, "setup_bandwidth"):
                bandwidth = bench.measure_copy_bandwidth()  # before any candidate code has run
            results["bandwidth_measured"] = True
        results["copy_bandwidth_gbs"] = bandwidth
    with _timed(timings, "setup_family"):
        family = _family(job)
    results["stage"] = "import"
    try:
        with _timed(timings, "setup_import"):
            candidate = load_candidate(job["path"])
    except CandidateError as exc:
        results["error"] = {"rule": "import-failed", "message": str(exc)}
        return None
    except BaseException as exc:  # noqa: BLE001
        results["error"] = {"rule": "import-failed", "message": f"{type(exc).__name__}: {exc}"}
        return None
    with _timed(timings, "setup_harness"):
        mismatches = _runtime_mismatches(candidate, job)
        if mismatches:
            results["error"] = {"rule": "runtime-mismatch", "message": "; ".join(mismatches)}
            return None
        counter = _Counter()
        results["kernels"] = _instrument(candidate.module, job["path"], counter)
        return {
            "family": family,
            "entry": candidate.entry,
            "counter": counter,
            "recorder": _recorder(counter, _library_aten(family)),
            "device": device,
            "param_specs": job["param_specs"],
            "cases": [Case.from_json(c) for c in job["cases"]],
        }


def _library_aten(family: Any) -> frozenset[str]:
    """The aten ops of the library primitives the family's computation permits (none for a
    registered family), read from the harness's own open target before any candidate code runs."""
    from gpuyantra.ops.open.library import ATEN_KINDS, permitted_kinds

    kinds = permitted_kinds(family)
    return frozenset(op for op, kind in ATEN_KINDS.items() if kind in kinds)


def _family(job: dict[str, Any]) -> Any:
    """The job's op family, its modules imported and (an open target) registered from its folder."""
    import importlib

    from gpuyantra.ops import get_op

    for module_name in job.get("family_modules", []):
        importlib.import_module(module_name)
    if job.get("open_target"):
        from gpuyantra.ops.open import load_open_target, register_open

        register_open(load_open_target(Path(job["open_target"])), save=False)
    return get_op(job["op"])


def _runtime_mismatches(candidate: Any, job: dict[str, Any]) -> list[str]:
    """Where OP, ADAPTER or entry at runtime differ from what the static layer read."""
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
        or getattr(entry, "__module__", None) != candidate.module.__name__
        or os.path.realpath(code.co_filename) != os.path.realpath(job["path"])
    ):
        mismatches.append("entry at runtime is not the `def entry` of the file")
    return mismatches


def _precompile(job: dict[str, Any], ctx: dict[str, Any]) -> None:
    """The torch.compile baselines compiled once, sharing the GPU, before the timing lock: the compile
    under the lock then hits the compilers' caches (bench.precompile_baselines says why)."""
    import gpuyantra.verifier.bench as bench

    counter = ctx["counter"]
    counter.unwrap()  # the baselines' own calls are not the candidate's
    try:
        compiler_cache.link_shared_inductor()  # the shared entries, read-only, beside this child's own
        bench.precompile_baselines(
            ctx["family"], job["bench_shapes"], job["bench_dtype"], job["param_specs"], job.get("cached_baselines")
        )
    finally:
        counter.rewrap()


def _precompile_only(job: dict[str, Any], results: dict[str, Any]) -> None:
    """A job of its own (`precompile_beside`): the torch.compile baselines compiled while another
    child runs the candidate's correctness cases. No candidate is loaded here."""
    import torch

    import gpuyantra.verifier.bench as bench

    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    if job["device"] == "cuda":
        bench.float32_as_float32()  # as in the candidate's child: the compilers' caches key on it
    results["stage"] = "precompile"
    with _timed(results["timings"], "precompile"):
        compiler_cache.link_shared_inductor()
        bench.precompile_baselines(
            _family(job),
            job["bench_shapes"],
            job["bench_dtype"],
            job["param_specs"],
            job.get("cached_baselines"),
            device=job["device"],
        )
    results["stage"] = "done"
    if job.get("marker"):  # the word, now: not after this process's teardown (its CUDA context's)
        # Best effort: the marker lies in the candidate's sandbox folder, which this child's own
        # isolation may not let it write; the parent writes it once this child's results are in.
        with contextlib.suppress(OSError):
            write_whole(Path(job["marker"]), "ok")


def _compiled_beside(job: dict[str, Any], timings: dict[str, float]) -> bool:
    """Whether another child compiled the baselines (`precompile_beside`), waiting for the parent's
    word at most `max_wait_s` (`child_precompile_wait`); False when none was asked to, when it
    failed, or when no word came in time. Either way this child compiles them next, from the caches
    that child filled where it did."""
    beside = job.get("precompile_beside")
    if not beside:
        return False
    marker = Path(beside["marker"])
    deadline = time.perf_counter() + float(beside["max_wait_s"])
    with _timed(timings, "precompile_wait"):
        while time.perf_counter() < deadline:
            try:
                word = marker.read_text().strip()
            except OSError:
                word = ""
            if word:
                return word == "ok"
            time.sleep(BESIDE_POLL_SECONDS)
    return False


def _benchmark(job: dict[str, Any], ctx: dict[str, Any], results: dict[str, Any]) -> bool:
    """Time every bench shape (the caller holds the GPU alone: timing and quiet locks); False when the
    candidate's kernel failed."""
    import gpuyantra.verifier.bench as bench
    from gpuyantra.verifier.baselines import shape_key

    timings = results["timings"]
    counter = ctx["counter"]
    counter.unwrap()
    try:
        with _timed(timings, "benchmark"):
            for shape in job["bench_shapes"]:
                cached = (job.get("cached_baselines") or {}).get(shape_key(shape))
                started = time.perf_counter()
                row = bench.bench_shape(
                    ctx["family"], ctx["entry"], shape, job["bench_dtype"], job["param_specs"], cached
                )
                # All of the shape (input sets, resets, cost besides the timed parts in `seconds`).
                row.setdefault("seconds", {})["total"] = round(time.perf_counter() - started, 3)
                results["bench"].append(row)
                if row.get("kernel_us") is None:
                    return False
    finally:
        counter.rewrap()
    return True


@contextlib.contextmanager
def _alone(lock_path: str | None, timings: dict[str, float], timing_wait: str, quiet_wait: str):
    """The GPU alone for the block: the timing lock (`lock_path`; a pending served-speed check goes
    first), then the quiet lock exclusive (other verifications' GPU work ends, none starts). The
    waits are added to `timings[timing_wait]` and `timings[quiet_wait]`. No lock: nothing to wait for."""
    if not lock_path:
        yield
        return
    from pathlib import Path

    from gpuyantra.verifier.bench import note_timed_elsewhere
    from gpuyantra.verifier.gpu_locks import time_alone

    with time_alone(Path(lock_path)) as waits:
        timings[timing_wait] = round(timings.get(timing_wait, 0.0) + waits["timing"], 3)
        timings[quiet_wait] = round(timings.get(quiet_wait, 0.0) + waits["quiet"], 3)
        note_timed_elsewhere(waits["last_timed_at"])
        yield


@contextlib.contextmanager
def _shared(lock_path: str | None, timings: dict[str, float], wait: str):
    """GPU work that is not timing: the quiet lock beside `lock_path` shared for the block (it waits
    while anything is timed or about to be, and holds off timing until it ends); the wait in
    `timings[wait]`. No lock: nothing to wait for."""
    if not lock_path:
        yield
        return
    from pathlib import Path

    from gpuyantra.verifier.gpu_locks import share_gpu

    with share_gpu(Path(lock_path)) as waited:
        timings[wait] = waited
        yield


@contextlib.contextmanager
def _timed(timings: dict[str, float], name: str, clock: Callable[[], float] = time.perf_counter, add: bool = False):
    """`timings[name]`: the block's seconds by `clock` (wall time; `time.process_time` for the process's
    CPU, which against the wall says what it waited), or, with `add`, added to it unrounded (a part
    spent in many pieces, rounded with the rest when the results are written)."""
    started = clock()
    try:
        yield
    finally:
        seconds = clock() - started
        timings[name] = timings.get(name, 0.0) + seconds if add else round(seconds, 3)


def _rest(timings: dict[str, float], total: float, parts: tuple[str, ...]) -> float:
    """The seconds of `total` that none of its named `parts` accounts for."""
    return round(max(total - sum(timings.get(p, 0.0) for p in parts), 0.0), 3)


def preload(device: str) -> dict[str, float]:
    """What every child needs before any GPU work, whatever its job: the harness's imports and, on
    CUDA, torch's compiler modules and Triton's cache key. A fork server (`fork_server`) does it once
    and forks children that have it. Returns seconds per part (`warm_*`)."""
    timings: dict[str, float] = {}
    with _timed(timings, "warm_imports"):
        import torch  # noqa: F401
        import triton  # noqa: F401
        from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401 - the host-op recorder's base

        import gpuyantra.candidate  # noqa: F401
        import gpuyantra.verifier.bench as bench
        import gpuyantra.verifier.cases  # noqa: F401
        from gpuyantra.ops import all_ops

        all_ops()
    if device != "cuda":
        from gpuyantra.interpreter_speed import install

        install()  # reductions with a kernel's own combine as a tree; the language patched once per launch
        return timings
    with _timed(timings, "warm_compile_modules"):
        # float32_as_float32's torch.use_deterministic_algorithms imports torch._inductor, and with it
        # torch._dynamo (which the benchmark resets): seconds on a GPU host, that the job's setup paid.
        bench.float32_as_float32()
        import torch._dynamo  # noqa: F401 - imported above already where torch still does so
    with _timed(timings, "warm_triton_key"), contextlib.suppress(Exception):  # a head start only
        # A process's first Triton launch hashes Triton's own library (half a gigabyte: about a
        # second); the hash is kept for the process (and its forks).
        try:
            from triton.runtime.cache import triton_key
        except ImportError:  # where older Triton keeps it
            from triton.compiler.compiler import triton_key
        triton_key()
    return timings


def _job_waiting() -> bool:
    """Whether the parent has written the job (or closed stdin): a spare is wanted now."""
    import select

    return bool(select.select([sys.stdin], [], [], 0)[0])


def _warm_up(device: str, gpu_lock: str | None = None) -> dict[str, float]:
    """Everything the harness needs that does not depend on the job, done before the job is read: a
    fresh child does it while the parent checks the contract, a warm spare before the job exists
    (its GPU part shares the GPU through the locks beside `gpu_lock`, the timing lock: never while
    anything is timed). A child forked by a fork server finds `preload` done.
    Returns seconds per part (`warm_*`)."""
    timings = preload(device)
    if device != "cuda":
        return timings
    import triton

    if gpu_lock:  # a spare: one at a time, and each in a gap of others' GPU work
        from gpuyantra.verifier.gpu_locks import wait_for_idle, warming_up

        with warming_up(Path(gpu_lock), needed=_job_waiting) as queued:
            timings["warm_turn_wait"] = queued
            # In its turn, so another spare's warm-up is not the work it waits out: six spares queued
            # behind one gap each slipped their 0.3 s between the timing turns of the next six. The
            # longest wait counts from the spare's start, queueing included: on a GPU that is never
            # quiet, eight spares would otherwise take 5 s each, one after another.
            timings["warm_idle_wait"] = wait_for_idle(
                Path(gpu_lock), SPARE_IDLE_S, max(SPARE_IDLE_MAX_WAIT_S - queued, 0.0), needed=_job_waiting
            )
            _create_cuda_context(gpu_lock, timings)
    else:
        _create_cuda_context(None, timings)
    with _timed(timings, "warm_triton"), contextlib.suppress(Exception):  # a head start only: never fatal
        # The first launch also loads Triton's CUDA driver helpers; the first case paid for them.
        triton.runtime.driver.active.get_current_device()
    return timings


def _create_cuda_context(gpu_lock: str | None, timings: dict[str, float]) -> None:
    import torch

    with _shared(gpu_lock, timings, "warm_lock_wait"), _timed(timings, "warm_cuda"):
        torch.cuda.init()
        # torch.cuda.init() creates no context: the first allocation and kernel do (and load the
        # generator's kernels every case uses).
        generator = torch.Generator(device="cuda").manual_seed(0)
        torch.randn(1024, generator=generator, device="cuda").add_(1.0)
        torch.cuda.synchronize()


# The top-level parts of a job, in order; what they leave is `other`.
JOB_PARTS = (
    "setup",
    "correctness_lock_wait",
    "correctness",
    "output_drain",
    "precompile",
    "timing_lock_wait",
    "quiet_lock_wait",
    "benchmark",
    "recheck",
    "recheck_drain",
    "save_outputs",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuyantra.verifier.child")
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--cpu-seconds", type=int, default=0)
    parser.add_argument("--address-space", type=int, default=0)
    parser.add_argument("--file-size", type=int, default=0)
    parser.add_argument("--gpu-lock", default=None)
    parser.add_argument("--notify-fd", type=int, default=-1, help="a pipe to write a byte to after each chunk")
    parser.add_argument("--isolation", default=None, help="the parent's isolation policy (isolation.policy), JSON")
    args = parser.parse_args(argv)
    _apply_limits(args.cpu_seconds, args.address_space, args.file_size)
    network_isolated = _isolate_network(args.device)
    # Before any candidate code can exist here, and before the warm-up starts threads of its own.
    held = isolation.apply(json.loads(args.isolation)) if args.isolation else {}
    warm = _warm_up(args.device, args.gpu_lock)
    ready_at = time.time()
    raw = sys.stdin.read()
    if not raw.strip():
        return 0  # the parent rejected the candidate before running it
    job_read_at = time.time()
    started = time.perf_counter()
    job = json.loads(raw)
    results: dict[str, Any] = {
        "network_isolated": network_isolated,
        "isolation": {**held, "network": network_isolated},
        "checks": [],
        "bench": [],
        "stage": "start",
        "ready_at": ready_at,  # started and waiting for a job (a spare: long before it got one)
        "job_read_at": job_read_at,  # the parent's `sandbox_child_start` ends here
        "timings": {},
        "warm_timings": warm,
    }
    timings = results["timings"]
    cuda = args.device == "cuda"
    sink = OutputSink(
        job["outputs_dir"],
        job["output_budget"],
        chunk_per_group=cuda,
        cuda_ipc=cuda,
        notify_fd=args.notify_fd,
        group_chunk_bytes=GROUP_CHUNK_BYTES,
    )
    try:
        execute(job, results, sink)
    except BaseException as exc:  # noqa: BLE001 - record what happened; the parent decides
        results["harness_error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        try:
            with _timed(timings, "save_outputs"):
                sink.close()  # with CUDA IPC: until the parent has copied every clone
        except BaseException as exc:  # noqa: BLE001
            results["harness_error"] = f"saving outputs failed: {type(exc).__name__}: {exc}"[:2000]
        timings["outputs_copy"] = round(sink.copy_seconds, 3)
        timings["outputs_write"] = round(sink.write_seconds, 3)
        timings["outputs_wait"] = round(sink.wait_seconds, 3)
        timings.update({k: round(v, 3) for k, v in timings.items() if isinstance(v, float)})  # `add`ed sums
        timings["other"] = _rest(timings, time.perf_counter() - started, JOB_PARTS)
        # When the results were complete: the parent attributes the rest (the process's exit) to
        # `child_exit`.
        results["finished_at"] = time.time()
        write_whole(Path(job["results_path"]), json.dumps(results))
    if cuda and job.get("timing_lock"):
        # The context's teardown as this process ends is GPU work too: never beside a timing.
        from gpuyantra.verifier.gpu_locks import share_gpu_through_exit

        with contextlib.suppress(Exception):  # the results are written: ending comes first
            share_gpu_through_exit(Path(job["timing_lock"]))
    return 0


def _exit_now(code: int) -> None:
    """Leave without the interpreter's teardown (module cleanup, garbage collection of everything
    torch holds, atexit handlers): the results are written, and the parent waits for this process
    to be gone. A compile-worker pool torch.compile may have started is stopped first, so no
    process of ours outlives the child (the parent would count it as the candidate's)."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is not None:
        with contextlib.suppress(Exception):
            async_compile.shutdown_compile_workers()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
