"""Layer 5 measurements, run inside the sandbox child on CUDA only.

Median of many runs after warm-up; the L2 cache is flushed before every run; inputs rotate over
fresh sets; CUDA events on the default stream, which is synchronized before times are read. Times are
device times: each call's launches are queued before its start event runs (`time_cuda`), and the
host's issue time of the candidate and of eager is reported beside them (`*_launch_us`).
Baselines: the module's own computation in eager PyTorch (`OpFamily.eager`, else the family's
reference) and torch.compile of it, default and reduce-overhead, float32 products in float32 for
every side (`float32_as_float32`). The parent turns these numbers into speedups, the physical floor
check and the reward.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpuyantra.verifier.baselines import shape_key
from gpuyantra.verifier.cases import Case, make_case

N_INPUT_SETS = 4
BENCH_SETS_BYTES = 16 * 2**30  # inputs (and as much again for outputs) of the rotating sets, at most
L2_FLUSH_BYTES = 256 * 2**20
SPIN_UP_MS = 100.0  # keep the GPU busy first: clocks drop while it idles (e.g. during compilation)
# A GPU that finished timed work this recently has had no time to lower its clocks: no spin-up then
# (the second side of an interleaved round follows the first within milliseconds).
IDLE_BEFORE_SPIN_UP_S = 0.05
WARMUP_MS = 25.0
MAX_WARMUP = 50  # warm-up calls at most: clocks are up already (spin-up), caches warm in a few calls
REP_MS = 20.0  # per round
ROUNDS = 3  # candidate and baselines interleaved, median of the round medians
# A candidate timed alone (every baseline cached from an earlier verification) gets one round: there
# is nothing to interleave it with, and the repeats tripled each verification's turn on the GPU
# (H200, rms_norm at two shapes: 75 ms, one round 27 ms, the medians' spread the same). Baselines
# timed alone (torch.compile) keep every round: they are cached and every later verdict uses them.
SOLO_CANDIDATE_ROUNDS = 1
# A median of 100 flushed runs is steady to a fraction of a percent (three rounds: 300 per side).
# Each run costs a flush and a queued spin besides the kernel, and verifications on one GPU time
# one at a time: 200 runs per round made a short kernel's timing phase 0.8 s of a 2.9 s verdict.
MIN_REPS, MAX_REPS = 10, 100
# The GPU is kept busy before each timed call for AHEAD_FACTOR x the call's host issue time, plus a pad.
AHEAD_FACTOR, AHEAD_PAD_US, MAX_AHEAD_US = 2.0, 20.0, 5000.0
LAUNCH_SAMPLES = 5
FLUSH_SAMPLES = 5
CALIBRATION_CYCLES = 2_000_000
GRAPHS_IRRELEVANT_US = 1000.0  # past this eager time the reduce-overhead (CUDA graphs) baseline is skipped


def float32_as_float32() -> None:
    """Baselines compute float32 products in float32 (no TF32), PyTorch's own default for matmul.

    Why: a candidate is held to float32 accuracy (its float32 products are IEEE), and a TF32 matmul
    would itself fail that check (10-bit mantissa); timing the baselines in TF32 would compare the
    candidate with a computation the verifier rejects. 16-bit inputs are unaffected."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.use_deterministic_algorithms(False)


BANDWIDTH_RUNS = 20


def measure_copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), best of several runs, after a
    spin-up (`spin_up`): measured on an idle GPU (a worker's start) at the clocks it idles at, it read
    low enough that honest kernels looked faster than the floor (`implausible-speed`)."""
    n = 512 * 2**20
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    spin_up(dst)
    best = float("inf")
    for _ in range(BANDWIDTH_RUNS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / (best * 1e-3) / 1e9


def time_cuda(fn: Callable[[int], Any], flush: torch.Tensor, before: Callable[[], None] | None = None) -> float:
    """Median device microseconds of fn(i) over many runs, each after an L2 flush, inputs rotating.

    Device time, not host time: before each timed call the GPU is kept busy (`queue_ahead`) for
    longer than the call takes to issue, so its launches are all queued when the start event runs.
    A served model replays CUDA graphs, where launch overhead does not exist; without this, a
    microsecond kernel was timed as its Python launcher (a split-K GEMV at 48 us instead of 11).
    Host work the call waits on (a synchronize inside it) still counts: the GPU idles meanwhile."""
    if before is not None:
        inner = fn

        def fn(i: int) -> Any:  # untimed calls: `before` runs in the same place as in timed ones
            before()
            return inner(i)

    for i in range(3):
        fn(i % N_INPUT_SETS)
    torch.cuda.synchronize()
    if needs_spin_up():
        spin_up(flush)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(5):
        fn(i % N_INPUT_SETS)
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    # The flush before each timed call keeps the GPU busy too, for at least its own device time
    # after the host issued it: only what the call's issue needs beyond that is spun.
    ahead_us = max(0.0, min(MAX_AHEAD_US, AHEAD_FACTOR * launch_us(fn) + AHEAD_PAD_US) - flush_us(flush))
    warmup = min(MAX_WARMUP, max(1, int(WARMUP_MS / estimate_ms)))
    reps = min(MAX_REPS, max(MIN_REPS, int(REP_MS / estimate_ms)))
    for i in range(warmup):
        fn(i % N_INPUT_SETS)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    timed = inner if before is not None else fn
    for i in range(reps):
        flush.zero_()
        if before is not None:
            before()
        if ahead_us > 0:
            queue_ahead(ahead_us)
        starts[i].record()
        timed(i % N_INPUT_SETS)
        ends[i].record()
    torch.cuda.synchronize()
    _mark_busy()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def launch_us(fn: Callable[[int], Any]) -> float:
    """Median host microseconds to issue one call (its Python and its launches), the GPU queue empty."""
    samples = []
    for i in range(LAUNCH_SAMPLES):
        torch.cuda.synchronize()
        started = time.perf_counter()
        fn(i % N_INPUT_SETS)
        samples.append((time.perf_counter() - started) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


_flush_us: dict[int, float] = {}  # the fastest device time of one flush, per flush size, once per process


def flush_us(flush: torch.Tensor) -> float:
    """The shortest device time of one `flush.zero_()` over FLUSH_SAMPLES runs: a lower bound of how
    long the GPU stays busy with a flush once the host has issued it."""
    size = flush.numel() * flush.element_size()
    if size not in _flush_us:
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(FLUSH_SAMPLES)
        ]
        for start, end in events:
            start.record()
            flush.zero_()
            end.record()
        torch.cuda.synchronize()
        _flush_us[size] = min(start.elapsed_time(end) for start, end in events) * 1e3
    return _flush_us[size]


_cycles_per_us = 0.0  # the GPU's clock for torch.cuda._sleep, measured once per process


def queue_ahead(us: float) -> None:
    """Keep the GPU busy for about `us` microseconds (a spin kernel), without waiting on the host."""
    global _cycles_per_us
    if not _cycles_per_us:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        end.record()
        torch.cuda.synchronize()
        _cycles_per_us = CALIBRATION_CYCLES / max(start.elapsed_time(end) * 1e3, 1.0)
    torch.cuda._sleep(int(us * _cycles_per_us))


_last_busy = 0.0  # perf_counter when this process's GPU last finished timed work


def _mark_busy() -> None:
    global _last_busy
    _last_busy = time.perf_counter()


def note_timed_elsewhere(wall_time: float) -> None:
    """Timed work of another process on this GPU ended at `wall_time` (`time.time()` seconds): its
    clocks are as warm as after this process's own (`gpu_locks.stamp_timed`)."""
    global _last_busy
    _last_busy = max(_last_busy, time.perf_counter() - max(0.0, time.time() - wall_time))


def needs_spin_up() -> bool:
    """Has the GPU idled long enough since timed work (this process's or another's) for its clocks to drop?"""
    return time.perf_counter() - _last_busy > IDLE_BEFORE_SPIN_UP_S


def spin_up(flush: torch.Tensor) -> None:
    """Keep the GPU busy for SPIN_UP_MS, so it times at the clocks it runs at under load."""
    spin_until = time.perf_counter() + SPIN_UP_MS / 1e3
    while time.perf_counter() < spin_until:
        flush.zero_()
        torch.cuda.synchronize()


COMPILE_MODES = (("compile_us", "default"), ("compile_ro_us", "reduce-overhead"))


def graphs_irrelevant(mode: str, eager_us: Any) -> bool:
    """Whether the reduce-overhead (CUDA graphs) baseline is skipped at this eager time: graphs only
    take launch overhead (microseconds) away, nothing at milliseconds per call."""
    return mode == "reduce-overhead" and isinstance(eager_us, (int, float)) and eager_us >= GRAPHS_IRRELEVANT_US


def uncompiled_modes(kept: dict[str, Any] | None) -> list[str]:
    """The torch.compile modes a verification compiles at a shape whose kept baselines are `kept`
    (an earlier verification's, with the eager time this one has where it timed eager): those with no
    time kept and not skipped at that eager time. (A skipped mode keeps no time: it was compiled
    again by every verification.)"""
    done = kept or {}
    return [
        mode
        for key, mode in COMPILE_MODES
        if not isinstance(done.get(key), (int, float)) and not graphs_irrelevant(mode, done.get("eager_us"))
    ]


def precompile_baselines(
    family: Any,
    shapes: Sequence[Sequence[int]],
    dtype: str,
    param_specs: Sequence[dict[str, Any]],
    cached: dict[str, dict[str, float]] | None = None,
    device: str = "cuda",
) -> None:
    """Compile every torch.compile baseline not in `cached` once, before the timing lock is taken.

    Why: compiling takes seconds per shape and mode, and under the lock it made verifications wait
    for each other's compilers. Compiled here, in parallel with other verifications, the compile
    under the lock finds the compilers' on-disk caches (FX graph, Triton) warm. Nothing here is
    timed or kept; a baseline that fails to compile fails again under the lock and is left out there."""
    for shape in shapes:
        modes = uncompiled_modes((cached or {}).get(shape_key(shape)))
        if not modes:
            continue
        acts, params = make_case(family, Case(-1, "bench", dtype, tuple(shape), 1000, 1.0), param_specs, device)
        with torch.no_grad():
            for mode in modes:
                try:
                    torch.compile(_reference(family, "pre_" + mode.replace("-", "_")), mode=mode, dynamic=False)(
                        *acts, **params
                    )
                except Exception:  # noqa: BLE001, S112 - judged under the lock, where it is timed
                    continue
                finally:
                    torch._dynamo.reset()
        del acts, params
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


EAGER_KEYS = ("eager_us", "eager_launch_us")


def _reuse_cached(row: dict[str, Any], cached: dict[str, float] | None, keys: Sequence[str]) -> bool:
    """Copy `keys` from an earlier verification's baselines into `row` when all are there."""
    if not cached or not all(isinstance(cached.get(key), (int, float)) for key in keys):
        return False
    for key in keys:
        row[key] = float(cached[key])
        row.setdefault("cached", []).append(key)
    return True


def _reference(family: Any, tag: str) -> Callable[..., Any]:
    """The module's own computation (`eager`, not the upcast accuracy reference where they differ) as
    a code object of its own per `tag`, so two compiled wrappers never share a dynamo cache entry."""
    namespace: dict[str, Any] = {"_module_math": family.eager or family.reference}
    exec(f"def reference_{tag}(*acts, **params):\n    return _module_math(*acts, **params)\n", namespace)
    return namespace[f"reference_{tag}"]


def bench_shape(
    family: Any,
    entry: Callable[..., Any],
    shape: Sequence[int],
    dtype: str,
    param_specs: Sequence[dict[str, Any]],
    cached: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Time the candidate and eager (interleaved), then each torch.compile mode unless `cached` holds
    its time from an earlier verification of the same op, shape, dtype, device and versions."""
    first = make_case(family, Case(-1, "bench", dtype, tuple(shape), 1000, 1.0), param_specs, "cuda")
    # Rotating input sets keep L2 from serving repeats; past the budget (multi-GB KernelBench shapes,
    # far beyond L2 anyway) fewer sets keep the GPU's memory for the outputs and the baselines.
    per_set = sum(t.numel() * t.element_size() for t in first[0] if isinstance(t, torch.Tensor))
    n_sets = max(1, min(N_INPUT_SETS, BENCH_SETS_BYTES // max(1, 2 * per_set)))
    sets = [first] + [
        make_case(family, Case(-1, "bench", dtype, tuple(shape), 1000 + k, 1.0), param_specs, "cuda")
        for k in range(1, n_sets)
    ]
    sets += [sets[k % n_sets] for k in range(n_sets, N_INPUT_SETS)]  # indices stay 0..N_INPUT_SETS-1
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    row: dict[str, Any] = {"shape": list(shape), "dtype": dtype, "errors": {}}

    def rounds(timed: dict[str, tuple[Callable[[int], Any], Callable[[], None] | None]], flush: torch.Tensor) -> bool:
        """Interleaved rounds; medians into `row`. False when the candidate's kernel failed."""
        samples: dict[str, list[float]] = {key: [] for key in timed}
        for _ in range(SOLO_CANDIDATE_ROUNDS if list(timed) == ["kernel_us"] else ROUNDS):
            for key, (fn, before) in timed.items():
                error_key = "kernel" if key == "kernel_us" else key
                if error_key in row["errors"]:
                    continue
                try:
                    samples[key].append(time_cuda(fn, flush, before))
                except Exception as exc:  # noqa: BLE001 - the kernel: benchmark-failed; a baseline: left out
                    row["errors"][error_key] = f"{type(exc).__name__}: {exc}"[:1000]
                    samples[key] = []
                    if key == "kernel_us":
                        row[key] = None
                        return False
        for key in timed:
            row[key] = statistics.median(samples[key]) if samples[key] else None
        return row.get("kernel_us") is not None

    def on_set(fn: Callable[..., Any]) -> Callable[[int], Any]:
        """`fn` called on input set i."""
        return lambda i: fn(*sets[i][0], **sets[i][1])

    seconds: dict[str, float] = {}
    row["seconds"] = seconds
    started = time.perf_counter()
    with torch.no_grad():
        # Candidate and eager first, interleaved, before anything is compiled in this process (a
        # compiled reduce-overhead function alive in the process was seen to inflate eager timings).
        eager = _reference(family, "eager")
        timed: dict[str, tuple[Callable[[int], Any], Callable[[], None] | None]] = {
            "kernel_us": (lambda i: entry(*sets[i][0], **sets[i][1]), None)
        }
        # Eager does not depend on the candidate: timed once per (op, parameters, shape, dtype, device,
        # versions) and reused; verifications on one GPU take turns timing, each baseline timed again
        # would lengthen every other's wait.
        eager_cached = _reuse_cached(row, cached, EAGER_KEYS)
        if not eager_cached:
            timed["eager_us"] = (lambda i: eager(*sets[i][0], **sets[i][1]), None)
        if not rounds(timed, flush):
            return row
        # Host issue time beside the device time: what a caller without CUDA graphs also pays.
        row["kernel_launch_us"] = launch_us(lambda i: entry(*sets[i][0], **sets[i][1]))
        if not eager_cached:
            row["eager_launch_us"] = launch_us(lambda i: eager(*sets[i][0], **sets[i][1]))
        seconds["kernel_and_eager"] = round(time.perf_counter() - started, 3)
        compiling = bool(uncompiled_modes({**(cached or {}), "eager_us": row.get("eager_us")}))
        if compiling:  # dynamo's first reset in a process costs seconds (measured 2.5 s): only when used
            torch._dynamo.reset()
        for key, mode in COMPILE_MODES:
            if _reuse_cached(row, cached, (key,)):
                continue
            if graphs_irrelevant(mode, row.get("eager_us")):
                # CUDA graphs only take launch overhead (microseconds) away: at milliseconds per call
                # they cannot move the baseline, and recording them copies multi-GB inputs.
                row.setdefault("skipped", {})[key] = f"eager takes {row['eager_us']:.0f} us: launch overhead negligible"
                continue
            started = time.perf_counter()
            try:
                compiled = torch.compile(_reference(family, mode.replace("-", "_")), mode=mode, dynamic=False)
                step = getattr(torch.compiler, "cudagraph_mark_step_begin", None) if mode == "reduce-overhead" else None
                for i in range(3):  # compile and (for reduce-overhead) record the graphs before timing
                    if step is not None:
                        step()
                    compiled(*sets[i % N_INPUT_SETS][0], **sets[i % N_INPUT_SETS][1])
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a baseline that fails to compile is left out
                row[key] = None
                row["errors"][key] = f"{type(exc).__name__}: {exc}"[:1000]
                continue
            rounds({key: (on_set(compiled), step)}, flush)
            seconds[key.replace("_us", "")] = round(time.perf_counter() - started, 3)
            del compiled
        if compiling:
            torch._dynamo.reset()  # also drops CUDA-graph trees before the next shape's eager timings
    # Bytes at the shapes the timed calls really had (a linear's weight is most of them).
    case_params = {k: list(v.shape) if isinstance(v, torch.Tensor) else None for k, v in sets[0][1].items()}
    row["bytes"] = int(family.cost(tuple(shape), sets[0][0][0].dtype, case_params)[0])
    del flush
    torch.cuda.empty_cache()
    return row
