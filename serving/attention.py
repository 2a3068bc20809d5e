"""Decode attention for the serving engine: one Triton kernel per layer instead of SDPA's glue.

Why: under CUDA graphs the decode step is bound by the number of small kernels, and SDPA with a
GQA model and an explicit mask adds several per layer (GQA expansion of the cache or query
packing, mask handling, the attention kernel itself) while attending over the whole static cache
(`max_len` keys, masked). This kernel reads each row's position from `position_ids` and visits only
keys `0..pos`, with all query heads of one KV head in one program (the cache is read once, not
once per query head), in one launch per layer; long contexts split the keys over programs and a
second small kernel merges the partial softmaxes (flash-decoding).

It is registered with transformers' `AttentionInterface` as `gpuyantra_decode` and handles only
what it was built for: one query token per row, no sliding window / softcap / dropout, positions
given, a cache tensor with a unit stride on the head dimension. Everything else (prefill, other
models' features: Gemma2's sliding-window and soft-capped layers) goes to the model's own attention
(SDPA, or its eager attention where transformers has no SDPA for it), logged once per layer.

Rows whose position is the engine cache's scratch slot (`max_len - 1`: padding rows of a graph
bucket, capture and probe passes) attend to that slot only: their outputs are discarded, and this
keeps a padded row from scanning the whole cache.
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

import torch
import triton
import triton.language as tl

NAME = "gpuyantra_decode"
log = logging.getLogger("gpuyantra.serving")
KEYS_PER_SPLIT = 512  # past this many cache slots, keys are split over programs (flash-decoding)


@triton.jit
def _decode_attention(
    Q,
    K,
    V,
    O,
    POS,
    PART_M,
    PART_L,
    PART_ACC,
    K_NEW,
    V_NEW,
    SLOTS,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_knb,
    stride_knh,
    stride_vnb,
    stride_vnh,
    scale,
    scratch,
    keys_per_split,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
    WRITE_NEW: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    pos = tl.load(POS + row).to(tl.int32)
    lo = tl.where(pos >= scratch, pos, 0)  # scratch rows: their own slot only
    start = lo + split * keys_per_split
    # WRITE_NEW: this step's key/value come in K_NEW/V_NEW (not yet in the cache): the cache loop
    # stops before `pos`, split 0 adds the new key and writes it to slot `pos` (one writer per head).
    stop = tl.minimum(pos if WRITE_NEW else pos + 1, start + keys_per_split)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    q = tl.load(
        Q + row * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=g_ok[:, None] & d_ok[None, :], other=0.0
    )
    # HAS_SLOTS: query row `row` reads cache row SLOTS[row] (a mixed step's prompt rows share one)
    if HAS_SLOTS:
        slot = tl.load(SLOTS + row).to(tl.int32)
    else:
        slot = row
    k_base = K + slot * stride_kb + kv_head * stride_kh
    v_base = V + slot * stride_vb + kv_head * stride_vh

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    for block in range(start, stop, BLOCK_N):
        n = block + tl.arange(0, BLOCK_N)
        n_ok = n < stop
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + n[:, None] * stride_kn + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = tl.where(n_ok[None, :], scores * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + n[:, None] * stride_vn + d[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if WRITE_NEW:
        if split == 0:
            k_new = tl.load(K_NEW + row * stride_knb + kv_head * stride_knh + d, mask=d_ok, other=0.0)
            v_new = tl.load(V_NEW + row * stride_vnb + kv_head * stride_vnh + d, mask=d_ok, other=0.0)
            score = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], axis=1) * scale
            m_new = tl.maximum(m_i, score)
            alpha = tl.exp(m_i - m_new)
            p_new = tl.exp(score - m_new)
            l_i = l_i * alpha + p_new
            acc = acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)[None, :]
            m_i = m_new
            tl.store(k_base + pos * stride_kn + d, k_new, mask=d_ok)
            tl.store(v_base + pos * stride_vn + d, v_new, mask=d_ok)

    if SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(
            O + row * stride_ob + heads[:, None] * stride_oh + d[None, :],
            out.to(O.dtype.element_ty),
            mask=g_ok[:, None] & d_ok[None, :],
        )
    else:
        n_heads = tl.num_programs(1) * GROUP
        part = (row * n_heads + heads) * SPLITS + split
        tl.store(PART_M + part, m_i, mask=g_ok)
        tl.store(PART_L + part, l_i, mask=g_ok)
        tl.store(PART_ACC + part[:, None] * HEAD_DIM + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def _merge_splits(
    PART_M,
    PART_L,
    PART_ACC,
    O,
    stride_ob,
    stride_oh,
    n_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLITS: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    part = (row * n_heads + head) * SPLITS + s
    m = tl.load(PART_M + part)
    l = tl.load(PART_L + part)
    acc = tl.load(PART_ACC + part[:, None] * HEAD_DIM + d[None, :], mask=d_ok[None, :], other=0.0)
    top = tl.max(m, axis=0)  # split 0 always holds a key, so top is finite
    w = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(O + row * stride_ob + head * stride_oh + d, out.to(O.dtype.element_ty), mask=d_ok)


def _splits_for(keys: int) -> int:
    if keys <= KEYS_PER_SPLIT:
        return 1
    return 1 << math.ceil(math.log2(math.ceil(keys / KEYS_PER_SPLIT)))


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    scratch: int | None = None,
    new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per row over cache slots `0..positions[r]`.

    query `[B, Hq, 1, D]`; key/value `[B', Hkv, L, D]` (B' >= B, positions[r] < L) or views of a
    cache whose storage also holds the slot `scratch` (rows at `scratch` attend to it alone);
    positions `[B]` (long). With `slots` (`[B]` long), row r reads cache row slots[r] (any B').
    With `new_kv` (`[B, Hkv, 1, D]` each), this step's key/value are not
    in the cache yet: the kernel attends to them and writes them at `positions` (one kernel instead
    of a cache-update kernel per tensor plus the attention). Returns `[B, 1, Hq, D]`, the layout
    transformers' attention functions return.
    """
    batch, q_heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    group = q_heads // kv_heads
    out = torch.empty((batch, 1, q_heads, head_dim), dtype=query.dtype, device=query.device)
    splits = _splits_for(key.shape[2])
    block_d = triton.next_power_of_2(head_dim)
    if splits > 1:
        part_m = torch.empty((batch, q_heads, splits), dtype=torch.float32, device=query.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty((batch, q_heads, splits, head_dim), dtype=torch.float32, device=query.device)
    else:
        part_m = part_l = part_acc = out  # unused when SPLITS == 1
    k_new, v_new = new_kv if new_kv is not None else (key, value)  # unused without new_kv
    _decode_attention[(batch, kv_heads, splits)](
        query,
        key,
        value,
        out,
        positions,
        part_m,
        part_l,
        part_acc,
        k_new,
        v_new,
        slots if slots is not None else positions,  # unused without slots
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        key.stride(2),
        value.stride(0),
        value.stride(1),
        value.stride(2),
        out.stride(0),
        out.stride(2),
        k_new.stride(0),
        k_new.stride(1),
        v_new.stride(0),
        v_new.stride(1),
        scale,
        scratch if scratch is not None else 2**31 - 1,
        KEYS_PER_SPLIT,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_N=64,
        SPLITS=splits,
        IEEE=query.dtype == torch.float32,
        WRITE_NEW=new_kv is not None,
        HAS_SLOTS=slots is not None,
        num_warps=4,
    )
    if splits > 1:
        _merge_splits[(batch, q_heads)](
            part_m,
            part_l,
            part_acc,
            out,
            out.stride(0),
            out.stride(2),
            q_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            SPLITS=splits,
            num_warps=4,
        )
    return out


def reference_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    scratch: int | None = None,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same contract in plain torch (fp32 math): the kernel's test oracle."""
    batch, q_heads, _, head_dim = query.shape
    group = q_heads // key.shape[1]
    length = max(key.shape[2], (scratch or 0) + 1)
    full_k = key.as_strided((key.shape[0], key.shape[1], length, head_dim), key.stride())
    full_v = value.as_strided((value.shape[0], value.shape[1], length, head_dim), value.stride())
    out = torch.empty((batch, 1, q_heads, head_dim), dtype=query.dtype, device=query.device)
    for r in range(batch):
        pos = int(positions[r])
        slot = int(slots[r]) if slots is not None else r
        lo = pos if scratch is not None and pos >= scratch else 0
        k = full_k[slot, :, lo : pos + 1].float().repeat_interleave(group, dim=0)
        v = full_v[slot, :, lo : pos + 1].float().repeat_interleave(group, dim=0)
        weights = torch.softmax((query[r, :, 0].float()[:, None, :] @ k.transpose(1, 2)) * scale, dim=-1)
        out[r, 0] = (weights @ v)[:, 0].to(query.dtype)
    return out


# ---------------------------------------------------------------------------------- transformers
def _unsupported(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, kwargs: dict[str, Any]) -> str | None:
    if query.shape[2] != 1:
        return "more than one query token"
    if kwargs.get("position_ids") is None:
        return "no position_ids"
    if kwargs.get("sliding_window") or kwargs.get("softcap") or kwargs.get("dropout"):
        return "sliding window / softcap / dropout"
    if kwargs.get("output_attentions"):
        return "attention weights requested"
    if query.shape[1] % key.shape[1] or key.stride(-1) != 1 or query.stride(-1) != 1:
        return "layout"
    if query.shape[-1] > 256:
        return "head dim"
    return None


def original_attention(module: torch.nn.Module, implementation: str) -> Any:
    """The attention function the model ran before a decode attention was installed: its own
    module's `eager_attention_forward` for "eager" (Gemma2's soft-capping lives there), else the one
    transformers registered under that name (SDPA where nothing else is known)."""
    import sys

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if implementation == "eager":
        eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if eager is not None:
            return eager
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS[implementation]
    except (ImportError, KeyError):
        return sdpa_attention_forward


def rows_of_the_step(key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor | None, rows: int):
    """A mixed step's cache hands the kernel every cache row (it reads each query row's slot itself);
    a fallback needs one key/value row per query row, gathered by slot."""
    if slots is None or key.shape[0] == rows:
        return key, value
    return key.index_select(0, slots), value.index_select(0, slots)


class DecodeAttention:
    """The attention function transformers calls, bound to one engine's cache: its scratch slot, and
    the key/value of the current decode step that the cache hands over instead of writing them.
    A call the kernel cannot serve (a prefill, a sliding-window or soft-capped layer, ...) goes to
    the model's own attention (`original`), its reason logged once per layer."""

    def __init__(self, name: str, cache: Any, original: str = "sdpa"):
        self.name = name
        self.cache = cache
        self.original = original
        self.calls = 0
        self.fallbacks = 0
        self.last_fallback: str | None = None  # why the last call went to the model's own attention
        self._logged: set[tuple[Any, str]] = set()

    def _fall_back(self, module, query, key, value, attention_mask, scaling, kwargs, reason: str):
        self.fallbacks += 1
        self.last_fallback = reason
        layer = getattr(module, "layer_idx", None)
        if query.shape[2] == 1 and (layer, reason) not in self._logged:  # prefills fall back by design
            self._logged.add((layer, reason))
            log.info("decode attention off for layer %s (%s): %s attention serves it", layer, reason, self.original)
        slots = getattr(getattr(self.cache, "mode", None), "slots", None)
        key, value = rows_of_the_step(key, value, slots, query.shape[0])
        attend = original_attention(module, self.original)
        return attend(module, query, key, value, attention_mask, scaling=scaling, **kwargs)

    def __call__(self, module, query, key, value, attention_mask, scaling=None, **kwargs):
        layer = getattr(module, "layer_idx", None)
        new_kv = self.cache.take_pending(layer) if self.cache is not None else None
        reason = _unsupported(module, query, key, kwargs)
        if reason is not None:
            if new_kv is not None:
                self.cache.write_decode(layer, *new_kv)
            return self._fall_back(module, query, key, value, attention_mask, scaling, kwargs, reason)
        positions = kwargs["position_ids"].reshape(-1)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        self.calls += 1
        scratch = self.cache.scratch_position if self.cache is not None else None
        slots = getattr(getattr(self.cache, "mode", None), "slots", None)
        return decode_attention(query, key, value, positions, scale, scratch, new_kv, slots), None


_installed = itertools.count()


def install(model: torch.nn.Module, cache: Any) -> DecodeAttention:
    """Register a decode attention for `model` (one query token per row) under a name of its own and
    switch the model to it; the mask interface keeps the original's, so prefill passes behave as before.
    `cache` (the engine's `SlotCache`) then hands each decode step's key/value to the kernel."""
    from transformers import AttentionInterface

    config: Any = model.config  # (torch types module attributes as Tensor | Module)
    current = str(getattr(config, "_attn_implementation", None) or "sdpa")
    if not current.startswith(NAME):  # the model's own, kept for fallbacks and for uninstall
        model.gpuyantra_original_attention = current  # type: ignore[assignment]
    original = str(getattr(model, "gpuyantra_original_attention", "sdpa"))
    function = DecodeAttention(f"{NAME}_{next(_installed)}", cache, original)
    if cache is not None:
        cache.defer_decode_writes = True
    AttentionInterface.register(function.name, function)
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        # The original's mask: an eager original gets its explicit causal mask (SDPA's may be None,
        # causal by `is_causal`, which an eager fallback would read as no mask at all).
        masks = ALL_MASK_ATTENTION_FUNCTIONS
        masks.register(function.name, masks[original] if original in masks else masks["sdpa"])
    except (ImportError, KeyError):
        pass
    _set_attention(model, function.name)
    return function


def uninstall(model: torch.nn.Module) -> None:
    """Back to the model's own attention (SDPA, or eager where the architecture has no SDPA) if one
    of our decode attentions is installed (else a no-op)."""
    config: Any = model.config  # (torch types module attributes as Tensor | Module)
    if str(config._attn_implementation).startswith(NAME):
        _set_attention(model, str(getattr(model, "gpuyantra_original_attention", "sdpa")))


def _set_attention(model: torch.nn.Module, name: str) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    if setter is not None:
        setter(name)
    config: Any = model.config  # (torch types module attributes as Tensor | Module)
    if config._attn_implementation != name:  # older transformers: set the config directly
        config._attn_implementation = name
