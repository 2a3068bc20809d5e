"""CUDA-graph decode: the decode step captured once per batch-size bucket, replayed per token.

Static state per bucket `b`: input token ids `[b, 1]`, positions `[b]` and the captured output
logits `[b, V]`. The KV cache is the engine's `SlotCache` (rows 0..b-1 of its full-size tensors),
the mask is computed inside the graph from the positions buffer, and attention always spans the
whole `max_len` (masked), so one graph serves every position. The serving loop owns positions:
it writes them into the static buffer before each replay; nothing in the graph keeps a counter
(unlike transformers' `StaticCache`, whose `cumulative_length` advances on every replay).

Run-ahead: the step also takes each row's greedy token (argmax of its logits, into `next`) and
feeds it back as the next step's input, with the row's position advanced (scratch rows stay at
scratch). So a step can be replayed again without the host writing anything (`decode_fed`) while
the host still reads the previous step's tokens (`copy_greedy`): the serving loop queues step k+1
before it waits for step k, and the GPU does not idle while the host handles a step's tokens.

Re-capture: after any change of the model's forwards (a swap about to commit, a rollback) the
engine calls `capture_all()`, which drops the old graphs and captures new ones that contain the
new kernels. Warm-up and capture write only at the cache's scratch position (`max_len - 1`), so
they can run between forward passes while requests are in flight. `verify()` then checks the graph
path: each bucket's replay must equal the same step run eagerly with the current forwards.

Mixed steps: with `mixed_rows` > 0 one more graph is captured, a step of that many rows each with
its own cache row (a static `slots` buffer): the decode rows, then the prompt tokens of requests
joining the batch, one row per token (`serving.scheduler` explains why). Every row's key/value is
written before any row attends, so a prompt token sees the ones before it.

Without CUDA (tests on a CPU) the same static-shape step runs eagerly: everything but the capture
itself is exercised.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from serving.cache import SlotCache, decode_mask


class DecodeHost(Protocol):
    """What a GraphDecoder uses of the model runner that owns it (serving.runner.ModelRunner).
    Typed here, not imported: the runner's users import this module, so this one names none of theirs."""

    @property
    def device(self) -> torch.device: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def max_batch(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def cache(self) -> SlotCache: ...
    @property
    def _arange(self) -> torch.Tensor: ...  # positions 0..max_len-1 on the device

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits [rows, positions, V] of one forward pass over the engine's cache."""
        ...


def graph_tolerance(dtype: torch.dtype) -> float:
    """How far a graph replay's logits may differ from the eager pass's, relative to max(1, |logits|)."""
    return 1e-4 if dtype == torch.float32 else 2e-2


def replay_error(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max abs difference, scale = max(1, max |want|)) of a replay against the eager pass; the
    difference is infinite where the replay is not finite."""
    diff = float((got.float() - want.float()).abs().max()) if bool(torch.isfinite(got).all()) else math.inf
    return diff, max(1.0, float(want.float().abs().max()))


def warm_up_on_side_stream(device: torch.device, run: Callable[[], Any]) -> None:
    """Run `run` on a side stream and wait for it: lazy set-up (library handles, compiles, the
    allocator's blocks) happens before a capture, not inside it, as torch.cuda.graph asks."""
    torch.cuda.synchronize(device)
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)


def default_buckets(max_batch: int) -> list[int]:
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    out.append(max_batch)
    return sorted(set(out))


class GraphDecoder:
    def __init__(self, engine: DecodeHost, buckets: Sequence[int] | None = None, warmup: int = 2, mixed_rows: int = 0):
        self.engine = engine
        self.device = engine.device
        self.capture_enabled = self.device.type == "cuda"
        wanted = sorted(
            {int(b) for b in (buckets or default_buckets(engine.max_batch)) if 1 <= int(b) <= engine.max_batch}
            | {engine.max_batch}
        )
        self.buckets = wanted
        self.warmup = warmup
        self.static: dict[int, dict[str, Any]] = {b: self._static(b) for b in self.buckets}
        # Mixed steps (module doc), keyed by their rows; their `slots` say which cache row each row uses.
        self.mixed_buckets = [int(mixed_rows)] if mixed_rows > 0 else []
        self.mixed_static: dict[int, dict[str, Any]] = {}
        for m in self.mixed_buckets:
            st = self.mixed_static[m] = self._static(m)
            st["slots"] = torch.zeros((m,), dtype=torch.long, device=self.device)
            st["host_slots"] = torch.zeros((m,), dtype=torch.long, pin_memory=self.capture_enabled)
        self.pool: Any = None  # torch.cuda.graph_pool_handle() of the current graphs
        self.captures = 0
        self.last_capture_s: float | None = None
        self.replays = 0
        self.mixed_steps = 0
        # GPU ms a mixed step costs beyond a full decode step, measured after each capture (None
        # without captured graphs): the scheduler weighs it against the prefill pass it would save.
        self.mixed_extra_ms: float | None = None
        self.fed_steps = 0  # steps run ahead on the inputs the previous step fed
        self.mixed_fed_steps = 0  # mixed steps queued ahead, their decode rows fed by the step before
        # Called whenever the graphs start to replay other forwards (a capture, a kept set put back).
        self.on_forwards_changed: list[Callable[[], None]] = []
        self.fed_bucket: int | None = None  # the bucket whose inputs hold what its last step fed
        self._next_buffer = 0  # which of a bucket's two host token buffers the next copy fills

    def _static(self, b: int) -> dict[str, Any]:
        """A bucket's static buffers (inputs, fed tokens, host copies), its graph and logits."""
        engine = self.engine
        return {
            "ids": torch.zeros((b, 1), dtype=torch.long, device=self.device),
            "pos": torch.full((b,), engine.cache.scratch_position, dtype=torch.long, device=self.device),
            "host_ids": torch.zeros((b, 1), dtype=torch.long, pin_memory=self.capture_enabled),
            "host_pos": torch.zeros((b,), dtype=torch.long, pin_memory=self.capture_enabled),
            # greedy tokens of the last step (fed back as the next step's ids), and two host
            # buffers for them: step k's copy may still be read while step k+1's is queued
            "next": torch.zeros((b,), dtype=torch.long, device=self.device),
            "host_next": [torch.zeros((b,), dtype=torch.long, pin_memory=self.capture_enabled) for _ in range(2)],
            # a mixed step fed on the device: the row of its outputs each row takes, and its position
            "host_feed": torch.zeros((2, b), dtype=torch.long, pin_memory=self.capture_enabled),
            "copied": None,  # event after the last copy of the host buffers: rewrite them only once it passed
            "graph": None,
            "logits": None,
            "slots": None,
        }

    def _all_static(self) -> list[tuple[int | str, dict[str, Any]]]:
        """Every bucket's state, decode buckets by their rows, mixed ones as "mixed:<rows>"."""
        return [*self.static.items(), *((f"mixed:{m}", st) for m, st in self.mixed_static.items())]

    # ------------------------------------------------------------------ the captured step
    def step(self, b: int) -> torch.Tensor:
        return self._step(self.static[b])

    def _step(self, st: dict[str, Any]) -> torch.Tensor:
        cache = self.engine.cache
        cache.set_decode(st["ids"].shape[0], st["pos"], cache.max_len, st["slots"])
        mask = decode_mask(st["pos"], cache.max_len, self.engine._arange, self.engine.dtype)
        with torch.no_grad():
            logits = self.engine._forward(st["ids"], st["pos"][:, None], mask)[:, -1, :]
            # Run-ahead feed (see the module doc): greedy tokens in, live rows one position on.
            st["next"].copy_(logits.argmax(dim=-1))
            st["ids"].copy_(st["next"][:, None])
            last = cache.scratch_position - 1
            st["pos"].copy_(torch.where(st["pos"] >= last, cache.scratch_position, st["pos"] + 1))
            return logits

    def bucket_for(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch {n} exceeds the largest graph bucket {self.buckets[-1]}")

    def _load_inputs(
        self, st: dict[str, Any], tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int] = ()
    ) -> None:
        b = st["ids"].shape[0]
        n = len(tokens)
        scratch = self.engine.cache.scratch_position
        self._host_buffers_free(st)
        host_ids, host_pos = st["host_ids"], st["host_pos"]
        host_ids[:n, 0] = torch.as_tensor(list(tokens), dtype=torch.long)
        host_pos[:n] = torch.as_tensor(list(positions), dtype=torch.long)
        if n < b:
            host_ids[n:] = 0
            host_pos[n:] = scratch
        st["ids"].copy_(host_ids, non_blocking=True)
        st["pos"].copy_(host_pos, non_blocking=True)
        if st["slots"] is not None:  # padding rows: any slot, they write its scratch position only
            host_slots = st["host_slots"]
            host_slots[:n] = torch.as_tensor(list(slots), dtype=torch.long)
            host_slots[n:] = 0
            st["slots"].copy_(host_slots, non_blocking=True)
        self._inputs_copied(st)
        self.fed_bucket = None

    def _host_buffers_free(self, st: dict[str, Any]) -> None:
        """Wait until the last copy from `st`'s host buffers ran: a step queued ahead may not have."""
        if st["copied"] is not None:
            st["copied"].synchronize()
            st["copied"] = None

    def _inputs_copied(self, st: dict[str, Any]) -> None:
        if self.capture_enabled:
            st["copied"] = torch.cuda.Event()
            st["copied"].record()

    def decode(self, tokens: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """One decode step for rows 0..n-1; returns logits [n, V] (a view valid until the next step)."""
        n = len(tokens)
        b = self.bucket_for(n)
        self._load_inputs(self.static[b], tokens, positions)
        return self._run(b)[:n]

    def mixed_capacity(self) -> int:
        return max(self.mixed_buckets, default=0)

    def _mixed_state(self, rows: int) -> dict[str, Any]:
        """The smallest mixed graph's state that holds `rows` rows."""
        m = next((m for m in self.mixed_buckets if m >= rows), None)
        if m is None:
            raise ValueError(f"a mixed step of {rows} rows exceeds the mixed graph's {self.mixed_capacity()}")
        return self.mixed_static[m]

    def mixed(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> torch.Tensor:
        """One mixed step: row r feeds tokens[r] at positions[r] into cache row slots[r]; logits
        [n, V] (a view valid until the next step). Feeds no later step."""
        n = len(tokens)
        st = self._mixed_state(n)
        self._load_inputs(st, tokens, positions, slots)
        self.mixed_steps += 1
        logits = self._replay(st)
        self.fed_bucket = None
        return logits[:n]

    def mixed_fed(self, n: int, joining: Sequence[tuple[int, Sequence[int]]], rows: int) -> PendingTokens:
        """A mixed step queued right behind a decode step of `n` rows, before the host has read that
        step's tokens: the decode rows' inputs are what the step fed on the device (its greedy tokens,
        positions one on), the prompt rows of the requests joining come from the host (`joining`:
        each one's cache row and prompt). A row of the step whose cache row a request joins writes at
        scratch instead, so nothing overwrites the prompt. The step feeds the next decode step of
        `rows` rows (each decode row its next token, each joining row its first at the position after
        its prompt), so that step can be replayed at once (`decode_fed`); returns each of those rows'
        token of this step, on their way to the host."""
        b = self.bucket_for(n)
        if self.fed_bucket != b:
            raise RuntimeError(f"no step of bucket {b} to join (last fed: {self.fed_bucket})")
        st, fed = self._mixed_state(n + sum(len(prompt) for _, prompt in joining)), self.static[b]
        if self.capture_enabled and st["graph"] is None:  # a capture now would reset the inputs fed
            raise RuntimeError("no mixed graph captured to queue ahead")
        scratch = self.engine.cache.scratch_position
        joined = {slot for slot, _ in joining}
        # Rows 0..n-1 keep the fed inputs (-1) unless their cache row is joined; then the prompt rows.
        tokens, positions, slots = [0] * n, [scratch if r in joined else -1 for r in range(n)], list(range(n))
        last_row: dict[int, int] = {}
        for slot, prompt in joining:
            tokens += prompt
            positions += range(len(prompt))
            slots += [slot] * len(prompt)
            last_row[slot] = len(tokens) - 1
        self._load_inputs(st, tokens, positions, slots)
        st["ids"][:n].copy_(fed["ids"][:n])
        st["pos"][:n].copy_(torch.where(st["pos"][:n] < 0, fed["pos"][:n], st["pos"][:n]))
        self.mixed_steps += 1
        self.mixed_fed_steps += 1
        self._replay(st)
        # The next decode step's inputs, gathered from this step's outputs (its step already moved
        # every live row one position on); a joining row starts after its prompt, the rest at scratch.
        nxt = self.static[self.bucket_for(rows)]
        b_next = nxt["ids"].shape[0]
        source = [last_row.get(r, r if r < n else 0) for r in range(b_next)]
        start = [len(p) for _, p in joining]
        override = [-1 if r < n and r not in joined else scratch for r in range(b_next)]
        for (slot, _), pos in zip(joining, start):
            override[slot] = pos
        self._host_buffers_free(nxt)
        host = nxt["host_feed"]
        host[0, :b_next] = torch.as_tensor(source, dtype=torch.long)
        host[1, :b_next] = torch.as_tensor(override, dtype=torch.long)
        feed = host[:, :b_next].to(self.device, non_blocking=self.capture_enabled)
        nxt["ids"][:, 0].copy_(st["next"].index_select(0, feed[0]))
        nxt["pos"].copy_(torch.where(feed[1] < 0, st["pos"].index_select(0, feed[0]), feed[1]))
        self._inputs_copied(nxt)
        self.fed_bucket = self.bucket_for(rows)
        return self._copy_to_host(nxt, nxt["ids"][:rows, 0])

    def decode_fed(self, n: int) -> torch.Tensor:
        """The next step of the rows of the last step, on the inputs that step fed itself (its greedy
        tokens, positions one on); logits [n, V]. Only right after a step of the same bucket."""
        b = self.bucket_for(n)
        if self.fed_bucket != b:
            raise RuntimeError(f"no step of bucket {b} to run ahead from (last fed: {self.fed_bucket})")
        self.fed_steps += 1
        return self._run(b)[:n]

    def _run(self, b: int) -> torch.Tensor:
        logits = self._replay(self.static[b])
        self.fed_bucket = b
        return logits

    def _replay(self, st: dict[str, Any]) -> torch.Tensor:
        if not self.capture_enabled:
            return self._step(st)
        if st["graph"] is None:
            self.capture_all()
        st["graph"].replay()
        self.replays += 1
        return st["logits"]

    def greedy(self, n: int) -> torch.Tensor:
        """The last step's greedy tokens of rows 0..n-1, on the device (valid until the next step)."""
        return self.static[self.bucket_for(n)]["next"][:n]

    def copy_greedy(self, n: int) -> PendingTokens:
        """Queue the copy of the last step's greedy tokens (rows 0..n-1) to the host; read them with
        `.wait()`. Queued before the next step is replayed, so that step cannot overwrite them."""
        st = self.static[self.bucket_for(n)]
        return self._copy_to_host(st, st["next"][:n])

    def _copy_to_host(self, st: dict[str, Any], tokens: torch.Tensor) -> PendingTokens:
        """Queue the copy of `tokens` (a bucket's rows) into the next of its two host buffers."""
        n = tokens.shape[0]
        host = st["host_next"][self._next_buffer]
        self._next_buffer ^= 1
        host[:n].copy_(tokens, non_blocking=self.capture_enabled)
        event = None
        if self.capture_enabled:
            event = torch.cuda.Event()
            event.record()
        return PendingTokens(host[:n], event)

    # ------------------------------------------------------------------ capture
    def _reset_inputs(self, st: dict[str, Any]) -> None:
        self.fed_bucket = None
        st["ids"].zero_()
        st["pos"].fill_(self.engine.cache.scratch_position)
        if st["slots"] is not None:
            st["slots"].zero_()

    def capture_all(self) -> None:
        started = time.perf_counter()
        self._forwards_changed()
        states = [st for _, st in self._all_static()]
        for st in states:
            self._reset_inputs(st)
        if not self.capture_enabled:
            for st in states:
                self._step(st)  # static-shape eager path: still runs the new forwards once
            self.captures += 1
            self.last_capture_s = time.perf_counter() - started
            return
        for st in states:
            st["graph"], st["logits"] = None, None
        self.pool = None

        def warm_up() -> None:
            for st in states:
                for _ in range(self.warmup):
                    self._step(st)

        warm_up_on_side_stream(self.device, warm_up)
        # A fresh private pool per capture: the previous pool was released with the previous graphs,
        # and capturing into a released pool's handle trips the caching allocator.
        self.pool = torch.cuda.graph_pool_handle()
        for st in sorted(states, key=lambda st: -st["ids"].shape[0]):  # largest first: the rest reuse its pool
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self._step(st)
            st["graph"], st["logits"] = graph, logits
        torch.cuda.synchronize(self.device)
        self.mixed_extra_ms = self._measure_mixed_extra()
        self.captures += 1
        self.last_capture_s = time.perf_counter() - started

    def _measure_mixed_extra(self, replays: int = 5) -> float | None:
        """The mixed graph's replay time minus the largest decode bucket's (GPU ms, best of a few
        replays at the scratch slot, where replays may run while requests are in flight)."""
        if not self.mixed_static:
            return None
        mixed = min(min(self.replay_times_ms(st, replays)) for st in self.mixed_static.values())
        decode = min(self.replay_times_ms(self.static[self.buckets[-1]], replays))
        return mixed - decode

    def replay_times_ms(self, st: dict[str, Any], replays: int) -> list[float]:
        """GPU ms of each of `replays` replays of a captured step, at the scratch slot."""
        self._reset_inputs(st)
        times = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            st["graph"].replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            self._reset_inputs(st)  # a decode replay feeds its inputs: back to the scratch slot
        return times

    def captured(self) -> dict[str, Any]:
        """The graphs captured now (each bucket's graph and output, and their pool), to put back
        later with `use_captured` without capturing again: a paired measurement keeps one set with
        a swap and one without, and replays each in turn."""
        return {"graphs": {key: (st["graph"], st["logits"]) for key, st in self._all_static()}, "pool": self.pool}

    def use_captured(self, captured: dict[str, Any]) -> None:
        """Replay a set kept by `captured` from now on (the set replaced stays alive only while
        someone holds it)."""
        self._forwards_changed()
        states = dict(self._all_static())
        for key, (graph, logits) in captured["graphs"].items():
            states[key]["graph"], states[key]["logits"] = graph, logits
        self.pool = captured["pool"]

    def _forwards_changed(self) -> None:
        for callback in self.on_forwards_changed:
            callback()

    # ------------------------------------------------------------------ graph-path parity
    def _probe_inputs(self, st: dict[str, Any]) -> tuple[list[int], list[int], list[int]]:
        """Tokens, positions (all scratch) and slots of a bucket's probe step. Rows that share a slot
        also share their token, so their writes to its scratch position agree and the step is
        deterministic."""
        rows = st["ids"].shape[0]
        vocab = max(2, self.engine.vocab_size)
        slots = [r % self.engine.max_batch for r in range(rows)]
        tokens = [(97 * slot + 11) % vocab for slot in slots]
        return tokens, [self.engine.cache.scratch_position] * rows, slots

    def _states(self, keys: Sequence[int | str] | None) -> list[tuple[int | str, dict[str, Any]]]:
        states = self._all_static()
        return states if keys is None else [(key, st) for key, st in states if key in set(keys)]

    def reference_logits(self, buckets: Sequence[int | str] | None = None) -> dict[int | str, torch.Tensor]:
        """The eager static step's logits per bucket with the current forwards (at the scratch slot)."""
        out: dict[int | str, torch.Tensor] = {}
        for key, st in self._states(buckets):
            self._load_inputs(st, *self._probe_inputs(st))
            out[key] = self._step(st).float().clone()
            self._reset_inputs(st)
        return out

    def verify(
        self, buckets: Sequence[int | str] | None = None, previous: dict[int | str, torch.Tensor] | None = None
    ) -> dict[str, Any]:
        """Every bucket's graph replay equals the same step run eagerly with the current forwards
        (strict), and stays close to `previous` (the step before the swap; loose: a sanity bound)."""
        states = self._states(buckets)
        tol = graph_tolerance(self.engine.dtype)
        loose = 1e-2 if self.engine.dtype == torch.float32 else 0.25
        worst = 0.0
        worst_prev = 0.0
        for key, st in states:
            probe = self._probe_inputs(st)
            self._load_inputs(st, *probe)
            got = self._replay(st).float().clone()
            if self.capture_enabled:
                torch.cuda.synchronize(self.device)
            self._load_inputs(st, *probe)
            want = self._step(st).float()
            diff, scale = replay_error(got, want)
            worst = max(worst, diff / scale)
            if diff > tol * scale:
                raise GraphParityError(
                    f"graph path differs from the eager step at bucket {key}: max abs diff {diff:.3g} "
                    f"(tolerance {tol * scale:.3g})"
                )
            if previous is not None and key in previous:
                prev = previous[key]
                pdiff = float((got - prev).abs().max())
                worst_prev = max(worst_prev, pdiff / max(1.0, float(prev.abs().max())))
                if pdiff > loose * max(1.0, float(prev.abs().max())):
                    raise GraphParityError(
                        f"graph path with the new kernels moved the logits at bucket {key} by {pdiff:.3g} "
                        f"from the step before the swap (bound {loose:g} x scale)"
                    )
            self._reset_inputs(st)
        out = {
            "buckets": [key for key, _ in states],
            "max_rel_diff": worst,
            "captured": self.capture_enabled,
            "capture_s": self.last_capture_s,
        }
        if previous is not None:
            out["max_rel_diff_vs_previous"] = worst_prev
        return out

    def info(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "captured": self.capture_enabled,
            "buckets": self.buckets,
            "mixed_buckets": self.mixed_buckets,
            "mixed_steps": self.mixed_steps,
            "mixed_fed_steps": self.mixed_fed_steps,
            "mixed_extra_ms": self.mixed_extra_ms,
            "captures": self.captures,
            "last_capture_s": self.last_capture_s,
            "replays": self.replays,
            "fed_steps": self.fed_steps,
        }


class PendingTokens:
    """Greedy tokens on their way to the host: `wait()` blocks until the copy is done."""

    def __init__(self, host: torch.Tensor, event: Any = None):
        self._host = host
        self._event = event

    def wait(self) -> list[int]:
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


class GraphParityError(RuntimeError):
    pass
