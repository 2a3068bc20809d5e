"""The model runner: the model, its slot cache and the forward passes over it (prefill, decode).

The scheduler hands it one `serving.plan.StepPlan` per pass (`run`). `decode_rows` replays CUDA
graphs when the runner has a `GraphDecoder` (`serving.graphs`, which drives `_forward` itself), and
`prefill_row` when it has `PrefillGraphs` (`serving.prefill_graphs`); everything else here runs
eagerly. The runner knows nothing of requests, swaps or profiles: the engine (`serving.engine`)
owns it beside the scheduler, the speed and the profiling parts.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from serving.cache import SlotCache, decode_mask, prefill_mask
from serving.models import LoadedModel
from serving.plan import StepPlan
from serving.request import EngineObserver

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from serving.graphs import GraphDecoder
    from serving.prefill_graphs import PrefillGraphs


def _signature_params(model: torch.nn.Module) -> set[str]:
    try:
        return set(inspect.signature(type(model).forward).parameters)
    except (TypeError, ValueError):
        return set()


class ModelRunner:
    graphs: GraphDecoder | None = None  # set by the engine: CUDA-graph decode, or None (eager)
    prefill_graphs: PrefillGraphs | None = None  # set by the engine: CUDA-graph one-row prefill, or None

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        max_batch: int,
        max_seq_len: int | None,
        decode_attention: str,
        fuse_projections: str,
        fuse_norms: str = "auto",
        observer: EngineObserver | None,
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
        window = sliding_window_of(self.model.config)
        if window is not None and max_len > window + 1:
            # The engine passes one explicit causal mask to every layer, so a sliding-window layer
            # sees the whole context: it is right only while the context fits the window.
            log.warning(
                "context capped at %d tokens (not %d): the model's sliding-window layers attend to %d",
                window,
                max_len - 1,
                window,
            )
            max_len = window + 1
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
        self.norm_fusion_refused: str | None = None
        self.fused_residual_norms = self._fuse_norms(fuse_norms)
        self.forward_passes = 0

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

    def _fuse_norms(self, choice: str) -> int:
        """`on`: each pre-norm decoder layer's first residual add and post-attention norm run as one
        module call (`serving/norm_fusion.py`), kept only where the logits stay bitwise equal; `off`:
        as the modeling code wrote them. Returns the number of layers fused."""
        from serving import norm_fusion

        if not self._chosen("fuse_norms", choice, "on", "off"):
            norm_fusion.unfuse(self.model)
            return 0
        fused, self.norm_fusion_refused = norm_fusion.fuse(self.model)
        if self.norm_fusion_refused:
            log.warning("residual add + norm fusion not applied: %s", self.norm_fusion_refused)
        return fused

    @property
    def max_len(self) -> int:
        return self.cache.max_len

    @property
    def usable_len(self) -> int:
        return self.cache.usable_len

    # ================================================================== forward passes
    def run(self, plan: StepPlan) -> torch.Tensor:
        """Logits [input rows, V] of the pass the plan describes (see `StepPlan`)."""
        if plan.kind == "prefill":
            return self.prefill_rows(plan.rows, plan.prompts)
        if plan.kind == "mixed":
            return self.mixed_rows(plan.tokens, plan.positions, plan.rows)
        if plan.graph_bucket is not None:
            if self.graphs is None:
                raise RuntimeError("the plan replays a CUDA graph, but this runner captured none")
            return self.graphs.decode(plan.tokens, plan.positions)
        return self.decode_rows_eager(plan.tokens, plan.positions, kv_len=plan.kv_len)

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

    @contextlib.contextmanager
    def eager_prefill(self) -> Iterator[None]:
        """Prefill without graphs for a while (a profile needs the modules' own calls; a paired
        measurement switches forwards back and forth, each switch would capture the prefill again)."""
        kept, self.prefill_graphs = self.prefill_graphs, None
        try:
            yield
        finally:
            self.prefill_graphs = kept

    def prefill_row(self, row: int, prompt_ids: Sequence[int]) -> torch.Tensor:
        """Prefill one cache row with a prompt; returns the last position's logits [1, V]."""
        if self.prefill_graphs is not None:
            logits = self.prefill_graphs.run(row, prompt_ids)
            if logits is not None:
                return logits
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
        if self.prefill_graphs is not None and self.prefill_graphs.takes_rows(prompts):
            # Several short prompts: one graph replay per row (a bucket's logits are overwritten by
            # its next replay, hence the copies) instead of one eager pass paying every launch.
            return torch.cat([self.prefill_row(r, p).clone() for r, p in zip(rows, prompts)])
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

    def mixed_rows(self, tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int]) -> torch.Tensor:
        """One decode-shaped pass whose row r feeds tokens[r] at positions[r] into cache row slots[r]:
        decode rows and, as rows of their own, the prompt tokens of requests joining (a mixed step,
        `serving.scheduler`); logits [n, V]. Replays a graph when the engine captured mixed ones."""
        if self.graphs is not None and self.graphs.mixed_buckets:
            return self.graphs.mixed(tokens, positions, slots)
        live = [p for p in positions if p != self.cache.scratch_position] or [0]
        return self.decode_rows_eager(tokens, positions, kv_len=max(live) + 1, slots=slots)

    def decode_rows_eager(
        self,
        tokens: Sequence[int],
        positions: Sequence[int],
        kv_len: int | None = None,
        slots: Sequence[int] | None = None,
    ) -> torch.Tensor:
        n = len(tokens)
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device).view(n, 1)
        pos = torch.tensor(list(positions), dtype=torch.long, device=self.device)
        if kv_len is None:
            kv_len = min(self.max_len, max(positions) + 1)
        rows = None if slots is None else torch.tensor(list(slots), dtype=torch.long, device=self.device)
        self.cache.set_decode(n, pos, kv_len, rows)
        mask = decode_mask(pos, kv_len, self._arange, self.dtype)
        with torch.no_grad():
            return self._forward(ids, pos[:, None], mask)[:, -1, :]

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
        prompt_len = max(1, min(prompt_len, self.cache.usable_len - steps))  # a short context (a window)
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


def sliding_window_of(config: Any) -> int | None:
    """The window of the model's sliding-window attention layers, None when no layer slides (Qwen2
    names a window it does not use: `use_sliding_window` false, every layer full attention)."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return window


def _context_limit(config: Any) -> int:
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048
