"""Rotary position embedding, rotate-half form, applied to q and k together.

entry(q, k, cos, sin) -> (q_embed, k_embed), `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`
of transformers: q is [B, Hq, S, D], k is [B, Hk, S, D] (any strides with a unit last stride; the
usual `view(B, S, H, D).transpose(1, 2)` layout works as is), cos and sin are [B, S, R] or [1, S, R]
(broadcast over the batch) with R <= D even:
    q_embed[..., :R] = q[..., :R] * cos + rotate_half(q[..., :R]) * sin,  q_embed[..., R:] = q[..., R:]
(R < D is Phi-3's partial rotary; R = D everywhere else), rotate_half(t) = cat(-t[R/2:], t[:R/2]).
Outputs have q's and k's dtypes (cos/sin may be float32, as OLMo2 passes them).

No transformers module computes it: attention modules call the module-level function
`apply_rotary_pos_emb` (listed in `known_functions`). The family's default module is
`ApplyRotaryPosEmb` below, a parameterless module form (`forward(q, k, cos, sin)`).

Shapes in the generic interface (`make_activations(rows, hidden, ...)`, `bytes_moved(shape)`):
hidden is the head dim D; rows is (B, Hq, S) — q's leading dims — or (B, S) / (S,) with Hq = 4; k has
Hk = Hq // 4 heads when Hq is a multiple of 4 (grouped-query attention), else Hq. q and k come in
the layout attention modules give them: [B, S, H, D] memory viewed as [B, H, S, D].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpuyantra.ops._rows import call_module, forward_with_entry, is_parameterless_leaf
from gpuyantra.ops.base import OpFamily, Tensor, itemsize, randn
from gpuyantra.ops.registry import register

_MODELS = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen2_moe",
    "mixtral",
    "gemma",
    "gemma2",
    "gemma3",
    "granite",
    "olmo2",
    "phi3",
)


def _rotate_half(t: Tensor) -> Tensor:
    half = t.shape[-1] // 2
    return torch.cat((-t[..., half:], t[..., :half]), dim=-1)


def _apply(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    rot = cos.shape[-1]
    if rot == t.shape[-1]:
        out = t * cos + _rotate_half(t) * sin
    else:
        t_rot, t_pass = t[..., :rot], t[..., rot:]
        out = torch.cat(
            [t_rot * cos + _rotate_half(t_rot) * sin, t_pass.to(torch.promote_types(t.dtype, cos.dtype))], dim=-1
        )
    return out.to(t.dtype)


def reference(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    if q.dtype == torch.float64:
        cos, sin = cos.to(torch.float64), sin.to(torch.float64)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return _apply(q, cos, sin), _apply(k, cos, sin)


class ApplyRotaryPosEmb(torch.nn.Module):
    """Module form of `apply_rotary_pos_emb(q, k, cos, sin)` (unsqueeze_dim=1)."""

    def forward(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        return reference(q, k, cos, sin)


def heads_for(rows: Sequence[int]) -> tuple[int, int, int, int]:
    """(B, Hq, Hk, S) for the generic `rows` of this family."""
    rows = tuple(int(r) for r in rows)
    if len(rows) >= 3:
        batch, hq, seq = rows[0], rows[1], rows[-1]
    elif len(rows) == 2:
        batch, hq, seq = rows[0], 4, rows[1]
    else:
        batch, hq, seq = 1, 4, (rows[0] if rows else 1)
    hk = hq // 4 if hq % 4 == 0 else hq
    return batch, hq, hk, seq


def rotary_cos_sin(
    batch: int, seq: int, dim: int, dtype: torch.dtype, device, generator: torch.Generator, base: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """cos/sin as a rotary embedding module makes them, at random positions per batch row."""
    gen_device = generator.device
    start = torch.randint(0, 4096, (batch, 1), generator=generator, device=gen_device)
    positions = (start + torch.arange(seq, device=gen_device)).to(torch.float64)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64, device=gen_device) / dim))
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device=device, dtype=dtype), emb.sin().to(device=device, dtype=dtype)


def make_activations(
    rows: Sequence[int], hidden: int, dtype: torch.dtype, device, generator: torch.Generator, scale: float = 1.0
) -> tuple[Tensor, ...]:
    batch, hq, hk, seq = heads_for(rows)
    # As attention modules make them: projections viewed [B, S, H, D], then transposed to [B, H, S, D].
    q = randn((batch, seq, hq, hidden), dtype, device, generator, scale).transpose(1, 2)
    k = randn((batch, seq, hk, hidden), dtype, device, generator, scale).transpose(1, 2)
    cos, sin = rotary_cos_sin(batch, seq, hidden, dtype, device, generator)
    return q, k, cos, sin


def bytes_moved(shape: Sequence[int], dtype: torch.dtype) -> int:
    """shape is q's [B, Hq, S, D]; k and cos/sin sized as make_activations makes them."""
    batch, hq, hk, seq = heads_for(tuple(shape[:-1]))
    dim = int(shape[-1])
    return (2 * batch * (hq + hk) * seq * dim + 2 * batch * seq * dim) * itemsize(dtype)


def flops(shape: Sequence[int]) -> int:
    batch, hq, hk, seq = heads_for(tuple(shape[:-1]))
    return 3 * batch * (hq + hk) * seq * int(shape[-1])


FAMILY = register(
    OpFamily(
        name="rope",
        activations=("q", "k", "cos", "sin"),
        params=(),
        default_module="gpuyantra.ops.rope.ApplyRotaryPosEmb",
        reference=reference,
        make_activations=make_activations,
        module_call=call_module,
        replacement_forward=forward_with_entry,
        bytes_moved=bytes_moved,
        flops=flops,
        known_modules=(),
        hidden_of=lambda module: 16,
        rounds_in_dtype=True,
        module_filter=is_parameterless_leaf,
        known_functions=tuple(f"transformers.models.{m}.modeling_{m}.apply_rotary_pos_emb" for m in _MODELS),
        n_outputs=2,
        activation_roles=("stream", "stream", "bounded", "bounded"),
        adapt_shape=lambda shape: [*shape[:-1], int(shape[-1]) + int(shape[-1]) % 2],  # rotate-half: even D
    )
)
