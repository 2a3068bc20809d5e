"""The step plan: one forward pass the scheduler asks of the model runner.

The scheduler decides what a pass holds (which cache rows prefill, which decode and at what
positions, whether a captured CUDA graph replays it and at which bucket); the runner only executes
the plan (`ModelRunner.run`). Why a record: the two parts share no state but this, so each can be
read and tested on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

StepKind = Literal["prefill", "decode", "mixed"]


@dataclass(frozen=True)
class StepPlan:
    """One forward pass.

    - `prefill`: `rows` are the cache rows prefilled, `prompts[i]` the prompt of `rows[i]`.
    - `decode`: input row r feeds `tokens[r]` at `positions[r]` into cache row r; `kv_len` bounds the
      positions an eager step attends to (None: up to the furthest row); `graph_bucket` is the
      captured graph's batch bucket when the step replays one (None: eager).
    - `mixed`: a decode-shaped pass whose input row r feeds `tokens[r]` at `positions[r]` into cache
      row `rows[r]` (decoding rows, then the prompt tokens of the requests joining).
    """

    kind: StepKind
    rows: tuple[int, ...] = ()
    tokens: tuple[int, ...] = ()
    positions: tuple[int, ...] = ()
    prompts: tuple[tuple[int, ...], ...] = ()
    kv_len: int | None = None
    graph_bucket: int | None = None

    @classmethod
    def prefill(cls, rows: Sequence[int], prompts: Sequence[Sequence[int]]) -> StepPlan:
        if len(rows) != len(prompts) or not rows:
            raise ValueError("a prefill plan needs one prompt per cache row, at least one")
        return cls("prefill", rows=tuple(rows), prompts=tuple(tuple(p) for p in prompts))

    @classmethod
    def decode(
        cls,
        tokens: Sequence[int],
        positions: Sequence[int],
        *,
        kv_len: int | None = None,
        graph_bucket: int | None = None,
    ) -> StepPlan:
        if len(tokens) != len(positions) or not tokens:
            raise ValueError("a decode plan needs one position per token, at least one")
        if graph_bucket is not None and graph_bucket < len(tokens):
            raise ValueError(f"graph bucket {graph_bucket} is smaller than the step's {len(tokens)} rows")
        return cls(
            "decode",
            rows=tuple(range(len(tokens))),
            tokens=tuple(tokens),
            positions=tuple(positions),
            kv_len=kv_len,
            graph_bucket=graph_bucket,
        )

    @classmethod
    def mixed(cls, tokens: Sequence[int], positions: Sequence[int], rows: Sequence[int]) -> StepPlan:
        if not len(tokens) == len(positions) == len(rows) or not tokens:
            raise ValueError("a mixed plan needs a position and a cache row per token, at least one")
        return cls("mixed", rows=tuple(rows), tokens=tuple(tokens), positions=tuple(positions))

    @property
    def input_rows(self) -> int:
        """Rows of the forward pass (a prefill's rows, a decode or mixed step's input rows)."""
        return len(self.rows) if self.kind == "prefill" else len(self.tokens)
