"""The decode batches a kernel is judged at: the profile names them (`served_batches`) and every
target's shapes cover one-row decode, the batched decode and prefill, whichever batch it timed."""

from __future__ import annotations

import time

import pytest

from serving import profiling as profiling_module
from serving.engine import Engine
from serving.models import load_model

HIDDEN = 64  # tiny-qwen2


def make_engine(tmp_path, **kw) -> Engine:
    kw.setdefault("max_batch", 4)
    kw.setdefault("max_seq_len", 128)
    return Engine(load_model("tiny-qwen2"), state_dir=tmp_path, **kw)


def served_traffic(engine: Engine, rows: int, steps: int = 20) -> None:
    """As if live traffic had decoded `steps` steps at `rows` rows."""
    for _ in range(steps):
        engine.scheduler.traffic.live_steps.append((time.monotonic(), rows, rows, 0.01))
        engine.scheduler.traffic.batches.append(rows)


def by_key(profile: dict) -> dict[tuple[str, str], dict]:
    return {(t["op"], t.get("variant", "")): t for t in profile["targets"]}


def test_without_traffic_the_batched_decode_is_max_batch(tmp_path):
    engine = make_engine(tmp_path)
    assert engine.served_decode_batches() == [1, 4]
    assert make_engine(tmp_path / "one", max_batch=1).served_decode_batches() == [1]


def test_live_traffic_names_the_batched_decode_rounded_up_to_its_graph_bucket(tmp_path):
    engine = make_engine(tmp_path, max_batch=8)
    served_traffic(engine, 3)
    served_traffic(engine, 1, steps=50)  # one-row steps are batch 1 whatever their number
    assert engine.served_decode_batches() == [1, 3]
    graphed = make_engine(tmp_path / "graphs", max_batch=8, cuda_graphs=True)  # buckets 1, 2, 4, 8
    served_traffic(graphed, 3)
    assert graphed.served_decode_batches() == [1, 4]


@pytest.mark.parametrize("profiler", ["profiler", "fallback"])
def test_every_target_covers_one_row_batched_decode_and_prefill(tmp_path, monkeypatch, profiler):
    if profiler == "fallback":
        monkeypatch.setattr(profiling_module, "run_profiler", lambda *a, **k: None)
    engine = make_engine(tmp_path)
    prof = engine.profile()  # no traffic: the profile times batch-1 decode and a 16-token prefill
    assert prof["source"] == profiler and prof["served_batches"] == [1, 4]
    targets = by_key(prof)
    norm = targets[("rms_norm", "")]
    assert [1, 1, HIDDEN] in norm["shapes"] and [4, 1, HIDDEN] in norm["shapes"]
    assert norm["served_shapes"]["decode@4"] == [[4, 1, HIDDEN]]
    assert [4, 4, 1, 16] in targets[("rope", "")]["shapes"]  # a function-level target: q at 4 rows
    linears = [t for t in prof["targets"] if t["op"] == "linear"]
    assert linears
    for linear in linears:
        rows = {tuple(s[:-1]) for s in linear["shapes"]}
        assert {(1, 1), (4, 1)} <= rows, (linear["variant"], linear["shapes"])
    if profiler == "profiler":  # the fallback's shapes come from live traffic, and there was none
        # Prefill too, for every projection but the LM head (prefill keeps only the last position).
        for linear in linears:
            if linear["variant"] != "weight=512x64,bias=none":
                assert (1, 16) in {tuple(s[:-1]) for s in linear["shapes"]}, linear["shapes"]
        # The gated MLP's activation is the intermediate size, not the module input's hidden size.
        assert [4, 1, 128] in targets[("silu_mul", "")]["shapes"]


def test_a_profile_timed_at_the_traffic_batch_still_covers_one_row(tmp_path):
    engine = make_engine(tmp_path)
    served_traffic(engine, 2)
    prof = engine.profile()
    assert prof["served_batches"] == [1, 2]
    for linear in (t for t in prof["targets"] if t["op"] == "linear"):
        rows = [tuple(s[:-1]) for s in linear["shapes"]]
        assert rows[0] == (2, 1)  # what the profile timed stays first
        assert (1, 1) in rows and len(rows) == len(set(rows))


def test_open_targets_are_built_from_every_served_workload(tmp_path, monkeypatch):
    # Qwen2's rotary embedding is an open target: its position_ids are (1, S) in a prefill and
    # (4, 1) in the batched decode; both calls are its evidence, its cases and its parity checks.
    monkeypatch.setattr(profiling_module, "run_profiler", lambda *a, **k: None)
    prof = make_engine(tmp_path).profile()
    [rotary] = [t for t in prof["targets"] if t["module_class"] == "Qwen2RotaryEmbedding"]
    meta = rotary["open_target"]["meta"]
    assert [[4, 1, HIDDEN], [4, 1]] in meta["calls"] and [[1, 1, HIDDEN], [1, 1]] in meta["calls"]
    assert any(x[:2] == [1, 16] and positions == [1, 16] for x, positions in meta["calls"])  # the prefill
    assert meta["links"][1] == [[0, 0], [1, 1]]  # the positions follow x's batch and sequence
