"""CUDA-graph prefill of one row: the prompt is right-padded to a length bucket and the forward pass
replays a graph captured for that bucket.

Why: prefill runs eagerly and is launch-bound. On an H200 a 32-token prompt of the Qwen2.5-1.5B
architecture took 41 ms to its first token before a campaign and 63 ms after it (each swapped
kernel's Python launcher runs in the eager pass), where its GPU work is about a millisecond; through
HTTP every request pays that before its first token, as much time as 45 decode steps.

Static state per bucket L (16, 32, ... up to 512 tokens and the usable context): one packed device
tensor holding the padded ids [1, L], the cache row the pass writes [1] and the index of the last
prompt token [1], loaded with one host-to-device copy; the positions 0..L-1 and the causal mask
[1, 1, L, L]; the captured logits [1, V] at the last prompt token. Padding positions write the row's
cache slots past the prompt, as batched prefill does: decode overwrites each slot before attending
to it, and the causal mask keeps every prompt position from seeing them.

A bucket is captured at its first use: the pass runs eagerly on the real prompt (that request's
prefill, and the reference), again on a side stream (warm-up), is captured, replayed and compared
with the eager logits. A bucket whose capture raises or whose replay differs runs eagerly from then
on, with a warning. `invalidate()` drops every graph when the forwards change (a swap, a rollback,
a paired measurement switching graph sets). Several rows admitted together replay a graph each when
all their prompts are short (`takes_rows`), else they share one eager pass; prompts past the largest
bucket stay eager. Without CUDA the same padded static-shape pass runs eagerly (tests).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from serving.cache import SlotCache, prefill_mask
from serving.graphs import graph_tolerance, replay_error, warm_up_on_side_stream

log = logging.getLogger("gpuyantra.serving")

MIN_BUCKET, MAX_BUCKET = 16, 512  # prompt-length buckets: powers of two between these
# Several rows admitted together are prefilled one graph replay each when every prompt fits a bucket
# up to this length. Why: an eager multi-row pass is launch-bound (tens of ms on the 1.5B model: every
# module and swapped kernel's launcher runs on the host) while a short bucket's replay is GPU work of
# a millisecond or two; past this length the rows' GPU work dominates and one wide pass uses the GPU
# better than several narrow ones.
ROWWISE_MAX_BUCKET = 128


class PrefillHost(Protocol):
    """What PrefillGraphs uses of the model runner that owns it (serving.runner.ModelRunner)."""

    @property
    def device(self) -> torch.device: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def cache(self) -> SlotCache: ...
    @property
    def _arange(self) -> torch.Tensor: ...

    def _forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor,
        keep: int | torch.Tensor | None = None,
    ) -> torch.Tensor: ...


def length_buckets(usable_len: int) -> list[int]:
    """Padded prompt lengths a graph is captured for: 16, 32, ... while within MAX_BUCKET and the context."""
    out, length = [], MIN_BUCKET
    while length <= min(MAX_BUCKET, usable_len):
        out.append(length)
        length *= 2
    return out


class PrefillGraphs:
    def __init__(self, engine: PrefillHost):
        self.engine = engine
        self.device = engine.device
        self.capture_enabled = self.device.type == "cuda"
        self.buckets = length_buckets(engine.cache.usable_len)
        self.static: dict[int, dict[str, Any]] = {}
        self.broken: dict[int, str] = {}  # bucket -> why it runs eagerly
        self.captures = 0
        self.replays = 0

    def bucket_for(self, length: int) -> int | None:
        return next((b for b in self.buckets if b >= length), None)

    def run(self, row: int, prompt_ids: Sequence[int]) -> torch.Tensor | None:
        """Prefill cache row `row` with the prompt; the last prompt position's logits [1, V] (valid
        until the next prefill), or None where this prompt runs eagerly (no bucket, a broken one)."""
        length = self.bucket_for(len(prompt_ids))
        if length is None or length in self.broken:
            return None
        st = self._state(length)
        self._load(st, row, prompt_ids)
        if not self.capture_enabled:
            return self._step(st)
        if st["graph"] is None:
            return self._capture(length, st)
        st["graph"].replay()
        self.replays += 1
        return st["logits"]

    def takes_rows(self, prompts: Sequence[Sequence[int]]) -> bool:
        """Prefill these prompts one replay per row? Each fits a working bucket of at most
        ROWWISE_MAX_BUCKET tokens."""
        buckets = [self.bucket_for(len(p)) for p in prompts]
        return all(b is not None and b <= ROWWISE_MAX_BUCKET and b not in self.broken for b in buckets)

    def invalidate(self) -> None:
        """The forwards changed: every bucket captures again at its next use (broken ones get a new try)."""
        for st in self.static.values():
            st["graph"], st["logits"] = None, None
        self.broken.clear()

    def info(self) -> dict[str, Any]:
        captured = sorted(b for b, st in list(self.static.items()) if st["graph"] is not None)
        return {
            "buckets": self.buckets,
            "captured": captured,
            "broken": dict(self.broken),
            "captures": self.captures,
            "replays": self.replays,
        }

    # ------------------------------------------------------------------ the static pass
    def _state(self, length: int) -> dict[str, Any]:
        st = self.static.get(length)
        if st is None:
            packed = torch.zeros(length + 2, dtype=torch.long, device=self.device)  # ids, row, last
            st = self.static[length] = {
                "packed": packed,
                "host": torch.zeros(length + 2, dtype=torch.long, pin_memory=self.capture_enabled),
                "ids": packed[:length].view(1, length),
                "row": packed[length : length + 1],
                "last": packed[length + 1 :],
                "positions": self.engine._arange[:length][None],
                "mask": prefill_mask(length, 0, self.engine.dtype, self.device),
                "graph": None,
                "logits": None,
            }
        return st

    def _load(self, st: dict[str, Any], row: int, prompt_ids: Sequence[int]) -> None:
        length, n = st["ids"].shape[1], len(prompt_ids)
        host = st["host"]
        host[:n] = torch.as_tensor(list(prompt_ids), dtype=torch.long)
        host[n:length] = 0
        host[length] = row
        host[length + 1] = n - 1
        st["packed"].copy_(host, non_blocking=self.capture_enabled)

    def _step(self, st: dict[str, Any]) -> torch.Tensor:
        self.engine.cache.set_prefill_rows(st["row"])
        with torch.no_grad():
            logits = self.engine._forward(st["ids"], st["positions"], st["mask"], keep=st["last"])
            if logits.shape[1] != 1:  # a model without logits_to_keep: every position came back
                return logits[0].index_select(0, st["last"])
            return logits[:, 0, :]

    def _capture(self, length: int, st: dict[str, Any]) -> torch.Tensor | None:
        """Eager pass (this request's prefill and the reference), warm-up, capture, replay, compare."""
        try:
            want = self._step(st).clone()
            warm_up_on_side_stream(self.device, lambda: self._step(st))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # a private pool per bucket: buckets replay in any order
                logits = self._step(st)
            graph.replay()
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # noqa: BLE001 - this bucket runs eagerly from now on
            self.broken[length] = f"capture failed: {type(exc).__name__}: {exc}"[:500]
            log.warning("prefill graph of %d tokens: %s; eager prefill there", length, self.broken[length])
            return None
        tol = graph_tolerance(self.engine.dtype)
        diff, scale = replay_error(logits, want)
        if diff > tol * scale:
            self.broken[length] = f"replay differs from the eager pass by {diff:.3g} (tolerance {tol * scale:.3g})"
            log.warning("prefill graph of %d tokens: %s; eager prefill there", length, self.broken[length])
            return want
        st["graph"], st["logits"] = graph, logits
        self.captures += 1
        return logits
