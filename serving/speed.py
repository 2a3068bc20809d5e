"""Served decode speed on the live path: a benchmark run on an idle engine, and live speed judged
from the decode steps of real traffic without pausing it."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from gpuyantra.served_speed import paired_drops, phase_order, repeat_spread
from gpuyantra.swap.engine import SwapEngine
from serving.request import RequestError
from serving.runner import ModelRunner
from serving.scheduler import Scheduler

MAX_GENERATIONS_PER_REPEAT = 1000  # bounds one benchmark repeat however small min_repeat_s is against the step time


class ServedSpeed:
    """The engine's speed part: benchmarks and paired comparisons run on the model thread with the
    scheduler idle (through `Scheduler.call(..., exclusive=True)`), live speed read off its traffic."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, swaps: SwapEngine) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.swaps = swaps

    def benchmark(
        self, max_tokens: int = 16, prompt_tokens: int = 8, batch: int = 1, repeats: int = 1, min_repeat_s: float = 0.0
    ) -> dict[str, Any]:
        """Served decode speed on the live path (graphs when enabled), measured in this process.

        `repeats` timed repeats, each generating again until it has run `min_repeat_s` (a single
        short generation is mostly timer and launch noise). `tokens_per_s` is the median repeat; the
        spread of the repeats (min, max, (max - min) / median, 1.4826 * MAD / median) says how far
        two measurements may differ by noise alone."""
        if self.scheduler.active_count:
            raise RuntimeError("benchmark needs an idle engine (run it through call(..., exclusive=True))")
        if not 1 <= batch <= self.runner.max_batch:
            raise RequestError(f"batch must be between 1 and max_batch ({self.runner.max_batch})")
        if prompt_tokens < 1 or max_tokens < 1 or prompt_tokens + max_tokens > self.runner.usable_len:
            raise RequestError(f"prompt_tokens + max_tokens must be within the context ({self.runner.usable_len})")
        vocab = max(2, self.runner.vocab_size)
        prompts = [[(31 * i + 17 * r + 5) % vocab for i in range(prompt_tokens)] for r in range(batch)]
        cuda = self.runner.device.type == "cuda"

        def sync():
            if cuda:
                torch.cuda.synchronize(self.runner.device)

        def run(steps: int) -> tuple[float, float, list[list[int]]]:
            sync()
            t0 = time.perf_counter()
            last = []
            for r, prompt in enumerate(prompts):
                last.append(int(self.runner.prefill_row(r, prompt)[0].argmax()))
            sync()
            t1 = time.perf_counter()
            outs = [[t] for t in last]
            for tokens in self._greedy_steps(last, [prompt_tokens] * batch, steps):
                for r in range(batch):
                    outs[r].append(tokens[r])
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

    def _greedy_steps(self, tokens: list[int], positions: list[int], steps: int) -> list[list[int]]:
        """`steps` greedy decode steps of rows 0..n-1 from (tokens, positions), each step's tokens, as
        the scheduler serves greedy rows: with graphs and run-ahead on, step k+1 is queued before
        the host reads step k's tokens."""
        graphs, n = self.runner.graphs, len(tokens)
        out: list[list[int]] = []
        if graphs is None or not self.scheduler.run_ahead:
            for _ in range(steps):
                tokens = self.runner.decode_rows(tokens, positions).argmax(dim=-1).tolist()
                out.append(tokens)
                positions = [p + 1 for p in positions]
            return out
        graphs.decode(tokens, positions)
        pending = graphs.copy_greedy(n)
        for k in range(steps):
            ahead = None
            if k + 1 < steps:
                graphs.decode_fed(n)
                ahead = graphs.copy_greedy(n)
            out.append(pending.wait())
            if ahead is not None:
                pending = ahead
        return out

    def compare_swap(
        self,
        swap_id: str,
        batches: list[int],
        rounds: int = 3,
        max_tokens: int = 16,
        prompt_tokens: int = 8,
        repeats: int = 2,
        min_repeat_s: float = 0.2,
    ) -> dict[str, Any]:
        """Served decode speed with one active swap on and off in turns (`phase_order`: on, off,
        off, on, ...), each phase a short `benchmark` at every batch; with CUDA graphs, each side is
        captured once and its graphs replayed in its phases. Rounds measured minutes apart would
        carry drift; pairs measured seconds apart share it. Needs an idle engine; the swap is always
        on again at the end."""
        if self.scheduler.active_count:
            raise RuntimeError("compare_swap needs an idle engine (run it through call(..., exclusive=True))")
        for batch in batches:
            if not 1 <= batch <= self.runner.max_batch:
                raise RequestError(f"batch must be between 1 and max_batch ({self.runner.max_batch})")
        samples: dict[int, dict[bool, list[float]]] = {b: {True: [], False: []} for b in batches}
        order = phase_order(rounds)
        started = time.perf_counter()
        graph_sets: dict[bool, dict[str, Any]] = {}
        with self.runner.eager_prefill(), self.swaps.suspension(swap_id) as use:
            try:
                # One capture per side, kept: each phase then replays its side's graphs.
                for on in (False, True):
                    use(on)
                    if self.runner.graphs is not None:
                        self.runner.graphs.capture_all()
                        graph_sets[on] = self.runner.graphs.captured()
                for on in order:
                    use(on)
                    if self.runner.graphs is not None:
                        self.runner.graphs.use_captured(graph_sets[on])
                    for batch in batches:
                        answer = self.benchmark(max_tokens, prompt_tokens, batch, repeats, min_repeat_s)
                        samples[batch][on].append(float(answer["tokens_per_s"]))
            finally:
                use(True)  # the forwards and graphs hold the swap again
                if self.runner.graphs is not None:
                    if True in graph_sets:
                        self.runner.graphs.use_captured(graph_sets[True])
                    else:
                        self.runner.graphs.capture_all()
        return {
            "swap_id": swap_id,
            "measured": "paired",
            "rounds": rounds,
            "order": ["with" if side else "without" for side in order],
            "seconds": time.perf_counter() - started,
            "batches": [
                {
                    "batch": batch,
                    "with": repeat_spread(samples[batch][True]),
                    "without": repeat_spread(samples[batch][False]),
                    "drops": paired_drops(samples[batch][True], samples[batch][False]),
                }
                for batch in batches
            ],
            **self._served_state(),
        }

    def _served_state(self) -> dict[str, Any]:
        """What a speed figure was measured on: decode path, swaps in, device, dtype, model."""
        path = "eager"
        if self.runner.graphs is not None:
            path = "cuda-graphs" if self.runner.graphs.capture_enabled else "static-eager"
        return {
            "path": path,
            "run_ahead": self.runner.graphs is not None and self.scheduler.run_ahead,
            "active_swaps": self.swaps.active_ids(),
            "device": str(self.runner.device),
            "dtype": str(self.runner.dtype).replace("torch.", ""),
            "model": self.runner.model_name,
        }

    def live_speed(self, batch: int, window_s: float, min_steps: int, repeats: int = 5) -> dict[str, Any]:
        """Served decode speed from the live steps of the next `window_s` seconds at `batch` full rows
        (called off the engine thread; traffic is not paused). `{"measured": "none", "reason": ...}`
        when there is no such traffic: at once when nothing is decoding, else after the window."""
        if not self.scheduler.active_count:
            return {"measured": "none", "reason": "no live traffic is decoding now"}
        start = time.monotonic()
        deadline = start + window_s
        while time.monotonic() < deadline:
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        steps = [s for s in list(self.scheduler.traffic.live_steps) if s[0] > start and s[1] == batch and s[2] == batch]
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
