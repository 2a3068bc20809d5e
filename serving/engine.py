"""Generation engine: one model thread, continuous batching over cache slots, swaps between passes.

Threading model
---------------
One worker thread owns the model. Everything that runs the model or changes its forwards -
prefill, decode steps, swaps, rollbacks, profiling, benchmarks - runs on that thread, one thing at
a time. The loop is:

    run queued admin operations (swap, rollback, ...)     <- "between forward passes"
    roll back swaps whose kernel raised while serving
    drop cancelled requests
    one forward pass: a prefill of one waiting request into a free slot, else one decode step
                      over every active slot

So a swap takes effect between two forward passes and no forward pass ever sees a half-swapped
model: the swap engine binds, checks and commits (or restores) every module before the loop runs
the next pass. If a swapped kernel raises during a pass, that call falls back to the original
forward (and the rest of the pass bypasses the faulted swap); the engine then rolls the swap back
and runs the same pass again on the original forwards, so the tokens served come from one
consistent model. Admin operations marked `exclusive` (benchmark, profile) also wait until no request
is in flight and hold new requests back meanwhile.

Batching
--------
Each active request owns one row ("slot") of a `SlotCache`. A waiting request is admitted into a
free slot with its own prefill pass (batch 1, no padding); decode steps then run every active slot
together (batch = highest active slot + 1), each row at its own position with its own mask row.
Requests join and leave between steps (continuous batching); at most `max_batch` run at once and
the rest wait in FIFO order.

With `cuda_graphs=True` decode steps replay a CUDA graph per batch-size bucket (`serving.graphs`);
prefill stays eager. On a CPU the same static-shape decode runs eagerly (for tests).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import statistics
import threading
import time
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from gpuyantra.binding import ModuleGroup, find_module_groups, find_open_groups
from gpuyantra.served_speed import repeat_spread
from gpuyantra.swap import SwapEngine, SwapRecord
from serving.cache import SlotCache, decode_mask, prefill_mask
from serving.models import LoadedModel

log = logging.getLogger("gpuyantra.serving")

# Tokens (rows x longest prompt, padding included) one batched prefill pass may hold.
PREFILL_TOKEN_BUDGET = 8192
MAX_GENERATIONS_PER_REPEAT = 1000  # bounds one benchmark repeat however small min_repeat_s is against the step time
LIVE_STEPS_KEPT = 65536  # served decode steps remembered for live speed measurements


class EngineObserver:
    """Hooks the engine calls (from its thread); `serving.metrics` implements them with Prometheus."""

    def on_forward(self, phase: str, rows: int, tokens: int, seconds: float) -> None: ...
    def on_request_finished(self, request: GenRequest) -> None: ...
    def on_queue(self, waiting: int, active: int) -> None: ...
    def on_swap_event(self, kind: str, record: SwapRecord, **info: Any) -> None: ...


class RequestError(ValueError):
    """A request the engine cannot run as asked (HTTP 400)."""


class EngineNotReady(RuntimeError):
    pass


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    # Log-probabilities of the generated tokens (log_softmax of the model's float32 logits, before
    # temperature / top_p): None = off; k >= 0 = each token's own plus the k most likely alternatives.
    logprobs: int | None = None
    on_token: Callable[[int], None] | None = None
    on_finish: Callable[[GenRequest], None] | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    output_ids: list[int] = field(default_factory=list)
    # with `logprobs`: one (logprob, [(token_id, logprob), ...k most likely]) per output id, appended
    # before on_token sees the token
    output_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    finish_reason: str | None = None  # length | stop | cancelled | error
    error: str | None = None
    cancelled: bool = False
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class _Slot:
    request: GenRequest
    pos: int  # position the next fed token is written at
    last_token: int
    generator: torch.Generator | None = None


@dataclass
class _AdminOp:
    fn: Callable[[], Any]
    exclusive: bool
    future: concurrent.futures.Future
    name: str


class ShapeRecorder:
    """Records the input shapes each matched module class sees in real traffic (forward pre-hooks)."""

    def __init__(self, model: torch.nn.Module, groups: Sequence[ModuleGroup], keep: int = 12):
        self.keep = keep
        self._shapes: dict[str, OrderedDict[tuple[int, ...], int]] = {}
        self._lock = threading.Lock()
        self._handles = []
        modules = dict(model.named_modules())
        self._live_ids: set[int] = set()
        for group in groups:
            # A linear shape group (every q_proj of the model, ...) sees one traffic pattern: one hook
            # per group, not one per Linear (a Python hook on ~200 projections costs each eager step).
            for name in group.names[:1] if group.param_shapes else group.names:
                module = modules[name]
                if id(module) in self._live_ids:
                    continue
                self._live_ids.add(id(module))
                self._handles.append(module.register_forward_pre_hook(self._hook(group.key), with_kwargs=True))
        self.enabled = True

    def _hook(self, key: str):
        def hook(module, args, kwargs):
            # deepcopies of a live module (binding probes) inherit the hook: only live modules count
            if not self.enabled or id(module) not in self._live_ids:
                return None
            x = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(x, torch.Tensor):
                shape = tuple(int(d) for d in x.shape)
                with self._lock:
                    od = self._shapes.setdefault(key, OrderedDict())
                    od[shape] = od.get(shape, 0) + 1
                    od.move_to_end(shape, last=False)
                    while len(od) > self.keep:
                        od.popitem(last=True)
            return None

        return hook

    def shapes_for(self, qualified_class: str) -> list[tuple[int, ...]]:
        """Most recent first."""
        with self._lock:
            return list(self._shapes.get(qualified_class, {}))

    def counts_for(self, qualified_class: str) -> dict[tuple[int, ...], int]:
        with self._lock:
            return dict(self._shapes.get(qualified_class, {}))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _signature_params(model: torch.nn.Module) -> set[str]:
    try:
        return set(inspect.signature(type(model).forward).parameters)
    except (TypeError, ValueError):
        return set()


class Engine:
    def __init__(
        self,
        loaded: LoadedModel,
        *,
        state_dir: str | Path,
        max_batch: int = 8,
        max_seq_len: int | None = None,
        cuda_graphs: bool = False,
        decode_attention: str = "auto",
        fuse_projections: str = "auto",
        graph_buckets: Sequence[int] | None = None,
        observer: EngineObserver | None = None,
        max_parity_shapes: int = 4,
        self_check: bool = True,
    ):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.model_name = loaded.name
        self.device = torch.device(loaded.device)
        self.dtype = loaded.dtype
        self.observer = observer or EngineObserver()
        self.vocab_size = int(getattr(self.model.config, "vocab_size", 0) or getattr(self.tokenizer, "vocab_size", 0))
        limit = _context_limit(self.model.config)
        max_len = int(max_seq_len or min(limit, 2048))
        max_len = min(max_len, limit)
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.max_batch = max_batch
        self.cache = SlotCache(max_batch, max_len, self.device)
        self._arange = torch.arange(max_len, device=self.device)
        params = _signature_params(self.model)
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keep_kw = "logits_to_keep" if "logits_to_keep" in params else None
        self.decode_attention = self._install_decode_attention(decode_attention)
        self.fused_projections = self._fuse_projections(fuse_projections)
        self.groups = find_module_groups(self.model)
        self._open_groups_found = False
        self.shapes = ShapeRecorder(self.model, self.groups)
        self.slots: list[_Slot | None] = [None] * max_batch
        self._pending: deque[GenRequest] = deque()
        self._admin: deque[_AdminOp] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.ready = False
        self.started_at = time.time()
        self.forward_passes = 0
        self._recent_prompt_lens: deque[int] = deque(maxlen=64)
        self._recent_batches: deque[int] = deque(maxlen=256)
        # Served decode steps (end time, rows, active rows, seconds): served speed judged from live
        # traffic without pausing it.
        self._live_steps: deque[tuple[float, int, int, float]] = deque(maxlen=LIVE_STEPS_KEPT)
        self.graphs = None
        if cuda_graphs:
            from serving.graphs import GraphDecoder

            self.graphs = GraphDecoder(self, graph_buckets)
        self.swaps = SwapEngine(
            self.model,
            state_dir,
            model_id=self.model_name,
            shapes_provider=self.shapes.shapes_for,
            default_rows=[(1, 1), (min(max_batch, 8), 1), (1, 16)],
            max_parity_shapes=max_parity_shapes,
            before_commit=self._before_commit if self.graphs is not None else None,
            after_restore=self._after_restore if self.graphs is not None else None,
            on_event=self.observer.on_swap_event,
        )
        self.self_check_report: dict[str, Any] | None = None
        if self_check:
            self.self_check_report = self.self_check()
        if self.graphs is not None:
            self.graphs.capture_all()

    def _chosen(self, option: str, choice: str, on: str, off: str) -> bool:
        """An auto/on/off engine option: `auto` means on for CUDA only (on a CPU the Triton
        interpreter is too slow to serve with, and launch latency, what these options cut, is moot)."""
        if choice not in ("auto", on, off):
            raise ValueError(f"{option} must be auto, {on} or {off}, not {choice!r}")
        return choice == on or (choice == "auto" and self.device.type == "cuda")

    def _install_decode_attention(self, choice: str):
        """`triton`: one-token attention runs `serving.attention`'s kernel over each row's own
        positions (fewer, cheaper kernels per decode step); `sdpa`: transformers' SDPA over the masked
        cache. Either way a model shared with an earlier engine is switched accordingly."""
        from serving import attention

        if self._chosen("decode_attention", choice, "triton", "sdpa"):
            return attention.install(self.model, self.cache)
        attention.uninstall(self.model)
        return None

    def _fuse_projections(self, choice: str) -> int:
        """`on`: q/k/v and gate/up projections run as one GEMM each (`serving/fusion.py`); `off`:
        as the modeling code wrote them. Returns the number of fused groups."""
        from serving import fusion

        if self._chosen("fuse_projections", choice, "on", "off"):
            return fusion.fuse(self.model)
        fusion.unfuse(self.model)
        return 0

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

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    @property
    def usable_len(self) -> int:
        return self.cache.usable_len

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
        if self.vocab_size and any((not isinstance(i, int)) or i < 0 or i >= self.vocab_size for i in ids):
            raise RequestError(f"prompt token ids must be integers in [0, {self.vocab_size})")
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

    def _admit(self) -> list[tuple[int, GenRequest]]:
        """Waiting requests for the free slots, as many as one prefill pass may hold: the padded
        batch (rows x longest prompt) stays within PREFILL_TOKEN_BUDGET (a lone prompt always fits)."""
        admitted: list[tuple[int, GenRequest]] = []
        with self._cv:
            if not self._can_admit():
                return admitted
            free = [i for i, s in enumerate(self.slots) if s is None]
            longest = 0
            while self._pending and len(admitted) < len(free):
                req = self._pending[0]
                if req.cancelled:
                    self._pending.popleft()
                    self._finish(req, "cancelled")
                    continue
                longest_with = max(longest, len(req.prompt_ids))
                if admitted and longest_with * (len(admitted) + 1) > PREFILL_TOKEN_BUDGET:
                    break
                longest = longest_with
                admitted.append((free[len(admitted)], self._pending.popleft()))
        return admitted

    def _one_pass(self) -> None:
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
            try:
                self._decode_active()
            except Exception as exc:  # noqa: BLE001
                log.exception("decode step failed")
                for index, slot in enumerate(self.slots):
                    if slot is not None:
                        self.slots[index] = None
                        self._finish(slot.request, "error", error=f"{type(exc).__name__}: {exc}")
            self.observer.on_queue(len(self._pending), self.active_count)

    # ================================================================== forward passes
    def _forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor,
        keep: int | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits `[rows, positions, V]`: at every position, or only at `keep` (the last `keep`
        positions, or these position indices) when the model takes `logits_to_keep`."""
        kwargs: dict[str, Any] = {self._cache_kw: self.cache, "use_cache": True}
        if keep is not None and self._keep_kw:
            kwargs[self._keep_kw] = keep
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, **kwargs)
        self.forward_passes += 1
        return out.logits

    def prefill_row(self, row: int, prompt_ids: Sequence[int]) -> torch.Tensor:
        """Prefill one cache row with a prompt; returns the last position's logits [1, V]."""
        length = len(prompt_ids)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
        positions = self._arange[:length][None]
        mask = prefill_mask(length, 0, self.dtype, self.device)
        self.cache.set_prefill(row, 0)
        with torch.no_grad():
            return self._forward(ids, positions, mask, keep=1)[:, -1, :]

    def prefill_rows(self, rows: Sequence[int], prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Prefill several cache rows in one forward pass (prompts right-padded to the longest; the
        causal mask keeps every real position from seeing padding); logits [n, V] at each row's last
        prompt position."""
        if len(rows) == 1:
            return self.prefill_row(rows[0], prompts[0])
        length = max(len(p) for p in prompts)
        ids = torch.tensor([list(p) + [0] * (length - len(p)) for p in prompts], dtype=torch.long, device=self.device)
        positions = self._arange[:length][None].expand(len(rows), length)
        mask = prefill_mask(length, 0, self.dtype, self.device)
        last = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        self.cache.set_prefill_rows(rows)
        keep = torch.unique(last) if self._keep_kw else None  # logits only where some row ends
        with torch.no_grad():
            logits = self._forward(ids, positions, mask, keep=keep)
        column = torch.searchsorted(keep, last) if keep is not None else last
        return logits[torch.arange(len(rows), device=self.device), column]

    def decode_rows(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """One decode step over rows 0..n-1 (row r feeds tokens[r] at positions[r]); logits [n, V]."""
        if self.graphs is not None:
            return self.graphs.decode(tokens, positions)
        return self.decode_rows_eager(tokens, positions)

    def decode_rows_eager(
        self, tokens: Sequence[int], positions: Sequence[int], kv_len: int | None = None
    ) -> torch.Tensor:
        n = len(tokens)
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device).view(n, 1)
        pos = torch.tensor(list(positions), dtype=torch.long, device=self.device)
        if kv_len is None:
            kv_len = min(self.max_len, max(positions) + 1)
        self.cache.set_decode(n, pos, kv_len)
        mask = decode_mask(pos, kv_len, self._arange, self.dtype)
        with torch.no_grad():
            return self._forward(ids, pos[:, None], mask)[:, -1, :]

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
        rows = [index for index, _ in admitted]
        prompts = [req.prompt_ids for _, req in admitted]
        logits = self._clean_pass(lambda: self.prefill_rows(rows, prompts))
        slots = []
        for index, req in admitted:
            gen = None
            if req.temperature > 0:
                gen = torch.Generator().manual_seed(req.seed if req.seed is not None else int(uuid.uuid4().int % 2**31))
            slot = _Slot(request=req, pos=len(req.prompt_ids), last_token=0, generator=gen)
            self.slots[index] = slot
            slots.append(slot)
        tokens = self._select(logits, slots)
        logprobs = token_logprobs(logits, [s.request.logprobs for s in slots], tokens)
        self.observer.on_forward("prefill", len(admitted), sum(len(p) for p in prompts), time.perf_counter() - started)
        for (index, _), slot, token, lp in zip(admitted, slots, tokens, logprobs):
            self._recent_prompt_lens.append(len(slot.request.prompt_ids))
            self._accept(index, slot, token, lp)

    def _decode_active(self) -> None:
        started = time.perf_counter()
        n = max(i for i, s in enumerate(self.slots) if s is not None) + 1
        rows = self.slots[:n]
        scratch = self.cache.scratch_position
        tokens = [s.last_token if s is not None else 0 for s in rows]
        positions = [s.pos if s is not None else scratch for s in rows]
        graphs = self.graphs
        if graphs is None:
            # Eager: attend only up to the longest active row (inactive rows write at scratch).
            kv_len = max(s.pos for s in rows if s is not None) + 1
            logits = self._clean_pass(lambda: self.decode_rows_eager(tokens, positions, kv_len=kv_len))
        else:
            logits = self._clean_pass(lambda: graphs.decode(tokens, positions))
        chosen = self._select(logits, rows)
        logprobs = token_logprobs(logits, [s.request.logprobs if s is not None else None for s in rows], chosen)
        active = sum(1 for s in rows if s is not None)
        elapsed = time.perf_counter() - started
        self.observer.on_forward("decode", n, active, elapsed)
        self._live_steps.append((time.monotonic(), n, active, elapsed))
        self._recent_batches.append(active)
        for index, slot in enumerate(rows):
            if slot is not None:
                slot.pos += 1
                self._accept(index, slot, chosen[index], logprobs[index])

    def _select(self, logits: torch.Tensor, slots: Sequence[_Slot | None]) -> list[int]:
        greedy = logits.argmax(dim=-1).tolist()
        out = list(greedy)
        for r, slot in enumerate(slots):
            if slot is None or slot.request.temperature <= 0:
                continue
            req = slot.request
            probs = torch.softmax(logits[r].float() / max(req.temperature, 1e-5), dim=-1).cpu()
            if req.top_p < 1.0:
                sorted_p, order = probs.sort(descending=True)
                keep = sorted_p.cumsum(0) - sorted_p < req.top_p
                keep[0] = True
                probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
            out[r] = int(torch.multinomial(probs, 1, generator=slot.generator))
        return out

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
        req.done.set()
        if req.on_finish is not None:
            try:
                req.on_finish(req)
            except Exception:  # noqa: BLE001
                log.exception("on_finish callback failed")
        self.observer.on_request_finished(req)

    def last_logits(self, prompt_ids: Sequence[int]) -> list[float]:
        """Last-position logits of one plain full-sequence forward through the live (possibly
        swapped) modules: what `/admin/logits` returns for parity checks from outside."""
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
        with torch.no_grad():
            logits = self.model(input_ids=ids, use_cache=False).logits[0, -1]
        return logits.float().cpu().tolist()

    # ================================================================== checks
    def self_check(self, prompt_len: int = 6, steps: int = 3) -> dict[str, Any]:
        """The slot-cache path must reproduce a plain full-sequence forward (run once at startup)."""
        vocab = max(2, self.vocab_size)
        prompt = [(7 * i + 3) % vocab for i in range(prompt_len)]
        seq = list(prompt)
        got = []
        with torch.no_grad():
            logits = self.prefill_row(0, prompt)
            got.append(logits[0].float())
            for _ in range(steps):
                token = int(logits[0].argmax())
                seq.append(token)
                logits = self.decode_rows_eager([token], [len(seq) - 1])
                got.append(logits[0].float())
            ids = torch.tensor([seq], dtype=torch.long, device=self.device)
            full = self.model(input_ids=ids, use_cache=False).logits[0].float()
        want = full[prompt_len - 1 :]
        have = torch.stack(got)
        diff = float((have - want).abs().max())
        scale = float(want.abs().max()) or 1.0
        tol = 1e-3 if self.dtype == torch.float32 else 5e-2
        ok = diff <= tol * max(1.0, scale)
        report = {"ok": ok, "max_abs_diff": diff, "tolerance": tol * max(1.0, scale)}
        if not ok:
            raise RuntimeError(
                f"{type(self.model).__name__} does not run correctly on the engine's slot cache "
                f"(max logit difference {diff:.3g} vs a full forward); this architecture is not supported"
            )
        return report

    # ================================================================== swaps (model thread)
    def _before_commit(self, record: SwapRecord) -> dict[str, Any]:
        """Graph mode: re-capture every bucket with the new forwards, then check parity on graphs."""
        assert self.graphs is not None
        with self.swaps.previous_forwards():
            reference = self.graphs.reference_logits()
        self.graphs.capture_all()
        return {"graph": self.graphs.verify(previous=reference)}

    def _after_restore(self) -> None:
        if self.graphs is not None:
            self.graphs.capture_all()

    def function_sites(self) -> list[Any]:
        """Function-level swap sites of the served model (rope's `apply_rotary_pos_emb` globals)."""
        from gpuyantra.ops import all_ops

        return [
            site for family in all_ops() if family.known_functions for site in self.swaps.function_sites(family.name)
        ]

    def live_shapes(self) -> dict[str, list[list[int]]]:
        return {g.key: [list(s) for s in self.shapes.shapes_for(g.key)] for g in self.groups}

    # ================================================================== benchmark / profile (model thread, exclusive)
    def benchmark(
        self, max_tokens: int = 16, prompt_tokens: int = 8, batch: int = 1, repeats: int = 1, min_repeat_s: float = 0.0
    ) -> dict[str, Any]:
        """Served decode speed on the live path (graphs when enabled), measured in this process.

        `repeats` timed repeats, each generating again until it has run `min_repeat_s` (a single
        short generation is mostly timer and launch noise). `tokens_per_s` is the median repeat; the
        spread of the repeats (min, max, (max - min) / median, 1.4826 * MAD / median) says how far
        two measurements may differ by noise alone."""
        if self.active_count:
            raise RuntimeError("benchmark needs an idle engine (run it through call(..., exclusive=True))")
        if not 1 <= batch <= self.max_batch:
            raise RequestError(f"batch must be between 1 and max_batch ({self.max_batch})")
        if prompt_tokens < 1 or max_tokens < 1 or prompt_tokens + max_tokens > self.usable_len:
            raise RequestError(f"prompt_tokens + max_tokens must be within the context ({self.usable_len})")
        vocab = max(2, self.vocab_size)
        prompts = [[(31 * i + 17 * r + 5) % vocab for i in range(prompt_tokens)] for r in range(batch)]
        cuda = self.device.type == "cuda"

        def sync():
            if cuda:
                torch.cuda.synchronize(self.device)

        def run(steps: int) -> tuple[float, float, list[list[int]]]:
            sync()
            t0 = time.perf_counter()
            last = []
            for r, prompt in enumerate(prompts):
                last.append(int(self.prefill_row(r, prompt)[0].argmax()))
            sync()
            t1 = time.perf_counter()
            outs = [[t] for t in last]
            pos = [prompt_tokens] * batch
            for _ in range(steps):
                logits = self.decode_rows(last, pos)
                last = logits.argmax(dim=-1).tolist()
                for r in range(batch):
                    outs[r].append(last[r])
                pos = [p + 1 for p in pos]
            sync()
            return t1 - t0, time.perf_counter() - t1, outs

        def timed_repeat(steps: int) -> tuple[float, float, list[list[int]]]:
            # Mean prefill and decode time of as many generations as fill min_repeat_s (bounded).
            prefill = decode = 0.0
            n = 0
            while True:
                p, d, outs = run(steps)
                prefill, decode, n = prefill + p, decode + d, n + 1
                if prefill + decode >= min_repeat_s or n >= MAX_GENERATIONS_PER_REPEAT:
                    break
            return prefill / n, decode / n, outs

        with torch.no_grad():
            run(min(2, max_tokens - 1))  # warm-up (kernel specialization, allocator)
            results = [timed_repeat(max_tokens - 1) for _ in range(max(1, repeats))]
        prefill_s = statistics.median(r[0] for r in results)
        decode_s = statistics.median(r[1] for r in results)
        steps = max_tokens - 1
        e2e_tps = batch * max_tokens / (prefill_s + decode_s)
        # Per-repeat figures: decode tokens/s, or whole-generation tokens/s when there is no decode step.
        samples = [batch * steps / max(d, 1e-9) if steps else batch * max_tokens / (p + d) for p, d, _ in results]
        spread = repeat_spread(samples)
        return {
            **spread,
            "measured": "benchmark",
            "min_repeat_s": min_repeat_s,
            "e2e_tokens_per_s": e2e_tps,
            "ms_per_step": 1000 * decode_s / steps if steps else None,
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "ttft_s": prefill_s / batch,
            "batch": batch,
            "max_tokens": max_tokens,
            "prompt_tokens": prompt_tokens,
            "repeats": len(results),
            **self._served_state(),
            "output_ids": results[-1][2][0][:8],
        }

    def _served_state(self) -> dict[str, Any]:
        """What a speed figure was measured on: decode path, swaps in, device, dtype, model."""
        path = "eager"
        if self.graphs is not None:
            path = "cuda-graphs" if self.graphs.capture_enabled else "static-eager"
        return {
            "path": path,
            "active_swaps": self.swaps.active_ids(),
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "model": self.model_name,
        }

    def live_speed(self, batch: int, window_s: float, min_steps: int, repeats: int = 5) -> dict[str, Any]:
        """Served decode speed from the live steps of the next `window_s` seconds at `batch` full rows
        (called off the engine thread; traffic is not paused). `{"measured": "none", "reason": ...}`
        when there is no such traffic: at once when nothing is decoding, else after the window."""
        if not self.active_count:
            return {"measured": "none", "reason": "no live traffic is decoding now"}
        start = time.monotonic()
        deadline = start + window_s
        while time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        steps = [s for s in list(self._live_steps) if s[0] > start and s[1] == batch and s[2] == batch]
        if len(steps) < min_steps:
            return {
                "measured": "none",
                "reason": f"{len(steps)} live decode steps at {batch} row(s) in {window_s:g} s, fewer than {min_steps}",
            }
        # Consecutive chunks of steps play the part of a benchmark's repeats (their spread is the noise).
        chunks = max(1, min(repeats, len(steps) // 5))
        size = len(steps) // chunks
        samples = [batch * size / max(sum(s[3] for s in steps[i * size : (i + 1) * size]), 1e-9) for i in range(chunks)]
        seconds = sum(s[3] for s in steps)
        return {
            **repeat_spread(samples),
            "measured": "live",
            "batch": batch,
            "steps": len(steps),
            "window_s": window_s,
            "ms_per_step": 1000 * seconds / len(steps),
            "repeats": chunks,
            **self._served_state(),
        }

    def _probe_rows(self) -> tuple[int, int]:
        prompt = int(statistics.median(self._recent_prompt_lens)) if self._recent_prompt_lens else 16
        batch = Counter(self._recent_batches).most_common(1)[0][0] if self._recent_batches else 1
        prompt = max(1, min(prompt, self.usable_len - 2))
        return prompt, max(1, min(batch, self.max_batch))

    def probes(self) -> dict[str, Callable[[], Any]]:
        """Representative workloads built from recent traffic: one prefill, one decode step."""
        prompt_len, batch = self._probe_rows()
        vocab = max(2, self.vocab_size)
        prompt = [(13 * i + 1) % vocab for i in range(prompt_len)]
        primed = {"done": False}

        def prefill():
            self.prefill_row(0, prompt)

        def decode():
            if not primed["done"]:
                for r in range(batch):
                    self.prefill_row(r, prompt)
                primed["done"] = True
            self.decode_rows_eager([1] * batch, [prompt_len] * batch, kv_len=prompt_len + 1)

        return {"prefill": prefill, "decode": decode}

    def profile(self) -> dict[str, Any]:
        if self.active_count:
            raise RuntimeError("profile needs an idle engine (run it through call(..., exclusive=True))")
        probes = self.probes()
        self._add_open_groups(probes["decode"])
        source, error, result = "fallback", None, None
        try:
            result = run_profiler(
                self.model, probes, str(self.device), self.groups, function_sites=self.function_sites()
            )
            if result is not None:
                source = "profiler"
        except Exception as exc:  # noqa: BLE001 - the fallback always answers
            error = f"{type(exc).__name__}: {exc}"
            log.exception("profiler failed; answering with the fallback profile")
        if result is None:
            result = self._fallback_profile(probes)
        result = dict(result)
        targets = []
        for t in result.get("targets", []):
            t = dict(t)
            group = next(
                (
                    g
                    for g in self.groups
                    if g.op == t.get("op")
                    and t.get("module_class") in (g.module_class, g.qualified_class)
                    and g.variant == t.get("variant", "")  # linear: one group per projection shape
                ),
                None,
            )
            if group is not None:
                t.setdefault("qualified_class", group.qualified_class)
                t.setdefault("adapter", group.adapter)
                t.setdefault("modules", group.count)
                live = [list(s) for s in self.shapes.shapes_for(group.key)]
                if live:
                    t.setdefault("live_shapes", live)
                t["swapped"] = sorted({self.swaps._owner.get(n) for n in group.names} - {None})
                _attach_open_payload(t)
            elif t.get("functions"):  # function-level target (rope): which swaps hold its globals
                t["swapped"] = sorted({self.swaps._fn_owner.get(f) for f in t["functions"]} - {None})
            targets.append(t)
        result["targets"] = targets
        result.setdefault("device", str(self.device))
        result.setdefault("hardware", _hardware_name(self.device))
        result["source"] = source
        if error:
            result["profiler_error"] = error
        result["model"] = self.model_name
        result["dtype"] = str(self.dtype).replace("torch.", "")
        return result

    def _add_open_groups(self, decode: Callable[[], Any]) -> None:
        """Once per process: open targets for the leaf module classes no registered family covers
        (their own forward is the reference), profiled and offered to campaigns like families."""
        if self._open_groups_found:
            return
        self._open_groups_found = True
        try:
            extra = find_open_groups(self.model, decode, self.groups)
        except Exception:  # noqa: BLE001 - the registered families are still profiled
            log.exception("open target discovery failed; profiling registered families only")
            return
        known = {(g.op, g.qualified_class) for g in self.groups}
        self.groups = [*self.groups, *(g for g in extra if (g.op, g.qualified_class) not in known)]

    def _fallback_profile(self, probes: Mapping[str, Callable[[], Any]]) -> dict[str, Any]:
        """Rank (op, class) groups by measured share of a decode step, at the live shapes."""
        from gpuyantra.ops import get_op

        cuda = self.device.type == "cuda"

        def timed(fn, repeat=3) -> float:
            times = []
            for _ in range(repeat):
                if cuda:
                    torch.cuda.synchronize(self.device)
                t0 = time.perf_counter()
                fn()
                if cuda:
                    torch.cuda.synchronize(self.device)
                times.append(time.perf_counter() - t0)
            return statistics.median(times)

        with torch.no_grad():
            probes["decode"]()
            step_s = timed(probes["decode"])
        modules = dict(self.model.named_modules())
        targets: list[dict[str, Any]] = []
        for group in self.groups:
            family = get_op(group.op)
            module = modules[group.names[0]]
            recent = self.shapes.shapes_for(group.key)
            shapes = recent[:4] if recent else []
            rows = tuple(recent[0][:-1]) if recent else (1, 1)
            try:
                gen = torch.Generator().manual_seed(0)
                acts = family.activations_for_module(module, rows, self.dtype, self.device, gen)
                with torch.no_grad():
                    family.module_call(module, *acts)
                    per_call = timed(partial(family.module_call, module, *acts))
            except Exception:  # noqa: BLE001 - a group we cannot time ranks last
                per_call = 0.0
            if not shapes:
                shapes = [tuple(a.shape) for a in acts[:1]] if per_call else []
            share = min(1.0, per_call * group.count / step_s) if step_s > 0 else 0.0
            targets.append(
                {
                    "op": group.op,
                    "module_class": group.module_class,
                    "qualified_class": group.qualified_class,
                    "modules": group.count,
                    "adapter": group.adapter,
                    **({"param_shapes": group.param_shapes, "variant": group.variant} if group.param_shapes else {}),
                    "shapes": [list(s) for s in shapes],
                    "dtype": str(self.dtype).replace("torch.", ""),
                    "regime": "unknown",
                    "share": round(share, 4),
                    "est_us_per_step": round(per_call * group.count * 1e6, 2),
                }
            )
        targets.extend(self._fallback_function_targets(probes["decode"], step_s))
        targets.sort(key=lambda t: t["share"], reverse=True)
        return {
            "targets": targets,
            "device": str(self.device),
            "hardware": _hardware_name(self.device),
            "step_ms": round(step_s * 1000, 3),
        }

    def _fallback_function_targets(self, decode: Callable[[], Any], step_s: float) -> list[dict[str, Any]]:
        """Function-level targets (rope) for the fallback profile: one decode step with each site's
        global wrapped in a timer; shapes are the q shapes seen."""
        sites = self.function_sites()
        if not sites:
            return []
        seen: dict[str, Counter] = {s.op: Counter() for s in sites}
        spent: dict[str, float] = {s.op: 0.0 for s in sites}
        states = {s.dotted: s.current() for s in sites}

        def timer(site, current):
            def timed(*args, **kwargs):
                if args and isinstance(args[0], torch.Tensor):
                    seen[site.op][tuple(args[0].shape)] += 1
                t0 = time.perf_counter()
                try:
                    return current(*args, **kwargs)
                finally:
                    spent[site.op] += time.perf_counter() - t0

            return timed

        try:
            for site in sites:
                site.set(timer(site, states[site.dotted]))
            with torch.no_grad():
                decode()
        finally:
            for site in sites:
                site.set(states[site.dotted])
        out = []
        for op in seen:
            mine = [s for s in sites if s.op == op]
            if not seen[op]:
                continue
            from gpuyantra.ops import get_op

            out.append(
                {
                    "op": op,
                    "module_class": ",".join(dict.fromkeys(s.attr for s in mine)),
                    "qualified_class": get_op(op).default_module,
                    "modules": sum(s.count for s in mine),
                    "adapter": [],
                    "binding": "function",
                    "functions": [s.dotted for s in mine],
                    "shapes": [list(sh) for sh, _ in seen[op].most_common()],
                    "dtype": str(self.dtype).replace("torch.", ""),
                    "regime": "unknown",
                    "share": round(min(1.0, spent[op] / step_s), 4) if step_s > 0 else 0.0,
                    "est_us_per_step": round(spent[op] * 1e6, 2),
                }
            )
        return out


# An open target travels with its profile entry (workers may not share the server's state folder),
# unless its pickled module is larger than this: Temporal payloads are kept small.
OPEN_PAYLOAD_MAX_BYTES = 1 << 20


def _attach_open_payload(target: dict[str, Any]) -> None:
    from gpuyantra.ops import get_op
    from gpuyantra.ops.open import is_open

    if not is_open(target.get("op")):
        return
    payload = get_op(str(target["op"])).open_target.to_payload()
    if len(payload["module_b64"]) <= OPEN_PAYLOAD_MAX_BYTES:
        target["open_target"] = payload


def token_logprobs(
    logits: torch.Tensor, wanted: Sequence[int | None], chosen: Sequence[int]
) -> list[tuple[float, list[tuple[int, float]]] | None]:
    """Per row r of `logits` [rows, V]: None when wanted[r] is None, else (log-probability of
    chosen[r], the wanted[r] most likely (token id, log-probability), most likely first), from
    log_softmax of the logits in float32."""
    out: list[tuple[float, list[tuple[int, float]]] | None] = [None] * len(wanted)
    rows = [r for r, k in enumerate(wanted) if k is not None]
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)
    logp = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    picked = logp.gather(1, torch.tensor([[int(chosen[r])] for r in rows], device=logits.device))[:, 0].tolist()
    k = min(max(int(wanted[r]) for r in rows), logp.shape[-1])  # type: ignore[arg-type]
    top_values, top_ids = logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long())
    values, ids = top_values.tolist(), top_ids.tolist()
    for j, r in enumerate(rows):
        want = int(wanted[r])  # type: ignore[arg-type]
        out[r] = (picked[j], list(zip(ids[j][:want], values[j][:want])))
    return out


def run_profiler(
    model: torch.nn.Module,
    probes: Mapping[str, Callable[[], Any]],
    device: str,
    groups: Sequence[ModuleGroup] | None = None,
    function_sites: Sequence[Any] | None = None,
) -> dict[str, Any] | None:
    """`gpuyantra.profiler.profile_model(model, run_probe, device)` when that module exists, else None."""
    try:
        from gpuyantra.profiler import profile_model
    except ImportError:
        return None
    try:
        params = set(inspect.signature(profile_model).parameters)
    except (TypeError, ValueError):
        params = set()
    if "groups" in params:
        extra: dict[str, Any] = {"function_sites": list(function_sites or [])} if "function_sites" in params else {}
        return profile_model(model, dict(probes), device, groups=list(groups or []), **extra)
    # The minimal contract: one callable probe.
    return profile_model(model, lambda: [p() for p in probes.values()], device)


def _context_limit(config: Any) -> int:
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def _hardware_name(device: torch.device) -> str:
    if device.type == "cuda":
        try:
            return torch.cuda.get_device_name(device)
        except Exception:  # noqa: BLE001
            return "cuda"
    return "cpu"
