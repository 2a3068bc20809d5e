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

Parts (one file each), composed: the `Engine` here owns a model runner
(`serving.runner.ModelRunner`: model, slot cache, forward passes), a scheduler
(`serving.scheduler.Scheduler`: model thread, queues, batching), a speed part
(`serving.speed.ServedSpeed`: benchmark, paired comparison, live speed) and a profiling part
(`serving.profiling.Profiling`: `/admin/profile`), and wires them to the swap engine and the
CUDA-graph decoder. The scheduler passes each forward pass to the runner as a
`serving.plan.StepPlan`; no part inherits another. The engine's own attributes are the public face
the server and tests use. Requests and observer hooks: `serving.request`; live shapes:
`serving.shapes`.

With `cuda_graphs=True` decode steps replay a CUDA graph per batch-size bucket (`serving.graphs`);
a one-row prefill replays a graph per prompt-length bucket (`serving.prefill_graphs`; more rows stay
eager). Greedy requests then run one step ahead (`run_ahead`): the scheduler queues
step k+1, fed on the device by step k, before it waits for step k's tokens. On a CPU the same
static-shape decode runs eagerly (for tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gpuyantra.binding import ModuleGroup, find_module_groups
from gpuyantra.swap.engine import SwapEngine
from gpuyantra.swap.records import SwapRecord
from serving.cache import SlotCache
from serving.models import LoadedModel
from serving.profiling import Profiling
from serving.request import EngineObserver, GenRequest, RequestError
from serving.runner import ModelRunner
from serving.sampling import token_logprobs
from serving.scheduler import Scheduler
from serving.shapes import ShapeRecorder
from serving.speed import ServedSpeed

if TYPE_CHECKING:
    from serving.graphs import GraphDecoder
    from serving.prefill_graphs import PrefillGraphs

__all__ = ["Engine", "GenRequest", "RequestError", "token_logprobs"]  # the last three: re-exported for tests


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
        fuse_norms: str = "auto",
        graph_buckets: Sequence[int] | None = None,
        run_ahead: bool = True,
        prefill_graphs: bool = True,
        mixed_prompt_tokens: int | None = None,
        observer: EngineObserver | None = None,
        max_parity_shapes: int = 4,
        self_check: bool = True,
    ):
        self.runner = ModelRunner(
            loaded,
            max_batch=max_batch,
            max_seq_len=max_seq_len,
            decode_attention=decode_attention,
            fuse_projections=fuse_projections,
            fuse_norms=fuse_norms,
            observer=observer,
        )
        runner = self.runner
        groups = find_module_groups(runner.model)
        self.shapes = ShapeRecorder(runner.model, groups)
        captured = cuda_graphs and runner.device.type == "cuda"  # graphs replayed, their cost measured
        mixed = mixed_tokens(mixed_prompt_tokens, captured, max_batch)
        if cuda_graphs:
            from serving.graphs import GraphDecoder

            runner.graphs = GraphDecoder(runner, graph_buckets, mixed_rows=max_batch + mixed if mixed else 0)
            if prefill_graphs:
                from serving.prefill_graphs import PrefillGraphs

                runner.prefill_graphs = PrefillGraphs(runner)
                runner.graphs.on_forwards_changed.append(runner.prefill_graphs.invalidate)
        self.swaps = SwapEngine(
            runner.model,
            state_dir,
            model_id=runner.model_name,
            shapes_provider=self.shapes.shapes_for,
            default_rows=[(1, 1), (min(max_batch, 8), 1), (1, 16)],
            max_parity_shapes=max_parity_shapes,
            before_commit=self._before_commit if runner.graphs is not None else None,
            after_restore=self._after_restore if runner.graphs is not None else None,
            on_event=runner.observer.on_swap_event,
        )
        self.scheduler = Scheduler(runner, self.swaps, run_ahead=run_ahead, mixed_prompt_tokens=mixed)
        self.speed = ServedSpeed(runner, self.scheduler, self.swaps)
        self.profiling = Profiling(runner, self.scheduler, self.swaps, groups, self.shapes)
        # The parts' public methods, as the engine's own (what the server's routes and tests call).
        self.prefill_row, self.prefill_rows = runner.prefill_row, runner.prefill_rows
        self.last_logits, self.self_check, self.eager_prefill = (
            runner.last_logits,
            runner.self_check,
            runner.eager_prefill,
        )
        scheduler = self.scheduler
        self.start, self.stop, self.call = scheduler.start, scheduler.stop, scheduler.call
        self.submit, self.validate, self.generate = scheduler.submit, scheduler.validate, scheduler.generate
        self.mixed_info, self.mixed_pays = scheduler.mixed_info, scheduler.mixed_pays
        self.decode_timing = scheduler.decode_timing
        self.benchmark, self.compare_swap, self.live_speed = (
            self.speed.benchmark,
            self.speed.compare_swap,
            self.speed.live_speed,
        )
        profiling = self.profiling
        self.profile, self.served_decode_batches = profiling.profile, profiling.served_decode_batches
        self.function_sites, self.live_shapes = profiling.function_sites, profiling.live_shapes
        self.self_check_report: dict[str, Any] | None = None
        if self_check:
            self.self_check_report = runner.self_check()
        if runner.graphs is not None:
            runner.graphs.capture_all()

    # ================================================================== swaps (model thread)
    def _before_commit(self, record: SwapRecord) -> dict[str, Any]:
        """Graph mode: re-capture every bucket with the new forwards, then check parity on graphs."""
        graphs = self.runner.graphs
        assert graphs is not None
        with self.swaps.previous_forwards():
            reference = graphs.reference_logits()
        graphs.capture_all()
        return {"graph": graphs.verify(previous=reference)}

    def _after_restore(self) -> None:
        if self.runner.graphs is not None:
            self.runner.graphs.capture_all()

    # ================================================================== the model (runner)
    @property
    def model(self) -> torch.nn.Module:
        return self.runner.model

    @property
    def tokenizer(self) -> Any:
        return self.runner.tokenizer

    @property
    def model_name(self) -> str:
        return self.runner.model_name

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.runner.dtype

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    @property
    def max_batch(self) -> int:
        return self.runner.max_batch

    @property
    def max_len(self) -> int:
        return self.runner.max_len

    @property
    def usable_len(self) -> int:
        return self.runner.usable_len

    @property
    def cache(self) -> SlotCache:
        return self.runner.cache

    @property
    def observer(self) -> EngineObserver:
        return self.runner.observer

    @property
    def graphs(self) -> GraphDecoder | None:
        return self.runner.graphs

    @property
    def prefill_graphs(self) -> PrefillGraphs | None:
        return self.runner.prefill_graphs

    @prefill_graphs.setter
    def prefill_graphs(self, graphs: PrefillGraphs | None) -> None:
        self.runner.prefill_graphs = graphs

    @property
    def decode_attention(self) -> Any:
        return self.runner.decode_attention

    @property
    def fused_projections(self) -> int:
        return self.runner.fused_projections

    @property
    def fused_residual_norms(self) -> int:
        return self.runner.fused_residual_norms

    @property
    def norm_fusion_refused(self) -> str | None:
        return self.runner.norm_fusion_refused

    @property
    def forward_passes(self) -> int:
        return self.runner.forward_passes

    # ================================================================== requests (scheduler)

    @property
    def alive(self) -> bool:
        return self.scheduler.alive

    @property
    def ready(self) -> bool:
        return self.scheduler.ready

    @property
    def active_count(self) -> int:
        return self.scheduler.active_count

    @property
    def waiting_count(self) -> int:
        return self.scheduler.waiting_count

    @property
    def run_ahead(self) -> bool:
        return self.scheduler.run_ahead

    @run_ahead.setter
    def run_ahead(self, on: bool) -> None:
        self.scheduler.run_ahead = on

    @property
    def mixed_prompt_tokens(self) -> int:
        return self.scheduler.mixed_prompt_tokens

    @mixed_prompt_tokens.setter
    def mixed_prompt_tokens(self, tokens: int) -> None:
        self.scheduler.mixed_prompt_tokens = tokens

    @property
    def mixed_admissions(self) -> int:
        return self.scheduler.mixed_admissions

    @property
    def steps_queued_from_host(self) -> int:
        return self.scheduler.steps_queued_from_host

    # ================================================================== profiles
    @property
    def groups(self) -> list[ModuleGroup]:
        return self.profiling.groups


MIXED_ROW_TILE = 64  # the mixed graph's rows fill whole tiles of this many rows (see `mixed_tokens`)
MIXED_MIN_PROMPT_TOKENS = 32  # the default budget leaves at least this many rows to prompts


def mixed_tokens(wanted: int | None, captured: bool, max_batch: int) -> int:
    """Prompt tokens a mixed step takes (`serving.scheduler`). By default, with captured CUDA graphs
    (where the mixed step's extra GPU time is measured and weighed against the prefill passes it
    replaces), what fills the mixed graph's rows up to a whole number of MIXED_ROW_TILE-row tiles
    beside the `max_batch` decode rows: 56 at batch 8. The projections' matmuls take rows in
    64-row tiles, and one more row costs a tile. On an H200 after a campaign (Qwen2.5-1.5B, batch 8;
    docs/perf/2026-12-03-h200-d.md) a mixed step cost 0.43-0.51 ms more than a decode step at 48-64
    rows and 0.82-0.83 ms at 72-80; eight HTTP streams decoded at 4446-4500 tokens/s with 56 prompt
    tokens against 4360-4391 with 64, three runs each. Off (0) without captured graphs."""
    if wanted is None:
        if not captured:
            return 0
        tiles = -(-(max_batch + MIXED_MIN_PROMPT_TOKENS) // MIXED_ROW_TILE)
        return tiles * MIXED_ROW_TILE - max_batch
    if wanted < 0:
        raise ValueError("mixed_prompt_tokens must be 0 (off) or more")
    return int(wanted)
