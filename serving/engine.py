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

Layers (one file each): `serving.runner.ModelRunner` (model, slot cache, forward passes) <-
`serving.scheduler.Scheduler` (model thread, queues, batching) <- `serving.speed.ServedSpeed`
(benchmark, live speed) and `serving.profiling.Profiling` (`/admin/profile`) <- `Engine` here, which
wires them to the swap engine and the CUDA-graph decoder. Requests and observer hooks:
`serving.request`; live shapes: `serving.shapes`.

With `cuda_graphs=True` decode steps replay a CUDA graph per batch-size bucket (`serving.graphs`);
a one-row prefill replays a graph per prompt-length bucket (`serving.prefill_graphs`; more rows stay
eager). Greedy requests then run one step ahead (`run_ahead`): the scheduler queues
step k+1, fed on the device by step k, before it waits for step k's tokens. On a CPU the same
static-shape decode runs eagerly (for tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuyantra.binding import find_module_groups
from gpuyantra.swap.engine import SwapEngine
from gpuyantra.swap.records import SwapRecord
from serving.models import LoadedModel
from serving.profiling import Profiling
from serving.request import EngineObserver, GenRequest, RequestError
from serving.scheduler import token_logprobs
from serving.shapes import ShapeRecorder
from serving.speed import ServedSpeed

__all__ = ["Engine", "GenRequest", "RequestError", "token_logprobs"]  # the last three: re-exported for tests


class Engine(ServedSpeed, Profiling):
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
        super().__init__(
            loaded,
            max_batch=max_batch,
            max_seq_len=max_seq_len,
            decode_attention=decode_attention,
            fuse_projections=fuse_projections,
            fuse_norms=fuse_norms,
            observer=observer,
        )
        self.groups = find_module_groups(self.model)
        self._open_groups_found = False
        self.shapes = ShapeRecorder(self.model, self.groups)
        self._init_scheduler()
        self.run_ahead = run_ahead
        captured = cuda_graphs and str(self.device).startswith("cuda")  # graphs replayed, their cost measured
        self.mixed_prompt_tokens = mixed_tokens(mixed_prompt_tokens, captured, max_batch)
        self.graphs = None
        if cuda_graphs:
            from serving.graphs import GraphDecoder

            mixed_rows = max_batch + self.mixed_prompt_tokens if self.mixed_prompt_tokens else 0
            self.graphs = GraphDecoder(self, graph_buckets, mixed_rows=mixed_rows)
            if prefill_graphs:
                from serving.prefill_graphs import PrefillGraphs

                self.prefill_graphs = PrefillGraphs(self)
                self.graphs.on_forwards_changed.append(self.prefill_graphs.invalidate)
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
