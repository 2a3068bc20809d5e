"""The serving engine's decode attention kernel (Triton interpreter) against its torch oracle and
against transformers' SDPA path on a tiny model."""

from __future__ import annotations

import pytest
import torch

from serving import attention
from serving.attention import decode_attention, reference_decode_attention

TOL = {torch.float32: 2e-5, torch.float16: 2e-3}


def _cache(batch: int, kv_heads: int, slots: int, dim: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(batch, kv_heads, slots, dim, generator=gen).to(dtype)
    values = torch.randn(batch, kv_heads, slots, dim, generator=gen).to(dtype)
    return keys, values, gen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("q_heads,kv_heads,dim", [(6, 2, 32), (4, 4, 16), (8, 1, 24)])
def test_kernel_matches_oracle(dtype, q_heads, kv_heads, dim):
    keys, values, gen = _cache(3, kv_heads, 40, dim, dtype)
    query = torch.randn(3, q_heads, 1, dim, generator=gen).to(dtype)
    positions = torch.tensor([0, 17, 38])
    got = decode_attention(query, keys, values, positions, dim**-0.5)
    want = reference_decode_attention(query, keys, values, positions, dim**-0.5)
    assert got.shape == (3, 1, q_heads, dim)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


def test_keys_past_the_position_are_ignored():
    keys, values, gen = _cache(1, 2, 32, 16, torch.float32)
    query = torch.randn(1, 4, 1, 16, generator=gen)
    positions = torch.tensor([9])
    before = decode_attention(query, keys, values, positions, 0.25)
    keys[:, :, 10:] = 1e4  # garbage after the row's position must not leak in
    values[:, :, 10:] = float("nan")
    after = decode_attention(query, keys, values, positions, 0.25)
    torch.testing.assert_close(before, after)


def test_split_keys_merge_like_one_pass(monkeypatch):
    keys, values, gen = _cache(2, 2, 100, 16, torch.float32, seed=3)
    query = torch.randn(2, 4, 1, 16, generator=gen)
    positions = torch.tensor([99, 40])
    one_pass = decode_attention(query, keys, values, positions, 0.25)
    monkeypatch.setattr(attention, "KEYS_PER_SPLIT", 16)
    assert attention._splits_for(100) == 8
    split = decode_attention(query, keys, values, positions, 0.25)
    torch.testing.assert_close(split, one_pass, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(
        split, reference_decode_attention(query, keys, values, positions, 0.25), atol=2e-5, rtol=2e-5
    )


def test_scratch_rows_attend_to_their_own_slot_only():
    keys, values, gen = _cache(2, 1, 12, 16, torch.float32)
    query = torch.randn(2, 2, 1, 16, generator=gen)
    view_k, view_v = keys[:, :, :5], values[:, :, :5]  # the engine's eager decode passes a kv_len view
    positions = torch.tensor([4, 11])
    got = decode_attention(query, view_k, view_v, positions, 0.25, scratch=11)
    torch.testing.assert_close(got[1, 0], values[1, 0, 11].expand(2, 16))  # softmax over one key
    torch.testing.assert_close(got, reference_decode_attention(query, view_k, view_v, positions, 0.25, scratch=11))


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_engine_with_triton_decode_attention_generates_the_reference_tokens(tmp_path, cuda_graphs):
    from serving.engine import Engine, GenRequest
    from serving.models import load_model
    from tests.serving.helpers import PROMPTS, reference_greedy

    engine = Engine(
        load_model("tiny-qwen2"),
        state_dir=tmp_path,
        max_batch=4,
        max_seq_len=64,
        cuda_graphs=cuda_graphs,
        decode_attention="triton",
    )
    assert engine.decode_attention is not None and engine.self_check_report["ok"]
    want = [reference_greedy(engine.model, p, 5) for p in PROMPTS]  # prefill path: SDPA, full forward
    engine.start()
    try:
        reqs = [engine.submit(GenRequest(p, 5)) for p in PROMPTS]
        for r in reqs:
            assert r.done.wait(120)
        assert [r.output_ids for r in reqs] == want
        assert engine.decode_attention.calls > 0  # decode steps really ran the kernel
    finally:
        engine.stop()


def test_engine_rejects_an_unknown_decode_attention(tmp_path):
    from serving.engine import Engine
    from serving.models import load_model

    with pytest.raises(ValueError, match="decode_attention"):
        Engine(load_model("tiny-qwen2"), state_dir=tmp_path, decode_attention="flash")


@pytest.mark.parametrize("splits_of", [None, 8])
def test_new_key_value_are_attended_and_written_at_the_position(monkeypatch, splits_of):
    if splits_of:
        monkeypatch.setattr(attention, "KEYS_PER_SPLIT", splits_of)
    keys, values, gen = _cache(2, 2, 30, 16, torch.float32, seed=7)
    query = torch.randn(2, 6, 1, 16, generator=gen)
    new_k = torch.randn(2, 2, 1, 16, generator=gen)
    new_v = torch.randn(2, 2, 1, 16, generator=gen)
    positions = torch.tensor([20, 29])  # row 1 sits at the scratch slot
    keys[:, :, 20] = 50.0  # stale slot content must be replaced, not attended
    got = decode_attention(
        query, keys[:, :, :21], values[:, :, :21], positions, 0.25, scratch=29, new_kv=(new_k, new_v)
    )
    torch.testing.assert_close(keys[0, :, 20], new_k[0, :, 0])
    torch.testing.assert_close(values[1, :, 29], new_v[1, :, 0])
    want = reference_decode_attention(query, keys[:, :, :21], values[:, :, :21], positions, 0.25, scratch=29)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("splits", [False, True])
def test_rows_read_the_cache_rows_their_slots_name(monkeypatch, splits):
    # A mixed step: five query rows over three cache rows, two of them sharing row 2 at positions
    # 3 and 4 (prompt tokens of one request); each row must see its slot's keys only.
    if splits:
        monkeypatch.setattr(attention, "KEYS_PER_SPLIT", 16)
    keys, values, gen = _cache(3, 2, 40, 16, torch.float32, seed=5)
    query = torch.randn(5, 4, 1, 16, generator=gen)
    positions = torch.tensor([30, 12, 3, 4, 39])
    slots = torch.tensor([1, 0, 2, 2, 0])
    got = decode_attention(query, keys, values, positions, 0.25, scratch=39, slots=slots)
    want = reference_decode_attention(query, keys, values, positions, 0.25, scratch=39, slots=slots)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    by_row = decode_attention(query[:1], keys[1:2], values[1:2], positions[:1], 0.25)
    torch.testing.assert_close(got[:1], by_row, atol=2e-5, rtol=2e-5)
