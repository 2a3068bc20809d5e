# Over 600 lines: one state machine (slots, queues, the step queued ahead) whose passes share its lock and slots.
"""The scheduler: one model thread, continuous batching over cache slots, admin operations between passes.

See `serving.engine` for the threading model and batching. The scheduler owns the requests, the
slots and the model thread; each forward pass it decides is a `serving.plan.StepPlan` that the
model runner (`serving.runner.ModelRunner`, which it is given, never inherits) executes.

Requests are admitted into free slots with batched prefill passes (within PREFILL_TOKEN_BUDGET),
then decode together; a pass during which a swapped kernel raised is rolled back and run again
(`_clean_pass`). Waiting requests are admitted fairly between clients (`share_between_clients`):
a client with fewer requests decoding goes first, so one client's burst (a flood of requests, one
request of n=128) queues behind itself, not in front of every other client.

Mixed steps: while rows decode, a request whose prompt is short joins with a mixed step instead of
a prefill pass of its own. Each prompt token becomes one more row of the decode step, at its own
position in the new request's cache row (`ModelRunner.mixed_rows`). Why: a decode step of the 1.5B
model reads every weight once and so does a short prefill; run one after the other, each arriving
request stalls every other stream by a whole pass (8 streams of 64 tokens whose requests arrive at
different steps decoded 3067 tokens/s on an H200, 4144 when they arrive together). Together the
weights are read once. `mixed_prompt_tokens` bounds the prompt tokens one step takes (by default 64
with captured CUDA graphs, else 0: off; `serving.engine.mixed_tokens`); longer prompts prefill alone.
When a step is queued ahead of the host (run-ahead), the mixed step is queued right behind it, its
decode rows fed on the device by that step and only the prompt rows from the host (`_join_ahead`):
the GPU goes from step to step and an arrival costs the decoding rows the mixed step's extra GPU time.
Otherwise (no step ahead, or a request that samples) the host feeds the mixed step, and queues the
next step before it hands out the tokens.
With captured graphs a mixed step is taken only while it pays: the GPU time it adds to a decode step
(measured after each capture, `GraphDecoder.mixed_extra_ms`) must be less than the recent prefill
passes that interrupted decoding took. Until one has been timed, arrivals prefill alone.
"""

from __future__ import annotations

import concurrent.futures
import logging
import statistics
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpuyantra.swap.engine import SwapEngine
from serving.graphs import GraphDecoder, PendingTokens
from serving.plan import StepPlan
from serving.request import EngineNotReady, GenRequest, RequestError, _AdminOp, _Slot
from serving.runner import ModelRunner
from serving.sampling import choose_tokens, greedy_request, token_logprobs

log = logging.getLogger("gpuyantra.serving")

# Tokens (rows x longest prompt, padding included) one batched prefill pass may hold.
PREFILL_TOKEN_BUDGET = 8192
LIVE_STEPS_KEPT = 65536  # served decode steps remembered for live speed measurements
GRAPH_STEPS_TIMED = 1024  # graph decode steps whose host cycle `decode_timing` reports


def share_between_clients(waiting: Iterable[GenRequest], decoding: Counter[str | None]) -> list[GenRequest]:
    """The waiting requests in the order that shares the slots between clients: a request ranks by
    how many requests of its client decode (`decoding`) or wait ahead of it; the lowest rank goes
    first, ties in arrival order. One client's own requests keep their order, and with one client
    nothing moves."""
    ahead: Counter[str | None] = Counter(decoding)
    ranked: list[tuple[int, int, GenRequest]] = []
    for arrival, request in enumerate(waiting):
        ranked.append((ahead[request.client], arrival, request))
        ahead[request.client] += 1
    ranked.sort(key=lambda entry: (entry[0], entry[1]))
    return [request for _, _, request in ranked]


@dataclass
class ServedTraffic:
    """What live traffic looked like lately: read by the profile (its probes, the served batches)
    and by live speed measurements, written by the scheduler as it serves."""

    prompt_lens: deque[int] = field(default_factory=lambda: deque(maxlen=64))
    batches: deque[int] = field(default_factory=lambda: deque(maxlen=256))
    # Served decode steps (end time, rows, active rows, seconds): served speed judged from live
    # traffic without pausing it.
    live_steps: deque[tuple[float, int, int, float]] = field(default_factory=lambda: deque(maxlen=LIVE_STEPS_KEPT))


class Scheduler:
    def __init__(
        self, runner: ModelRunner, swaps: SwapEngine, *, run_ahead: bool = True, mixed_prompt_tokens: int = 0
    ) -> None:
        self.runner = runner
        self.swaps = swaps
        self.observer = runner.observer
        self.max_batch = runner.max_batch
        self.cache = runner.cache
        self.slots: list[_Slot | None] = [None] * self.max_batch
        self._pending: deque[GenRequest] = deque()
        self._admin: deque[_AdminOp] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.ready = False
        self.started_at = time.time()
        self.traffic = ServedTraffic()
        # Graph decode runs one step ahead of the host when it can (`_decode_graphs`): the step
        # replayed, its tokens not read yet.
        self.run_ahead = run_ahead
        self._ahead: _Step | None = None
        # Graph steps queued ahead (`_decode_graphs`): the host's cycle from the previous step's
        # tokens to this one's, and how much of it the host waited for them (`decode_timing`).
        self._graph_cycles: deque[tuple[float, float]] = deque(maxlen=GRAPH_STEPS_TIMED)
        self._graph_tokens_at: float | None = None
        self.steps_queued_from_host = 0  # `_queue_next_from_host`
        self.mixed_prompt_tokens = mixed_prompt_tokens  # prompt tokens a mixed step may take (module doc)
        self.mixed_admissions = 0
        self._interrupting_prefill_ms: deque[float] = deque(maxlen=16)  # prefill passes while rows decoded
        self._interrupting_prefill_rows: deque[int] = deque(maxlen=16)  # the rows each of them held

    @property
    def graphs(self) -> GraphDecoder | None:
        """The runner's captured decode graphs (run-ahead and mixed steps drive them directly)."""
        return self.runner.graphs

    @property
    def usable_len(self) -> int:
        return self.runner.usable_len

    # ================================================================== lifecycle
    def start(self, reapply: bool = True) -> list[dict[str, Any]]:
        """Re-apply the manifest's verified swaps, then start the model thread."""
        results = self.swaps.reapply() if reapply else []
        self._thread = threading.Thread(target=self._run, name="gpuyantra-engine", daemon=True)
        self._thread.start()
        self.ready = True
        return results

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        for req in list(self._pending):
            self._finish(req, "error", error="server shutting down")
        self._pending.clear()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ================================================================== public API (any thread)
    def submit(self, request: GenRequest) -> GenRequest:
        self.validate(request)
        with self._cv:
            if self._stop:
                raise EngineNotReady("the engine is stopping")
            self._pending.append(request)
            self._cv.notify_all()
        self.observer.on_queue(len(self._pending), self.active_count)
        return request

    def validate(self, request: GenRequest) -> None:
        ids = request.prompt_ids
        if not ids:
            raise RequestError("the prompt is empty")
        vocab = self.runner.vocab_size
        if vocab and any((not isinstance(i, int)) or i < 0 or i >= vocab for i in ids):
            raise RequestError(f"prompt token ids must be integers in [0, {vocab})")
        if request.max_tokens < 1:
            raise RequestError("max_tokens must be at least 1")
        needed = len(ids) + request.max_tokens - 1
        if needed > self.usable_len:
            raise RequestError(
                f"the prompt ({len(ids)} tokens) plus max_tokens ({request.max_tokens}) exceeds the served "
                f"context of {self.usable_len} tokens"
            )

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, timeout: float | None = None, **kw) -> GenRequest:
        """Blocking helper: submit and wait (worker thread must be running)."""
        req = self.submit(GenRequest(list(prompt_ids), max_tokens, **kw))
        if not req.done.wait(timeout):
            req.cancel()
            raise TimeoutError("generation timed out")
        return req

    def call(self, fn: Callable[[], Any], *, exclusive: bool = False, name: str = "admin") -> concurrent.futures.Future:
        """Run `fn` on the model thread between forward passes; returns a Future of its result."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self._thread is None or not self._thread.is_alive():
            try:  # no model thread (benchmarks, tests): run inline
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001
                future.set_exception(exc)
            return future
        with self._cv:
            self._admin.append(_AdminOp(fn, exclusive, future, name))
            self._cv.notify_all()
        return future

    @property
    def active_count(self) -> int:
        return sum(1 for s in self.slots if s is not None)

    @property
    def waiting_count(self) -> int:
        return len(self._pending)

    # ================================================================== the model thread
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._has_work():
                    self._cv.wait(timeout=0.5)
                if self._stop:
                    return
            try:
                self._between_passes()
                self._one_pass()
            except Exception:  # noqa: BLE001 - the loop must survive anything
                log.exception("engine loop iteration failed")
                time.sleep(0.01)

    def _has_work(self) -> bool:
        return bool(
            self._admin or self.active_count or self.swaps.pending_faults() or (self._pending and self._can_admit())
        )

    def _exclusive_waiting(self) -> bool:
        return any(op.exclusive for op in self._admin)

    def _can_admit(self) -> bool:
        return not self._exclusive_waiting() and any(s is None for s in self.slots)

    def _between_passes(self) -> None:
        while True:
            with self._cv:
                op = None
                for candidate in list(self._admin):
                    if candidate.exclusive and self.active_count:
                        continue
                    op = candidate
                    self._admin.remove(candidate)
                    break
            if op is None:
                break
            if op.future.set_running_or_notify_cancel():
                try:
                    op.future.set_result(op.fn())
                except BaseException as exc:  # noqa: BLE001 - reported to the caller
                    op.future.set_exception(exc)
        if self.swaps.pending_faults():
            self.swaps.handle_faults()
        for index, slot in enumerate(self.slots):
            if slot is not None and slot.request.cancelled:
                self.slots[index] = None
                self._finish(slot.request, "cancelled")

    def _admit(self, mixed_room: int | None = None, greedy_only: bool = False) -> list[tuple[int, GenRequest]]:
        """Waiting requests for the free slots, as many as one prefill pass may hold: the padded
        batch (rows x longest prompt) stays within PREFILL_TOKEN_BUDGET (a lone prompt always fits).
        With `mixed_room`, for a mixed step: as many as fit that many prompt tokens in all (none
        when the first does not). `greedy_only`: up to the first that samples or wants logprobs."""
        admitted: list[tuple[int, GenRequest]] = []
        with self._cv:
            if not self._can_admit():
                return admitted
            self._order_waiting_by_client()
            free = [i for i, s in enumerate(self.slots) if s is None]
            longest = 0
            while self._pending and len(admitted) < len(free):
                req = self._pending[0]
                if req.cancelled:
                    self._pending.popleft()
                    self._finish(req, "cancelled")
                    continue
                if greedy_only and not greedy_request(req):
                    break
                if mixed_room is not None:
                    if len(req.prompt_ids) > mixed_room:
                        break
                    mixed_room -= len(req.prompt_ids)
                longest_with = max(longest, len(req.prompt_ids))
                if admitted and longest_with * (len(admitted) + 1) > PREFILL_TOKEN_BUDGET:
                    break
                longest = longest_with
                admitted.append((free[len(admitted)], self._pending.popleft()))
        return admitted

    def _order_waiting_by_client(self) -> None:
        """Reorder the waiting requests fairly between clients (`share_between_clients`); the caller
        holds the lock. Only where more than one client waits: the common case costs one pass."""
        if len({request.client for request in self._pending}) < 2:
            return
        decoding = Counter(slot.request.client for slot in self.slots if slot is not None)
        ordered = share_between_clients(self._pending, decoding)
        self._pending.clear()
        self._pending.extend(ordered)

    def _one_pass(self) -> None:
        room = self._mixed_room()
        if room is not None:
            if self._ahead is not None:  # hand out the step queued ahead first
                self._decode_pass()
                return
            admitted = self._admit(room)
            if admitted:
                self._guarded(admitted, lambda: self._mixed_pass(admitted))
                return
        admitted = self._admit()
        if admitted:
            try:
                self._prefill_requests(admitted)
            except Exception as exc:  # noqa: BLE001 - fail these requests, keep serving
                log.exception("prefill failed")
                for index, req in admitted:
                    self.slots[index] = None
                    self._finish(req, "error", error=f"{type(exc).__name__}: {exc}")
            self.observer.on_queue(len(self._pending), self.active_count)
            return
        if self.active_count:
            self._decode_pass()
        else:  # waiting requests whose client went away were dropped: the gauges say so
            self.observer.on_queue(len(self._pending), self.active_count)

    def _decode_pass(self) -> None:
        try:
            self._decode_active()
        except Exception as exc:  # noqa: BLE001
            log.exception("decode step failed")
            self._fail_active(exc)
        self.observer.on_queue(len(self._pending), self.active_count)

    def _fail_active(self, exc: Exception) -> None:
        for index, slot in enumerate(self.slots):
            if slot is not None:
                self.slots[index] = None
                self._finish(slot.request, "error", error=f"{type(exc).__name__}: {exc}")

    def _guarded(self, admitted: Sequence[tuple[int, GenRequest]], run: Callable[[], None]) -> None:
        """A mixed pass; if it raises, its rows (admitted or decoding) fail, serving goes on."""
        try:
            run()
        except Exception as exc:  # noqa: BLE001
            log.exception("mixed step failed")
            for index, req in admitted:
                slot = self.slots[index]
                if slot is not None and slot.request is req:
                    self.slots[index] = None
                self._finish(req, "error", error=f"{type(exc).__name__}: {exc}")
            self._fail_active(exc)
        self.observer.on_queue(len(self._pending), self.active_count)

    def _mixed_room(self) -> int | None:
        """Prompt tokens a mixed step could take now, or None when no mixed step is due: mixed steps
        on, rows decoding, a request waiting for a free slot."""
        if not self.mixed_prompt_tokens or not self.active_count or not self._pending or not self._can_admit():
            return None
        if not self.mixed_pays():
            return None
        decode_rows = max(i for i, s in enumerate(self.slots) if s is not None) + 1
        room = min(self.mixed_prompt_tokens, self._mixed_capacity() - decode_rows)
        return room if room > 0 else None

    def _prefill_captures(self) -> int:
        return self.runner.prefill_graphs.captures if self.runner.prefill_graphs is not None else 0

    def mixed_info(self) -> dict[str, Any]:
        """Mixed steps so far, and what their choice weighs (module doc)."""
        prefills = self._interrupting_prefill_ms
        return {
            "prompt_tokens": self.mixed_prompt_tokens,
            "admissions": self.mixed_admissions,
            "extra_ms": self.graphs.mixed_extra_ms if self.graphs is not None else None,
            "interrupting_prefill_ms": round(statistics.median(prefills), 3) if prefills else None,
            "interrupting_prefill_rows": list(self._interrupting_prefill_rows),
        }

    def mixed_pays(self) -> bool:
        """Does a mixed step cost the decoding rows less than a prefill pass? (module doc) Without a
        measured cost (no captured graphs) it is taken as configured."""
        extra = self.graphs.mixed_extra_ms if self.graphs is not None else None
        if extra is None:
            return True
        if not self._interrupting_prefill_ms:
            return False
        return extra < statistics.median(self._interrupting_prefill_ms)

    def _mixed_capacity(self) -> int:
        """Rows one mixed step may hold (the mixed graph's, or the configured bound when eager)."""
        if self.graphs is not None and self.graphs.mixed_buckets:
            return self.graphs.mixed_capacity()
        return self.max_batch + self.mixed_prompt_tokens

    def _mixed_pass(self, admitted: Sequence[tuple[int, GenRequest]]) -> None:
        """One step of the decoding rows with the admitted prompts riding along (module doc): each
        decoding row gets its next token, each admitted request its first."""
        started = time.perf_counter()
        scratch = self.cache.scratch_position
        decode_rows = self.slots[: max(i for i, s in enumerate(self.slots) if s is not None) + 1]
        tokens = [s.last_token if s is not None else 0 for s in decode_rows]
        positions = [s.pos if s is not None else scratch for s in decode_rows]
        slots = list(range(len(decode_rows)))
        last_rows = []
        for index, req in admitted:
            tokens += req.prompt_ids
            positions += range(len(req.prompt_ids))
            slots += [index] * len(req.prompt_ids)
            last_rows.append(len(tokens) - 1)
        plan = StepPlan.mixed(tokens, positions, slots)
        logits = self._clean_pass(lambda: self.runner.run(plan))
        picked = logits.index_select(0, torch.tensor([*range(len(decode_rows)), *last_rows], device=logits.device))
        joining = [self._new_slot(index, req) for index, req in admitted]
        rows = [*decode_rows, *joining]
        chosen = choose_tokens(picked, rows)
        logprobs = token_logprobs(picked, [s.request.logprobs if s is not None else None for s in rows], chosen)
        n = len(decode_rows)
        seconds = time.perf_counter() - started
        firsts = [(slot, token, 0) for slot, token in zip(joining, chosen[n:])]
        self._queue_next_from_host([*((slot, token, 1) for slot, token in zip(decode_rows, chosen[:n])), *firsts])
        self._finish_step(started, list(decode_rows), chosen[:n], logprobs[:n])
        joined = [(index, slot) for (index, _), slot in zip(admitted, joining)]
        self._hand_out_first_tokens(joined, chosen[n:], logprobs[n:], seconds)

    def _new_slot(self, index: int, req: GenRequest) -> _Slot:
        """The slot of a request admitted into cache row `index`, its prompt in the cache."""
        gen = None
        if req.temperature > 0:
            gen = torch.Generator().manual_seed(req.seed if req.seed is not None else int(uuid.uuid4().int % 2**31))
        slot = _Slot(request=req, pos=len(req.prompt_ids), last_token=0, generator=gen)
        self.slots[index] = slot
        return slot

    def _clean_pass(self, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run one forward pass. If a swapped kernel raised during it (that call fell back to the
        original forward, later calls bypassed the faulted swap), roll the swap back and run the pass
        again, so every served pass ran entirely on one set of forwards. Re-running is safe: a pass
        writes the same cache positions again."""
        out = run()
        if self.swaps.pending_faults():
            self.swaps.handle_faults()
            out = run()
        return out

    def _prefill_requests(self, admitted: Sequence[tuple[int, GenRequest]]) -> None:
        started = time.perf_counter()
        interrupting = self.active_count > 0
        captures = self._prefill_captures()
        rows = [index for index, _ in admitted]
        prompts = [req.prompt_ids for _, req in admitted]
        plan = StepPlan.prefill(rows, prompts)
        logits = self._clean_pass(lambda: self.runner.run(plan))
        slots = [self._new_slot(index, req) for index, req in admitted]
        tokens = choose_tokens(logits, slots)
        logprobs = token_logprobs(logits, [s.request.logprobs for s in slots], tokens)
        elapsed = time.perf_counter() - started
        self.observer.on_forward("prefill", len(admitted), sum(len(p) for p in prompts), elapsed)
        if interrupting and self._prefill_captures() == captures:  # a pass that captured a graph is no sample
            self._interrupting_prefill_ms.append(1e3 * elapsed)
            self._interrupting_prefill_rows.append(len(admitted))
        for (index, _), slot, token, lp in zip(admitted, slots, tokens, logprobs):
            self.traffic.prompt_lens.append(len(slot.request.prompt_ids))
            self._accept(index, slot, token, lp)

    def _decode_active(self) -> None:
        started = time.perf_counter()
        n = max(i for i, s in enumerate(self.slots) if s is not None) + 1
        rows = self.slots[:n]
        scratch = self.cache.scratch_position
        tokens = [s.last_token if s is not None else 0 for s in rows]
        positions = [s.pos if s is not None else scratch for s in rows]
        if self.graphs is not None:
            self._decode_graphs(started, rows, tokens, positions)
            return
        # Eager: attend only up to the longest active row (inactive rows write at scratch).
        kv_len = max(s.pos for s in rows if s is not None) + 1
        plan = StepPlan.decode(tokens, positions, kv_len=kv_len)
        logits = self._clean_pass(lambda: self.runner.run(plan))
        chosen = choose_tokens(logits, rows)
        logprobs = token_logprobs(logits, [s.request.logprobs if s is not None else None for s in rows], chosen)
        self._finish_step(started, list(rows), chosen, logprobs)

    def _decode_graphs(
        self, started: float, rows: Sequence[_Slot | None], tokens: list[int], positions: list[int]
    ) -> None:
        """One graph decode step handed to its rows. Greedy rows without logprobs run one step ahead:
        step k+1 (fed on the device by step k) is queued before the host waits for step k's tokens,
        so the GPU works while the host hands them out. A step queued ahead is only ever handed to
        the requests it ran for; a row whose request ended meanwhile drops its token."""
        graphs = self.graphs
        assert graphs is not None
        step, self._ahead = self._ahead, None
        queued_ahead = step is not None
        if step is not None and not any(s is not None and self.slots[i] is s for i, s in enumerate(step.rows)):
            step = None  # queued for requests that all ended since: nothing to hand out
        if step is None:
            plan = StepPlan.decode(tokens, positions, graph_bucket=graphs.bucket_for(len(tokens)))
            logits = self._clean_pass(lambda: self.runner.run(plan))
            if not self._greedy_rows(rows):
                chosen = choose_tokens(logits, rows, greedy=graphs.greedy(len(rows)))
                logprobs = token_logprobs(logits, [s.request.logprobs if s is not None else None for s in rows], chosen)
                self._finish_step(started, list(rows), chosen, logprobs)
                return
            step = _Step(list(rows), graphs.copy_greedy(len(rows)))
        if self._may_run_ahead(step):
            graphs.decode_fed(len(step.rows))
            if self.swaps.pending_faults():  # a graph step cannot fall back: drop it, run it again in step
                self.swaps.handle_faults()
            else:
                self._ahead = _Step(step.rows, graphs.copy_greedy(len(step.rows)))
        else:
            self._join_ahead(step)
        chosen = self._wait_tokens(step, queued_ahead)
        live = [slot if slot is not None and self.slots[i] is slot else None for i, slot in enumerate(step.rows)]
        decoding = [None if i in step.joined else slot for i, slot in enumerate(live)]
        if self._ahead is None:
            moves = [0 if i in step.joined else 1 for i in range(len(live))]
            self._queue_next_from_host(list(zip(live, chosen, moves)))
        self._finish_step(started, decoding, chosen, [None] * len(chosen))
        if step.joined:
            joined = list(step.joined.items())
            firsts = [chosen[index] for index, _ in joined]
            seconds = time.perf_counter() - step.queued_at
            self._hand_out_first_tokens(joined, firsts, [None] * len(joined), seconds)

    def _hand_out_first_tokens(
        self,
        joined: Sequence[tuple[int, _Slot]],
        tokens: Sequence[int],
        logprobs: Sequence[tuple[float, list[tuple[int, float]]] | None],
        seconds: float,
    ) -> None:
        """The first tokens of the requests that joined in a mixed step (`joined`: cache row, slot),
        counted as the prefill they replaced (`seconds`: the step's); a request that ended meanwhile
        gets nothing."""
        prompt_tokens = sum(len(slot.request.prompt_ids) for _, slot in joined)
        self.mixed_admissions += len(joined)
        self.observer.on_forward("prefill", len(joined), prompt_tokens, seconds)
        for (index, slot), token, lp in zip(joined, tokens, logprobs):
            self.traffic.prompt_lens.append(len(slot.request.prompt_ids))
            if self.slots[index] is slot:
                self._accept(index, slot, token, lp)

    def _join_ahead(self, step: _Step) -> None:
        """Queue a mixed step behind `step` before its tokens are handed out (`GraphDecoder.mixed_fed`):
        its decode rows fed on the device, the prompts of waiting requests that fit a mixed step
        (greedy, no logprobs) from the host. The GPU goes on from one step to the next while a request
        joins, instead of waiting for the host to hand out a step and feed the mixed one (module doc).
        Only where the step could run ahead but for the waiting requests."""
        graphs = self.graphs
        assert graphs is not None
        if self._host_must_step() or not graphs.mixed_buckets or not self._rows_feed_on_device(step)[0]:
            return
        n = len(step.rows)
        room = self._mixed_room()
        room = None if room is None else min(room, graphs.mixed_capacity() - n)  # the step's rows all ride
        if room is None or room < 1:
            return
        admitted = self._admit(room, greedy_only=True)
        if not admitted:
            return
        rows = max(n, max(index for index, _ in admitted) + 1)
        try:
            tokens = graphs.mixed_fed(n, [(index, req.prompt_ids) for index, req in admitted], rows)
        except Exception:  # noqa: BLE001 - the requests wait for a pass of their own
            log.exception("mixed step queued ahead failed")
            tokens = None
        if self.swaps.pending_faults():  # a graph step cannot fall back: drop it
            self.swaps.handle_faults()
            tokens = None
        if tokens is None:
            with self._cv:
                self._pending.extendleft(req for _, req in reversed(admitted))
            return
        joined = {index: self._new_slot(index, req) for index, req in admitted}
        padded = [*step.rows, *[None] * (rows - n)]
        self._ahead = _Step([joined.get(r, slot) for r, slot in enumerate(padded)], tokens, joined)

    def _wait_tokens(self, step: _Step, queued_ahead: bool) -> list[int]:
        """A graph step's tokens. For a step queued ahead (the GPU ran it while the host handed out
        the previous one) its cycle is kept: host time plus wait. A wait near zero means the host,
        not the GPU, sets the pace (`decode_timing`)."""
        waited = time.perf_counter()
        chosen = step.tokens.wait()
        now = time.perf_counter()
        if queued_ahead and self._graph_tokens_at is not None:
            self._graph_cycles.append((now - self._graph_tokens_at, now - waited))
        self._graph_tokens_at = now
        return chosen

    def decode_timing(self) -> dict[str, Any] | None:
        """The host's cycle over recent graph steps queued ahead, medians in ms: `cycle_ms` (one step's
        tokens to the next's), `wait_ms` (of it, waiting for the GPU) and `host_ms` (the rest: handing
        out tokens, the next step's launch, the interpreter lock); `cycle_p90_ms` shows stalls."""
        cycles = list(self._graph_cycles)
        if not cycles:
            return None
        totals = sorted(c for c, _ in cycles)
        return {
            "steps": len(cycles),
            "cycle_ms": round(1e3 * statistics.median(totals), 3),
            "cycle_p90_ms": round(1e3 * totals[int(0.9 * (len(totals) - 1))], 3),
            "wait_ms": round(1e3 * statistics.median(w for _, w in cycles), 3),
            "host_ms": round(1e3 * statistics.median(c - w for c, w in cycles), 3),
            "queued_from_host": self.steps_queued_from_host,
        }

    def _queue_next_from_host(self, chosen: Sequence[tuple[_Slot | None, int, int]]) -> None:
        """Queue the next step from the host before the tokens just chosen are handed out, where no
        step could run ahead on the device: a request joined a row (right after its prefill, or in
        a mixed step), or the inputs were reset. The GPU then works while the host hands out the
        tokens, instead of idling until it has (about 0.6 ms a step on an H200 host). `chosen`:
        (slot, its token, how far the token moves it on: 1 for a decode row, 0 for a row's first
        token). The conditions of running ahead (`_may_run_ahead`) hold, on the rows as they are
        now; a row prefilled earlier feeds its last token."""
        graphs = self.graphs
        if graphs is None or self._queue_ahead_blocked():
            return
        active = [i for i, s in enumerate(self.slots) if s is not None]
        if not active:
            return
        rows = self.slots[: active[-1] + 1]
        if not self._greedy_rows(rows) or any(s is not None and s.request.cancelled for s in rows):
            return
        handed = {id(slot): (token, moves) for slot, token, moves in chosen if slot is not None}
        scratch = self.cache.scratch_position
        tokens, positions, continuing = [], [], False
        for slot in rows:
            if slot is None:
                tokens.append(0)
                positions.append(scratch)
                continue
            token, moves = handed.get(id(slot), (slot.last_token, -1))
            pos = slot.pos + max(moves, 0)
            made = len(slot.request.output_ids) + (moves >= 0)  # its tokens once `chosen` is handed out
            ends = pos >= self.usable_len or made >= slot.request.max_tokens
            tokens.append(0 if ends else token)
            positions.append(scratch if ends else pos)  # a row ending now rides along
            continuing |= not ends
        if not continuing:
            return
        graphs.decode(tokens, positions)
        if self.swaps.pending_faults():  # a graph step cannot fall back: drop it, run it again next pass
            self.swaps.handle_faults()
            return
        self._ahead = _Step(list(rows), graphs.copy_greedy(len(rows)))
        self.steps_queued_from_host += 1

    def _queue_ahead_blocked(self) -> bool:
        """Must the next step wait for the host? It must step itself (`_host_must_step`), or a waiting
        request that a free slot admits goes first (a prefill, or a mixed step: `_join_ahead`)."""
        if self._host_must_step():
            return True
        return bool(self._pending) and any(s is None for s in self.slots)

    def _host_must_step(self) -> bool:
        """Run-ahead off, or an admin operation or a fault waiting between the passes."""
        return not self.run_ahead or bool(self._admin) or self.swaps.pending_faults()

    def _greedy_rows(self, rows: Sequence[_Slot | None]) -> bool:
        """Every live row takes the argmax token and wants no logprobs (the graph's token suffices)."""
        return all(s is None or greedy_request(s.request) for s in rows)

    def _may_run_ahead(self, step: _Step) -> bool:
        """Queue the next step now? Only when it is certainly wanted and nothing else waits to run
        between the passes: every row of the step still served and greedy, and one at least short of
        its length limit; no admin operation, fault or admissible request waiting; no other row
        active; and the step's inputs still hold what it fed (a capture between the passes resets
        them). A row that ends with this step's token gets nothing of the next: its token is dropped
        (`_decode_graphs`), the key/value it writes sit past its request's end, where the slot's next
        request writes before it attends, and the step is run for the other rows anyway; the row
        rides along in later steps the same way until a request joins it. (Waiting for every row to
        be two tokens short of its end, and still served, stopped run-ahead around every request's
        end: a quarter of the steps of eight streams of 64 tokens ending at different steps.)"""
        if self._queue_ahead_blocked():
            return False
        feeds, continuing = self._rows_feed_on_device(step)
        return feeds and continuing  # else this step's tokens are every row's last: a next step would be wasted

    def _rows_feed_on_device(self, step: _Step) -> tuple[bool, bool]:
        """(May the step feed the next one's inputs on the device, does a row continue past it): its
        inputs still hold what it fed, no row beyond it is active, and each of its rows is free (it
        rides along) or still the same greedy request, not cancelled (`_may_run_ahead`)."""
        assert self.graphs is not None
        if self.graphs.fed_bucket != self.graphs.bucket_for(len(step.rows)):
            return False, False
        n = len(step.rows)
        if any(s is not None for s in self.slots[n:]):
            return False, False
        continuing = False
        for i, slot in enumerate(step.rows):
            if self.slots[i] is None:
                continue  # padding, or a row that ended since: it rides along, its tokens dropped
            if self.slots[i] is not slot:
                return False, False  # a request joined this row: its inputs come from the host
            assert slot is not None
            req = slot.request
            if req.cancelled or not greedy_request(req):
                return False, False
            continuing |= len(req.output_ids) + 2 <= req.max_tokens and slot.pos + 2 <= self.usable_len
        return True, continuing

    def _finish_step(
        self,
        started: float,
        rows: Sequence[_Slot | None],
        chosen: Sequence[int],
        logprobs: Sequence[tuple[float, list[tuple[int, float]]] | None],
    ) -> None:
        """Count the step, then hand each live row its token."""
        n = len(rows)
        active = sum(1 for s in rows if s is not None)
        elapsed = time.perf_counter() - started
        self.observer.on_forward("decode", n, active, elapsed)
        self.traffic.live_steps.append((time.monotonic(), n, active, elapsed))
        self.traffic.batches.append(active)
        for index, slot in enumerate(rows):
            if slot is not None:
                slot.pos += 1
                self._accept(index, slot, chosen[index], logprobs[index])

    def _accept(
        self, index: int, slot: _Slot, token: int, logprob: tuple[float, list[tuple[int, float]]] | None = None
    ) -> None:
        req = slot.request
        if req.first_token_at is None:
            req.first_token_at = time.perf_counter()
        if token in req.stop_token_ids:
            self.slots[index] = None
            self._finish(req, "stop")
            return
        if logprob is not None:
            req.output_logprobs.append(logprob)
        req.output_ids.append(token)
        slot.last_token = token
        if req.on_token is not None:
            try:
                req.on_token(token)
            except Exception:  # noqa: BLE001 - a broken consumer cancels its own request only
                req.cancel()
        if req.cancelled:
            self.slots[index] = None
            self._finish(req, "cancelled")
        elif len(req.output_ids) >= req.max_tokens or slot.pos >= self.usable_len:
            self.slots[index] = None
            self._finish(req, "length")

    def _finish(self, req: GenRequest, reason: str, error: str | None = None) -> None:
        if req.done.is_set():
            return
        req.finish_reason = reason
        req.error = error
        req.finished_at = time.perf_counter()
        # Counted before anyone waiting on it wakes: a client that reads /metrics after its answer
        # finds its request there.
        self.observer.on_request_finished(req)
        req.done.set()
        if req.on_finish is not None:
            try:
                req.on_finish(req)
            except Exception:  # noqa: BLE001
                log.exception("on_finish callback failed")


@dataclass
class _Step:
    """A graph decode step replayed: the slots it ran for (by row) and its greedy tokens on their way;
    for a mixed step queued ahead, the rows of the requests that joined in it (their first token)."""

    rows: list[_Slot | None]
    tokens: PendingTokens
    joined: dict[int, _Slot] = field(default_factory=dict)
    queued_at: float = field(default_factory=time.perf_counter)
