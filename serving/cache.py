"""The engine's own KV cache: one static row per batch slot, positions owned by the serving loop.

transformers' `StaticCache` keeps its write position in an internal counter that advances on every
call (and on every CUDA-graph replay), and its interface changes between releases. The engine
instead owns positions: before each forward pass it tells this cache which rows are written at
which positions, and it passes the matching 4D attention mask and `position_ids` to the model
(transformers returns a 4D mask as-is). The model only ever calls `update(key, value, layer_idx,
...)`, an interface that has been stable across transformers 4.5x and 5.x.

Layout per layer: keys/values `[max_batch, kv_heads, max_len, head_dim]`, allocated on first use.
The last position (`max_len - 1`) is a scratch slot that real tokens never use: CUDA-graph warm-up,
capture and graph-path parity checks write there, so they can run while requests are in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class _Prefill:
    row: int
    start: int


@dataclass
class _PrefillRows:
    rows: torch.Tensor  # several rows prefilled together from position 0 (right-padded prompts)


@dataclass
class _Decode:
    rows: int
    positions: torch.Tensor  # [rows] long, on the cache's device
    kv_len: int
    # [rows] long: the cache row each query row reads and writes (a mixed step: prompt tokens of a
    # newly admitted request ride along as rows of their own). None: query row r is cache row r.
    slots: torch.Tensor | None = None


class SlotCache:
    # No `is_sliding`/`layers` attributes on purpose: transformers' mask helpers inspect those on
    # their own caches before noticing that the mask is already 4D.
    is_compileable = True

    def __init__(self, max_batch: int, max_len: int, device: torch.device | str):
        if max_len < 4:
            raise ValueError("max_len must be at least 4")
        self.max_batch = max_batch
        self.max_len = max_len
        self.device = torch.device(device)
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        self.rows = torch.arange(max_batch, device=self.device)
        self.mode: _Prefill | _PrefillRows | _Decode | None = None
        # Set by the Triton decode attention: a decode step's key/value are handed to it (it writes
        # them while attending) instead of being written here by two index kernels per layer.
        self.defer_decode_writes = False
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def scratch_position(self) -> int:
        return self.max_len - 1

    @property
    def usable_len(self) -> int:
        """Tokens (prompt + generated) a request may hold; the last position is scratch."""
        return self.max_len - 1

    # -- what the engine sets before each forward pass -------------------------------------------
    def set_prefill(self, row: int, start: int = 0) -> None:
        self.mode = _Prefill(row=row, start=start)

    def set_prefill_rows(self, rows: Sequence[int] | torch.Tensor) -> None:
        """Prefill of several rows in one pass, prompts right-padded to one length, from position 0.
        Padding writes slots past a row's prompt; decode overwrites each slot before attending to it.
        A tensor of rows is used as it is (a captured prefill's static row)."""
        if not isinstance(rows, torch.Tensor):
            rows = torch.tensor(list(rows), device=self.device)
        self.mode = _PrefillRows(rows=rows)

    def set_decode(self, rows: int, positions: torch.Tensor, kv_len: int, slots: torch.Tensor | None = None) -> None:
        self.mode = _Decode(rows=rows, positions=positions, kv_len=kv_len, slots=slots)

    # -- the interface the model calls -----------------------------------------------------------
    def _layer(self, layer_idx: int, key_states: torch.Tensor, value_states: torch.Tensor):
        while len(self.keys) <= layer_idx:
            self.keys.append(None)
            self.values.append(None)
        if self.keys[layer_idx] is None:
            heads, k_dim, v_dim = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
            self.keys[layer_idx] = torch.zeros(
                (self.max_batch, heads, self.max_len, k_dim), dtype=key_states.dtype, device=key_states.device
            )
            self.values[layer_idx] = torch.zeros(
                (self.max_batch, heads, self.max_len, v_dim), dtype=value_states.dtype, device=value_states.device
            )
        return self.keys[layer_idx], self.values[layer_idx]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self._layer(layer_idx, key_states, value_states)
        mode = self.mode
        if isinstance(mode, _PrefillRows):
            length = key_states.shape[-2]
            keys[mode.rows, :, :length] = key_states
            values[mode.rows, :, :length] = value_states
            return keys[mode.rows, :, :length], values[mode.rows, :, :length]
        if isinstance(mode, _Prefill):
            length = key_states.shape[-2]
            end = mode.start + length
            keys[mode.row, :, mode.start : end] = key_states[0]
            values[mode.row, :, mode.start : end] = value_states[0]
            return keys[mode.row : mode.row + 1, :, :end], values[mode.row : mode.row + 1, :, :end]
        if isinstance(mode, _Decode) and mode.slots is not None:
            # A mixed step: a prompt row attends to the keys of the prompt rows before it, so every
            # row's key/value is written before anyone attends.
            self.write_decode(layer_idx, key_states, value_states)
            if self.defer_decode_writes:  # the Triton decode attention reads each row's slot itself
                return keys[:, :, : mode.kv_len], values[:, :, : mode.kv_len]
            return keys[:, :, : mode.kv_len].index_select(0, mode.slots), values[:, :, : mode.kv_len].index_select(
                0, mode.slots
            )
        if isinstance(mode, _Decode):
            if self.defer_decode_writes:
                self._pending[layer_idx] = (key_states, value_states)
            else:
                self.write_decode(layer_idx, key_states, value_states)
            return keys[: mode.rows, :, : mode.kv_len], values[: mode.rows, :, : mode.kv_len]
        raise RuntimeError("SlotCache.update called before set_prefill/set_decode")

    def write_decode(self, layer_idx: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write one decode step's key/value `[rows, heads, 1, dim]` at each row's position (in each
        row's slot)."""
        mode = self.mode
        assert isinstance(mode, _Decode)
        rows = self.rows[: mode.rows] if mode.slots is None else mode.slots
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        assert keys is not None and values is not None  # update() allocated the layer before any write
        keys[rows, :, mode.positions] = key_states[:, :, 0]
        values[rows, :, mode.positions] = value_states[:, :, 0]

    def take_pending(self, layer_idx: int | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The deferred key/value of this decode step's layer (None if it was written already)."""
        return self._pending.pop(layer_idx, None) if layer_idx is not None else None

    # Positions and masks are explicit, so the model never needs the cache's length; these exist
    # for code paths of transformers versions that still compute `cache_position` from it.
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.max_len

    def get_max_length(self) -> int:
        return self.max_len

    def __len__(self) -> int:
        return len(self.keys)

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)


def prefill_mask(length: int, start: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """Additive causal mask `[1, 1, length, start + length]` for one row's prefill."""
    q = torch.arange(length, device=device)[:, None] + start
    k = torch.arange(start + length, device=device)[None, :]
    blocked = k > q
    mask = torch.zeros((length, start + length), dtype=dtype, device=device)
    mask.masked_fill_(blocked, torch.finfo(dtype).min)
    return mask[None, None]


def decode_mask(positions: torch.Tensor, kv_len: int, arange: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask `[rows, 1, 1, kv_len]`: row r sees positions <= positions[r]. Graph-capturable."""
    blocked = arange[None, :kv_len] > positions[:, None]
    zeros = torch.zeros((), dtype=dtype, device=positions.device)
    minimum = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=positions.device)
    return torch.where(blocked, minimum, zeros)[:, None, None, :]
