# Over 600 lines: the verdict's layers 4 and 5 judge one child's observations with shared state.
"""Layers 4 and 5 in the parent: turn the child's raw observations into failures and numbers.

Values are judged here, never in the child: the parent rebuilds every case's inputs from its own
plan, computes the float64 reference, and compares every element of the outputs the child saved.
`CaseValues` does that for each call as its outputs arrive (while the child goes on), and keeps
only the findings; `judge` reads them with the child's records once the child is done.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpuyantra.verifier.cases import (
    TENSOR_KINDS,
    Case,
    expected_outputs,
    float32_reference,
    float64_reference,
    make_case,
    native_reference,
)
from gpuyantra.verifier.reference_cache import ReferenceCache, budget_bytes
from gpuyantra.verifier.sandbox import SandboxOutcome
from gpuyantra.verifier.verdict import Failure, speedups

OOM_MARKERS = ("can't allocate memory", "cannot allocate memory", "out of memory")
# A kernel may not beat bytes-moved / copy-bandwidth; this much slack absorbs timer noise.
FLOOR_SLACK = 0.8
# An honest kernel inherits the conditioning of the math on every case: a variance of rows far from
# zero (activation-like inputs) loses digits in any float32 computation, and so does a normalization
# after a GEMM whose outputs share a large common component (plain draws: the drawn weights' mean
# 0.3 times inputs in [0, 1) gives values near 1230 with a spread of 15 to 30 at K = 8192). It may
# err this many times the root-mean-square error, per row, of the module's math computed in float32
# on the same inputs (no output rounding, so well-conditioned rows add almost nothing, about 16
# float32 roundings, to the dtype's tolerance).
CONDITIONING_SLACK = 16.0
EAGER_SLACK = 2.0  # x eager's per-element error, for families that round in their dtype
# Outputs of a chunk held on the device until their counts are read in one wait, at most this much.
SETTLE_BYTES = 2**30


class _Collector:
    """One failure per (layer, rule): the first example and how many cases showed it."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, str], str] = {}
        self.count: dict[tuple[str, str], int] = {}
        # Groups of cases (phase, dtype, shape, layout, variant) whose plain cases (N(0, 1), live
        # scalars) already failed on values, with the rules they named: later failures there are the
        # same bug (a tile cap met by a wide row's offset inputs too), not a class of their own.
        self.plain_failed: dict[tuple[Any, ...], tuple[str, str]] = {}

    def add(self, layer: str, rule: str, message: str) -> None:
        key = (layer, rule)
        self.first.setdefault(key, message)
        self.count[key] = self.count.get(key, 0) + 1

    def failures(self, total: int) -> list[Failure]:
        out = []
        for (layer, rule), message in self.first.items():
            n = self.count[(layer, rule)]
            suffix = f" [{n} of {total} checked calls]" if total > 1 and layer == "correctness" else ""
            out.append(Failure(layer, rule, message + suffix))
        return out


class References:
    """Inputs, expected output types and float64 references per case, rebuilt here from the plan.

    Expected dtypes and shapes are computed once per (dtype, shape) group. They are computed as the
    child's outputs arrive (`OutputValues`): on CUDA one group of calls at a time while the child runs
    the next (the work is the GPU's); on CPU the child's chunks go by size, so a CPU plan's outputs
    mostly arrive at its end (judging beside the interpreter slowed a 2-core worker more than it saved).
    """

    def __init__(self, family: Any, param_specs: Sequence[dict[str, Any]], device: str = "cpu"):
        self.family = family
        self.param_specs = param_specs
        # Where references are computed and outputs compared: the GPU when the verdict is for one
        # (float64 references of 12M-element cases take seconds each on the host). Inputs are always
        # drawn on the CPU generator, exactly as the child drew them.
        self.device = device
        self._expected: dict[tuple[str, tuple[int, ...]], tuple[bool, list]] = {}
        self._specs_key = json.dumps(param_specs, sort_keys=True, default=repr)  # a part of every case's key

    def get(self, case: Case) -> tuple[Any, Any, list[torch.Tensor]]:
        activations, params = make_case(self.family, case, self.param_specs, self.device)
        return activations, params, float64_reference(self.family, activations, params)

    def float32(self, activations: Any, params: Any) -> list[torch.Tensor] | None:
        """The module's math in float32 on these inputs, on every case (plain draws too: a GEMM then
        a normalization is ill-conditioned on them); None where the device has no kernel for it."""
        return float32_reference(self.family, activations, params)

    def native(self, activations: Any, params: Any) -> list[torch.Tensor] | None:
        """The module's math as eager runs it on 16-bit inputs (in their own dtype) for a family that
        `rounds_in_dtype`, else None: a kernel rounding after each op as eager does is then judged
        with that computation's error as allowance too, not only float32's."""
        if not getattr(self.family, "rounds_in_dtype", False):
            return None
        if not any(isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) for a in activations):
            return None
        return native_reference(self.family, activations, params)

    def error_bound(self, activations: Any, params: Any, dtype: torch.dtype) -> torch.Tensor | None:
        """The family's per-element allowance for an honest accumulation (linear), or None."""
        hook = getattr(self.family, "error_bound", None)
        return hook(activations, params, dtype) if hook is not None else None

    def expected(self, case: Case, activations: Any, params: Any) -> tuple[bool, list]:
        key = (case.dtype, case.shape)
        if key not in self._expected:
            self._expected[key] = expected_outputs(self.family, activations, params)
        return self._expected[key]

    def judged(self, case: Case) -> CaseReference:
        """The case's references and allowances: kept per process (`reference_cache`), since they
        depend on the op, the case and the parameters' specs alone, never on the candidate."""
        device = torch.device(self.device)
        plan = (_Identity(self.family), str(device), self._specs_key)
        key = (
            case.dtype,
            case.shape,
            case.seed,
            case.scale,
            case.dist,
            case.draw_scalars,
            case.stress,
            case.layout,
            case.variant,
            case.live_layout,
        )
        return _reference_cache(device.type).get(plan, key, lambda: self._compute_judged(case))

    def _compute_judged(self, case: Case) -> CaseReference:
        activations, params, reference = self.get(case)
        is_tuple, expected = self.expected(case, activations, params)
        float32_ref = self.float32(activations, params)
        native_ref = self.native(activations, params)
        outputs = []
        for index, (dtype, _shape) in enumerate(expected):
            if index >= len(reference):
                break
            slack = _larger(
                _conditioning_slack(float32_ref[index], reference[index]) if float32_ref is not None else None,
                _eager_slack(native_ref[index], reference[index]) if native_ref is not None else None,
            )
            bound = self.error_bound(activations, params, dtype) if index == 0 else None
            outputs.append(OutputAllowance.of(reference[index], dtype, slack, bound))
        judged = CaseReference(
            _drawn_scalars(case, params, self.param_specs), is_tuple, tuple(expected), tuple(outputs)
        )
        if torch.device(self.device).type == "cuda":
            # Judgings on other streams read it once it is kept: it must be complete by then.
            torch.cuda.current_stream().synchronize()
        return judged


@dataclass(frozen=True)
class OutputAllowance:
    """One output's float64 reference and, per element, what an honest kernel may add to the
    family's tolerance around it; computed without the candidate's output."""

    want: torch.Tensor
    representable: torch.Tensor  # where the output dtype can hold the true value: judged there only
    extra: torch.Tensor | None  # conditioning or eager slack plus the accumulation bound, if any
    slack: bool
    bound: bool
    # Where the float64 reference is NaN (a softmax row masked whole): the output must be NaN there
    # too, as the module's is. None where the reference has no NaN.
    nan_where: torch.Tensor | None = None

    @classmethod
    def of(
        cls,
        want: torch.Tensor,
        dtype: torch.dtype,
        slack: torch.Tensor | None = None,
        bound: torch.Tensor | None = None,
    ) -> OutputAllowance:
        if not want.is_floating_point():  # indices, counts, masks: exact in float64 (to 2^53), so the
            want = want.to(torch.float64)  # tolerance arithmetic below works on them as on values
        # Elements whose true value the output dtype cannot hold (past its largest finite value) are
        # not judged: an honest kernel overflows there exactly as the module does.
        representable = _finite(want.to(dtype)) if dtype != torch.float64 else _finite(want)
        extra = slack
        if bound is not None:  # the family's per-element accumulation allowance (linear: float32 over K)
            bound = bound.to(device=want.device, dtype=want.dtype)
            extra = bound if extra is None else extra + bound
        nan = torch.isnan(want) if want.is_floating_point() else None
        nan_where = nan if nan is not None and bool(nan.any()) else None
        return cls(want, representable, extra, slack is not None, bound is not None, nan_where)

    def nbytes(self) -> int:
        tensors = (self.want, self.representable, self.extra, self.nan_where)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@dataclass(frozen=True)
class CaseReference:
    """What a case's outputs are judged against (`OutputAllowance` each), and how it is described."""

    drawn: str  # the bound scalars the case drew, for messages
    is_tuple: bool
    expected: tuple[tuple[torch.dtype, tuple[int, ...]], ...]  # each output's dtype and shape
    outputs: tuple[OutputAllowance, ...]

    def nbytes(self) -> int:
        return sum(o.nbytes() for o in self.outputs)


class _Identity:
    """A key part equal only to the very same object (a family; a test's family of the same name
    is another), which it keeps alive so its id is never another's."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.obj is self.obj


_CACHES: dict[str, ReferenceCache[CaseReference]] = {}
_CACHES_LOCK = threading.Lock()


def _reference_cache(device_type: str) -> ReferenceCache[CaseReference]:
    with _CACHES_LOCK:
        if device_type not in _CACHES:
            _CACHES[device_type] = ReferenceCache(budget_bytes(device_type, _device_memory(device_type)))
        return _CACHES[device_type]


def _device_memory(device_type: str) -> int | None:
    """The judging GPU's total memory (it is in use already: references are computed on it)."""
    if device_type != "cuda":
        return None
    import torch

    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


@dataclass
class Judgement:
    failures: list[Failure] = field(default_factory=list)
    checks: int = 0
    bench: list[dict[str, Any]] = field(default_factory=list)
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    kernel_us: float | None = None
    eager_us: float | None = None
    compile_us: float | None = None
    compile_ro_us: float | None = None
    floor_us: float | None = None
    network_isolated: bool | None = None


def sandbox_failures(outcome: SandboxOutcome, timeout: float, memory_limit: int) -> list[Failure]:
    """Why the child produced no trustworthy results, if it did not."""
    if outcome.timed_out:
        return [
            Failure("sandbox", "timeout", f"no verdict within {timeout:g} s wall clock; the process group was killed")
        ]
    if outcome.memory_exceeded:
        return [
            Failure(
                "sandbox",
                "memory-limit",
                f"resident memory reached {outcome.peak_rss / 2**20:.0f} MiB "
                f"(limit {memory_limit / 2**20:.0f} MiB); the process group was killed",
            )
        ]
    failures = []
    rc = outcome.returncode
    if outcome.leftover:
        failures.append(
            Failure(
                "sandbox",
                "forked-process",
                f"{len(outcome.leftover)} process(es) of the candidate outlived it and were killed",
            )
        )
    if rc is not None and rc < 0:
        sig = -rc
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        if sig == signal.SIGXCPU:
            failures.append(Failure("sandbox", "cpu-limit", "CPU-time limit exceeded (SIGXCPU)"))
        elif sig == signal.SIGXFSZ:
            failures.append(Failure("sandbox", "crash", "file-size limit exceeded (SIGXFSZ)"))
        else:
            failures.append(Failure("sandbox", "crash", f"the child was killed by {name}" + _tail(outcome)))
        return failures
    if outcome.results is None:
        if rc == 0:
            failures.append(
                Failure(
                    "sandbox",
                    "early-exit",
                    "the process exited before the harness wrote its results; anything it printed is ignored",
                )
            )
        else:
            text = _tail(outcome)
            rule = (
                "memory-limit"
                if "MemoryError" in text or "alloc" in text.lower() and "memory" in text.lower()
                else "crash"
            )
            failures.append(Failure("sandbox", rule, f"the child exited with code {rc} without results" + text))
    return failures


def _tail(outcome: SandboxOutcome) -> str:
    lines = [line for line in outcome.stderr_tail.splitlines() if line.strip()][-3:]
    return (": " + " | ".join(lines))[:600] if lines else ""


@dataclass(frozen=True)
class OutputFinding:
    """One output judged against the reference. `rule` is set for a structural failure (missing,
    dtype, shape: the call's other outputs are not judged); otherwise `nonfinite` says which of the
    case's value rules applies (NaN/Inf where the reference is finite, or values out of tolerance)."""

    message: str
    rule: str | None = None
    nonfinite: bool = False


@dataclass(frozen=True)
class CaseValues:
    """What one call's outputs showed against the reference, without the tensors."""

    where: str  # the case, with the bound scalars it drew
    is_tuple: bool  # the reference returns a tuple
    expected: int  # outputs of the reference
    findings: tuple[OutputFinding, ...]


# Judging streams (CUDA): each judging thread of a worker queues its work on a stream of its own.
# On the one default stream, six verifications judging at once queued every kernel behind the
# others' (and each wait for the device waited for all of them): their judging took 6-12x one's.
# A stream goes back to this pool when the judging ends, so there are never more streams (nor
# blocks cached for them by the allocator) than verifications judging at once.
_FREE_STREAMS: dict[torch.device, list[Any]] = {}
_STREAMS_LOCK = threading.Lock()


@contextlib.contextmanager
def judging_stream(device: str | torch.device) -> Iterator[None]:
    """Inside: the current CUDA stream is one of the judging streams, this thread's alone until the
    block ends (on the CPU: nothing changes). Its work runs after what the caller's stream had queued
    (outputs still being copied there: `sandbox.OutputReader`), with no wait on the host."""
    where = torch.device(device)
    if where.type != "cuda":
        yield
        return
    if where.index is None:
        where = torch.device("cuda", torch.cuda.current_device())
    with _STREAMS_LOCK:
        free = _FREE_STREAMS.setdefault(where, [])
        stream = free.pop() if free else torch.cuda.Stream(where)
    stream.wait_stream(torch.cuda.current_stream(where))
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        with _STREAMS_LOCK:
            free.append(stream)


def case_values(case: Case, outs: Mapping[int, Any], family: Any, references: References) -> CaseValues:
    """Judge one call's saved outputs (index -> tensor) against the float64 reference of its inputs."""
    return settle([prepare_case(case, outs, family, references)])[0]


@dataclass
class _Comparison:
    """One output compared on the device, its counts of violations not read back yet."""

    index: int
    got: torch.Tensor
    allowance: OutputAllowance
    tol: tuple[float, float]
    counts: torch.Tensor  # (NaN/Inf where the reference is finite, values out of tolerance)


@dataclass
class PendingCase:
    """A call's findings in output order: settled ones, and comparisons whose counts are queued."""

    where: str
    is_tuple: bool
    expected: int
    slots: list[OutputFinding | _Comparison]

    def nbytes(self) -> int:
        return sum(s.got.numel() * s.got.element_size() for s in self.slots if isinstance(s, _Comparison))


def prepare_case(case: Case, outs: Mapping[int, Any], family: Any, references: References) -> PendingCase:
    """Check each output's type, dtype and shape, and queue its comparison on the device (no wait)."""
    judged = references.judged(case)
    where = _where(case) + judged.drawn
    slots: list[OutputFinding | _Comparison] = []
    for index, (dtype, shape) in enumerate(judged.expected):
        got = outs.get(index)
        if not isinstance(got, torch.Tensor):
            missing = f"output {index} missing from the harness's record on {where}"
            slots.append(OutputFinding(missing, "output-type"))
            break
        if got.dtype != dtype:
            slots.append(
                OutputFinding(
                    f"output {index} is {str(got.dtype).replace('torch.', '')}, "
                    f"expected {str(dtype).replace('torch.', '')} on {where}",
                    "output-dtype",
                )
            )
            break
        if tuple(got.shape) != tuple(shape):
            slots.append(
                OutputFinding(
                    f"output {index} has shape {list(got.shape)}, expected {list(shape)} on {where}", "output-shape"
                )
            )
            break
        allowance = judged.outputs[index]
        tol = family.tolerance(dtype)
        # Not blocking: a copy from (pageable) host memory returns once the driver has staged the
        # bytes, without first waiting for the work queued before it; `settle` waits once.
        got = got.to(allowance.want.device, non_blocking=True)
        slots.append(_Comparison(index, got, allowance, tol, violation_counts(got, allowance, tol)))
    return PendingCase(where, judged.is_tuple, len(judged.expected), slots)


def queued_counts(pending: Sequence[PendingCase]) -> torch.Tensor | None:
    """Every queued comparison's counts in one tensor, on CUDA copied to (pinned) host memory without
    waiting: once the stream's work is complete it is read with no further trip to the device (a
    trip is a turn among the contexts sharing the GPU). None where nothing was compared."""
    counts = _stacked_counts(pending)
    return counts.to("cpu", non_blocking=True) if counts is not None and counts.is_cuda else counts


def _stacked_counts(pending: Sequence[PendingCase]) -> torch.Tensor | None:
    """The queued comparisons' counts stacked where they are (None where nothing was compared)."""
    counts = [s.counts for p in pending for s in p.slots if isinstance(s, _Comparison)]
    return torch.stack(counts) if counts else None


def settle(pending: Sequence[PendingCase], counts: torch.Tensor | None = None) -> list[CaseValues]:
    """Read every queued comparison's counts in one wait for the device (or `counts`, from
    `queued_counts` once its stream's work is complete); an output with violations is compared again
    for its message (the same computation, kept only for failing outputs)."""
    comparisons = [s for p in pending for s in p.slots if isinstance(s, _Comparison)]
    if counts is None:
        counts = _stacked_counts(pending)
    rows: list[list[int]] = counts.tolist() if counts is not None else []
    failing = {id(c) for c, (nonfinite, wrong) in zip(comparisons, rows) if nonfinite or wrong}
    values = []
    for p in pending:
        findings = []
        for slot in p.slots:
            if isinstance(slot, OutputFinding):
                findings.append(slot)
            elif id(slot) in failing:
                finding = compare_judged(slot.got, slot.allowance, slot.tol, slot.index, p.where)
                if finding is not None:
                    findings.append(finding)
        values.append(CaseValues(p.where, p.is_tuple, p.expected, tuple(findings)))
    return values


class OutputValues:
    """`CaseValues` per call, filled chunk by chunk as the child's outputs arrive (`consume`, on the
    sandbox's reader thread), so no more than one chunk of outputs is ever held here. On CUDA each
    judging runs on a stream of its own (`judging_stream`)."""

    def __init__(self, family: Any, cases: Sequence[Case], references: References) -> None:
        self.family = family
        self.references = references
        self.cases = {c.id: c for c in cases}
        self.values: dict[int, CaseValues] = {}
        self.settles = 0
        self.wait_seconds = 0.0  # waiting for the device to finish the queued comparisons

    def consume(self, chunk: Mapping[str, Any]) -> None:
        """Judge the calls of one chunk ({"case_id:index": tensor}); a call's first record counts."""
        by_case: dict[int, dict[int, Any]] = {}
        for key, value in chunk.items():
            call, _, index = str(key).partition(":")
            if call.isdigit() and index.isdigit():
                by_case.setdefault(int(call), {})[int(index)] = value
        with judging_stream(self.references.device):
            # One wait for the device per chunk, not per output: on a GPU shared with the children
            # (contexts taking turns), each wait was a turn of theirs.
            pending: list[tuple[int, PendingCase]] = []
            held = 0  # bytes of outputs the pending comparisons keep on the device
            for case_id, outs in by_case.items():
                case = self.cases.get(case_id)
                if case is not None and case_id not in self.values:
                    pending.append((case_id, prepare_case(case, outs, self.family, self.references)))
                    held += pending[-1][1].nbytes()
                    if held > SETTLE_BYTES:
                        self._settle(pending)
                        held = 0
            self._settle(pending)

    def _settle(self, pending: list[tuple[int, PendingCase]]) -> None:
        cases = [p for _, p in pending]
        counts = queued_counts(cases)
        if torch.device(self.references.device).type == "cuda":
            # Timed apart from the rest: with several verifications judging while their children run
            # on the GPU, this wait is the contexts' turns, the rest is this process's own work.
            started = time.monotonic()
            torch.cuda.current_stream().synchronize()
            self.wait_seconds += time.monotonic() - started
        self.settles += 1
        for (case_id, _), values in zip(pending, settle(cases, counts)):
            self.values[case_id] = values
        pending.clear()

    def of(self, case: Case) -> CaseValues:
        """The call's values; a call whose outputs never arrived is judged on none (each missing)."""
        if case.id not in self.values:
            with judging_stream(self.references.device):
                self.values[case.id] = case_values(case, {}, self.family, self.references)
        return self.values[case.id]


def judge(
    outcome: SandboxOutcome,
    family: Any,
    cases: Sequence[Case],
    references: References,
    device: str,
    benchmark: bool,
    values: OutputValues | None = None,
) -> Judgement:
    """Failures and numbers from the child's records and the outputs' `values` (judged from
    `outcome.outputs` here when they were not judged as they arrived)."""
    results = outcome.results or {}
    j = Judgement(network_isolated=results.get("network_isolated"))
    collector = _Collector()
    error = results.get("error")
    if error:
        j.failures.append(Failure("sandbox", error.get("rule", "import-failed"), str(error.get("message", ""))))
        return j
    if results.get("harness_error"):
        j.failures.append(Failure("sandbox", "internal-error", f"the harness failed: {results['harness_error']}"))
    if results.get("output_limit"):
        # The one reason: the calls after it never ran, and its own outputs were never saved.
        j.failures.append(Failure("sandbox", "output-limit", str(results["output_limit"])))
        return j
    if values is None:
        values = OutputValues(family, cases, references)
        values.consume(outcome.outputs)
    by_id = {c.id: c for c in cases}
    records = results.get("checks") or []
    seen: set[int] = set()
    for record in records:
        case = by_id.get(record.get("id"))
        if case is None or case.id in seen:
            continue
        seen.add(case.id)
        _judge_record(record, case, values, references, collector)
    j.checks = len(seen)
    j.failures.extend(collector.failures(max(j.checks, 1)))
    if benchmark and device == "cuda" and not j.failures:
        _judge_bench(results, j)
    missing = [c for c in cases if c.id not in seen]
    if not j.failures and (missing or results.get("stage") != "done"):
        # The child may stop early only on a call that rejects by itself; anything else is suspect.
        j.failures.append(
            Failure(
                "sandbox",
                "early-exit",
                f"the harness stopped after {len(seen)} of {len(cases)} planned calls (stage {results.get('stage')!r})",
            )
        )
    return j


def _where(case: Case) -> str:
    return case.describe() + (" (after the timed runs)" if case.phase == "recheck" else "")


def _judge_record(
    record: dict[str, Any], case: Case, values: OutputValues, references: References, c: _Collector
) -> None:
    where = _where(case)
    if "error" in record:
        text = record["error"]
        if text.startswith("MemoryError") or any(m in text.lower() for m in OOM_MARKERS):
            c.add("sandbox", "memory-limit", f"entry ran out of memory on {where}: {text}")
        else:
            c.add("correctness", "entry-raised", f"entry raised on {where}: {text}")
        return
    if record.get("launches", 0) < 1:
        c.add("correctness", "no-kernel-launch", f"no kernel of the candidate's own launched on {where}")
    if record.get("host_ops"):
        c.add(
            "correctness",
            "host-torch-op",
            f"host-side torch ops outside kernel launches on {where}: {', '.join(record['host_ops'][:8])}",
        )
    if record.get("stream_changed"):
        c.add("correctness", "stream-changed", f"entry left a non-default current stream on {where}")
    if record.get("mutated"):
        c.add("correctness", "input-mutated", f"entry modified its {', '.join(record['mutated'])} on {where}")
    if record.get("aliases"):
        c.add(
            "correctness",
            "output-aliases-input",
            f"output {record['aliases'][0][0]} shares memory with the {record['aliases'][0][1]} on {where}",
        )
    if record.get("reused"):
        j, other = record["reused"][0]
        c.add(
            "correctness",
            "output-reused",
            f"output {j} on {where} shares memory with an output of "
            f"{'the same call' if other == case.id else 'an earlier call that is still alive'}",
        )
    judged = values.of(case)
    where = judged.where
    types = record.get("types") or []
    if judged.is_tuple:
        if record.get("container") is None or len(types) != judged.expected:
            c.add(
                "correctness",
                "output-type",
                f"entry returned {record.get('container') or types[:1]} with "
                f"{len(types)} item(s) on {where}; the reference returns a tuple of {judged.expected} tensors",
            )
            return
    elif record.get("container") is not None:
        c.add(
            "correctness",
            "output-type",
            f"entry returned a {record['container']} on {where}; the reference returns one tensor",
        )
        return
    bad_types = [t for t in types if t != "torch.Tensor"]
    if bad_types:
        c.add(
            "correctness", "output-type", f"entry returned {bad_types[0]} on {where}; a plain torch.Tensor is required"
        )
        return
    devices = record.get("devices") or []
    if any(d != record.get("input_device") for d in devices):
        c.add(
            "correctness", "output-device", f"output on {devices} but inputs on {record.get('input_device')} on {where}"
        )
        return
    group = (case.phase, case.dtype, case.shape, case.layout, case.variant)
    scalars = any(s.get("kind") not in TENSOR_KINDS for s in references.param_specs)
    plain = case.dist == "normal" and not (case.draw_scalars and scalars)
    for finding in judged.findings:
        if finding.rule is not None:
            c.add("correctness", finding.rule, finding.message)
            return
        # Rules are picked in record order: a group whose plain cases failed names later failures as they did.
        rules = c.plain_failed.get(group) or _value_rules(case, scalars)
        c.add("correctness", rules[0] if finding.nonfinite else rules[1], finding.message)
        if plain:
            c.plain_failed.setdefault(group, rules)


def _value_rules(case: Case, scalars: bool = True) -> tuple[str, str]:
    """(rule for NaN/Inf, rule for wrong values) on this case: the class of inputs that exposed it.
    The plan runs each group's plain cases first, so a kernel wrong on them gets the generic rules.
    Without bound scalars (linear) a drawn-scalar seed is just another seed."""
    if case.stress or case.klass == "large_tensor":
        return "shape-cap", "shape-cap"
    if case.layout != "contiguous":
        return "input-layout", "input-layout"
    if case.variant:
        return "optional-parameter", "optional-parameter"
    if case.dist != "normal":
        return "unstable-numerics", "unstable-numerics"
    if case.draw_scalars and scalars:
        return "hardcoded-constant", "hardcoded-constant"
    if case.klass:  # a width, row count or rank the grid's shapes never drew
        return "unseen-shape", "unseen-shape"
    return "nan-output", "wrong-values"


def _drawn_scalars(case: Case, params: dict[str, Any], specs: Sequence[dict[str, Any]]) -> str:
    """`, eps=3.1e-05 (live 1e-06)` for the scalars this case drew around their live values."""
    if not case.draw_scalars:
        return ""
    drawn = [
        f"{s['name']}={params[s['name']]:.3g} (live {s['value']:.3g})"
        for s in specs
        if s.get("kind") != "tensor" and isinstance(s.get("value"), float) and s["name"] in params
    ]
    return (", " + ", ".join(drawn)) if drawn else ""


def _larger(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    if a is None or b is None:
        return a if b is None else b
    return torch.maximum(a, b)


# The judge's elementwise work runs in as few tensor ops as it can, and reads back from the device
# once per output: every op is a pass over up to 12M elements and a launch whose host side (Python,
# the GIL, the driver) the verifications judging in one worker process at once share, and every read
# back is a wait for the device. Measured on an H200 (six at once): the host side, not the device,
# bounds their judging.


def _finite(t: torch.Tensor) -> torch.Tensor:
    """torch.isfinite in two kernels instead of four: |NaN| and |inf| are not below inf."""
    return t.abs() < float("inf") if t.is_floating_point() else torch.isfinite(t)


def _abs_diff(a: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|a - want| in float64; a floating `a` against a float64 `want` is widened exactly within the
    subtraction (no float64 copy of it)."""
    exact = a.is_floating_point() and want.dtype == torch.float64
    return torch.sub(a if exact else a.to(torch.float64), want).abs_()


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b, into `a` (a temporary of the caller's) where b has its dtype and broadcasts to its shape."""
    fits = b.dim() <= a.dim() and all(m in (1, n) for m, n in zip(reversed(b.shape), reversed(a.shape)))
    return a.add_(b) if fits and a.dtype == b.dtype else a + b


def _eager_slack(native_ref: torch.Tensor, want: torch.Tensor) -> torch.Tensor | None:
    """Twice eager's own error at each element (where finite): a kernel that rounds as eager does
    errs exactly where eager does (a cancellation after 16-bit products: tens of units on outliers)."""
    if native_ref.shape != want.shape:
        return None
    return _abs_diff(native_ref, want).nan_to_num_(0.0, 0.0, 0.0).mul_(EAGER_SLACK)


def _conditioning_slack(float32_ref: torch.Tensor | None, want: torch.Tensor) -> torch.Tensor | None:
    """CONDITIONING_SLACK x the per-row RMS error of the float32 computation (where finite)."""
    if float32_ref is None or float32_ref.shape != want.shape:
        return None
    err = _abs_diff(float32_ref, want).nan_to_num_(0.0, 0.0, 0.0)  # NaN and inf errors count as 0
    if err.dim() == 0:
        return err.mul_(CONDITIONING_SLACK)
    return err.square_().mean(dim=-1, keepdim=True).sqrt_().mul_(CONDITIONING_SLACK)


def compare_values(
    got: torch.Tensor,
    want: torch.Tensor,
    tol: tuple[float, float],
    index: int,
    where: str,
    slack: torch.Tensor | None = None,
    bound: torch.Tensor | None = None,
) -> OutputFinding | None:
    """None when every judged element is within tolerance; otherwise the first kind of failure
    (NaN/Inf where the reference is finite, then values out of tolerance)."""
    return compare_judged(got, OutputAllowance.of(want, got.dtype, slack, bound), tol, index, where)


def _violations(
    got: torch.Tensor, allowance: OutputAllowance, tol: tuple[float, float]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(NaN/Inf where the reference is finite, values out of tolerance, |got - want| judged): masks
    and errors, computed without waiting for the device."""
    atol, rtol = tol
    want, representable = allowance.want, allowance.representable
    bad_nonfinite = representable & ~_finite(got)
    allowed = want.abs().mul_(rtol).add_(atol)
    if allowance.extra is not None:
        allowed = _add(allowed, allowance.extra)
    err = torch.where(representable, _abs_diff(got, want), 0.0)
    wrong = (err <= allowed).logical_not_()
    if allowance.nan_where is not None:  # NaN exactly where the reference is NaN (a row masked whole)
        wrong = torch.where(allowance.nan_where.to(got.device), torch.isnan(got).logical_not_(), wrong)
    return bad_nonfinite, wrong, err


def violation_counts(got: torch.Tensor, allowance: OutputAllowance, tol: tuple[float, float]) -> torch.Tensor:
    """The two counts of `_violations` as one device tensor, not read back (on CUDA in one kernel
    where it applies: `judge_kernel`)."""
    if got.is_cuda:
        # Triton: imported where a GPU judges alone.
        from gpuyantra.verifier.judge_kernel import fused_applies, violation_counts_fused

        if fused_applies(got, allowance):
            return violation_counts_fused(got, allowance, tol)
    bad_nonfinite, wrong, _ = _violations(got, allowance, tol)
    return _counts(bad_nonfinite, wrong)


def _counts(bad_nonfinite: torch.Tensor, wrong: torch.Tensor) -> torch.Tensor:
    return torch.stack((bad_nonfinite.sum(), wrong.sum()))


def compare_judged(
    got: torch.Tensor, allowance: OutputAllowance, tol: tuple[float, float], index: int, where: str
) -> OutputFinding | None:
    """`compare_values` against a prepared allowance. Both kinds of failure are counted before the
    one wait for the device that reads them."""
    atol, rtol = tol
    want = allowance.want
    bad_nonfinite, wrong, err = _violations(got, allowance, tol)
    n_nonfinite, n_wrong = _counts(bad_nonfinite, wrong).tolist()
    if n_nonfinite:
        first = _index(bad_nonfinite)
        return OutputFinding(
            f"output {index}: {n_nonfinite} of {got.numel()} elements are NaN/Inf where the "
            f"reference is finite (unwritten, poisoned memory or overflow), first at {first}, on {where}",
            nonfinite=True,
        )
    if n_wrong:
        first = _index(wrong)
        extra = f" plus {CONDITIONING_SLACK:g}x float32's own error on such inputs" if allowance.slack else ""
        extra += " plus the float32-accumulation bound" if allowance.bound else ""
        return OutputFinding(
            f"output {index}: {n_wrong} of {got.numel()} elements outside atol={atol:g} "
            f"rtol={rtol:g}{extra} of the float64 reference (max abs err {float(err.max()):.3g}, first at "
            f"{first}: got {float(got[first]):.6g}, want {float(want[first]):.6g}) on {where}"
        )
    return None


def _compare(
    got: torch.Tensor,
    want: torch.Tensor,
    tol: tuple[float, float],
    index: int,
    where: str,
    c: _Collector,
    rules: tuple[str, str] = ("nan-output", "wrong-values"),
    slack: torch.Tensor | None = None,
    bound: torch.Tensor | None = None,
) -> bool:
    """True when every judged element is within tolerance; otherwise records one failure."""
    finding = compare_values(got, want, tol, index, where, slack, bound)
    if finding is None:
        return True
    c.add("correctness", rules[0] if finding.nonfinite else rules[1], finding.message)
    return False


def _index(mask: torch.Tensor) -> tuple[int, ...]:
    flat = int(torch.nonzero(mask.reshape(-1))[0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape)) if mask.dim() else ()


def _drop_implausible_baselines(row: dict[str, Any], floor: float) -> None:
    """A baseline timed below the physical floor did not do the work either (a timing glitch, a
    cached result): it leaves the speedups and stays in the row under `implausible_baselines`. On an
    H200 torch.compile of an elementwise op once timed at 1.8x copy bandwidth, and the candidate
    at copy bandwidth was judged 0.55x of it."""
    for key in ("eager_us", "compile_us", "compile_ro_us"):
        value = row.get(key)
        if value is not None and value < floor:
            row.setdefault("implausible_baselines", {})[key] = value
            row[key] = None


def _judge_bench(results: dict[str, Any], j: Judgement) -> None:
    rows = results.get("bench") or []
    j.bench = rows
    if not rows:
        return
    bandwidth = results.get("copy_bandwidth_gbs")
    for row in rows:
        kernel = row.get("kernel_us")
        if kernel is None:
            j.failures.append(
                Failure(
                    "benchmark",
                    "benchmark-failed",
                    f"timing shape {row.get('shape')} failed: {row.get('errors', {}).get('kernel', 'no time')}",
                )
            )
            return
        if bandwidth:
            row["floor_us"] = row.get("bytes", 0) / (bandwidth * 1e9) * 1e6
            plausible = FLOOR_SLACK * row["floor_us"]
            _drop_implausible_baselines(row, plausible)
            if kernel < plausible:
                j.failures.append(
                    Failure(
                        "benchmark",
                        "implausible-speed",
                        f"shape {row['shape']}: {kernel:.2f} us "
                        f"is below the physical floor {row['floor_us']:.2f} us ({row['bytes']} bytes "
                        f"at {bandwidth:.0f} GB/s copy bandwidth)",
                    )
                )
    first = rows[0]
    j.kernel_us, j.eager_us = first.get("kernel_us"), first.get("eager_us")
    j.compile_us, j.compile_ro_us, j.floor_us = (
        first.get("compile_us"),
        first.get("compile_ro_us"),
        first.get("floor_us"),
    )
    j.speedup_vs_eager, j.speedup_vs_compile = speedups(rows)
