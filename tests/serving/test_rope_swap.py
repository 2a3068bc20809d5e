"""Function-level swap of rope: the engine replaces `apply_rotary_pos_emb` of the modeling module
(attention modules call that global; no module computes rope), checks parity on live calls,
commits, rolls back to the exact original function, re-applies from the manifest, and falls back
when the kernel raises while serving. The profile lists a rope target."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen2 import modeling_qwen2

from gpuyantra.swap import SwapEngine, swapped_function_id
from serving import profiling as profiling_module
from serving.engine import Engine
from serving.models import load_model
from tests.serving.helpers import REPO, reference_greedy

ROPE_KERNEL = REPO / "gpuyantra" / "kernels" / "rope.py"
DOTTED = "transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb"
ORIGINAL = modeling_qwen2.apply_rotary_pos_emb


def faulty_rope_source(max_seq: int = 8) -> str:
    """The template rope kernel with a shape bug: raises on more than `max_seq` positions."""
    source = ROPE_KERNEL.read_text()
    anchor = "    batch, hq, seq, head_dim = q.shape\n"
    assert anchor in source
    return source.replace(anchor, anchor + f"    if seq > {max_seq}:\n        raise ValueError('seq ' + str(seq))\n", 1)


@pytest.fixture(autouse=True)
def restore_global():
    """The modeling module is process-wide: every test leaves the original function in place."""
    yield
    modeling_qwen2.apply_rotary_pos_emb = ORIGINAL


def make_engine(tmp_path):
    return Engine(load_model("tiny-qwen2"), state_dir=tmp_path, max_batch=2, max_seq_len=64)


def test_rope_swap_in_engine_matches_and_rolls_back_to_the_original(tmp_path):
    engine = make_engine(tmp_path)
    prompt = [5, 17, 300, 42, 7, 99]
    want = reference_greedy(engine.model, prompt, 4)
    with torch.no_grad():
        want_logits = engine.model(input_ids=torch.tensor([prompt]), use_cache=False).logits
    engine.start()
    try:
        record = engine.call(lambda: engine.swaps.swap(ROPE_KERNEL)).result()
        assert record.status == "committed" and record.op == "rope" and record.binding == "function"
        assert record.functions == [DOTTED] and record.module_class == "apply_rotary_pos_emb"
        assert record.modules == 2 and record.module_classes == ["Qwen2Attention"]
        assert record.parity["live_calls"] >= 1 and record.parity["max_abs_err"] < 1e-4
        assert modeling_qwen2.apply_rotary_pos_emb is not ORIGINAL
        assert swapped_function_id(modeling_qwen2.apply_rotary_pos_emb) == record.swap_id
        assert engine.swaps.function_state() == {DOTTED: record.swap_id}

        req = engine.generate(prompt, 4, timeout=60)
        assert req.output_ids == want
        with torch.no_grad():
            got_logits = engine.call(
                lambda: engine.model(input_ids=torch.tensor([prompt]), use_cache=False).logits
            ).result()
        torch.testing.assert_close(got_logits, want_logits, atol=1e-4, rtol=1e-4)
        assert engine.swaps.get(record.swap_id)["calls"] > 0  # the kernel served

        [rolled] = engine.call(lambda: engine.swaps.rollback(record.swap_id)).result()
        assert rolled.status == "rolled_back"
        assert modeling_qwen2.apply_rotary_pos_emb is ORIGINAL
        assert engine.swaps.function_state() == {DOTTED: None}
    finally:
        engine.stop()


def test_manifest_reapplies_the_function_swap(tmp_path):
    model = load_model("tiny-qwen2").model
    engine = SwapEngine(model, tmp_path, model_id="tiny-qwen2")
    record = engine.swap(ROPE_KERNEL, module_class="gpuyantra.ops.rope.ApplyRotaryPosEmb")
    assert record.status == "committed"
    modeling_qwen2.apply_rotary_pos_emb = ORIGINAL  # the process ends: the global is gone with it

    model2 = load_model("tiny-qwen2").model
    engine2 = SwapEngine(model2, tmp_path, model_id="tiny-qwen2")
    assert engine2.reapply() == [{"swap_id": record.swap_id, "status": "committed", "reapplied": True}]
    assert swapped_function_id(modeling_qwen2.apply_rotary_pos_emb) == record.swap_id
    engine2.rollback(all=True)
    assert modeling_qwen2.apply_rotary_pos_emb is ORIGINAL


def test_faulty_rope_kernel_falls_back_and_rolls_back(tmp_path):
    engine = make_engine(tmp_path)
    long_prompt = list(range(1, 21))  # 20 positions: the kernel raises past 8
    want = reference_greedy(engine.model, long_prompt, 3)
    engine.start()
    try:
        path = tmp_path / "faulty_rope.py"
        path.write_text(faulty_rope_source(max_seq=8))
        record = engine.call(lambda: engine.swaps.swap(path)).result()  # parity on the 8-token probe passes
        assert record.status == "committed"
        req = engine.generate(long_prompt, 3, timeout=60)
        assert req.finish_reason == "length" and req.error is None and req.output_ids == want
        history = {r["swap_id"]: r for r in engine.swaps.history()}
        assert history[record.swap_id]["status"] == "rolled_back"
        assert history[record.swap_id]["fallbacks"] >= 1 and "seq 20" in history[record.swap_id]["last_error"]
        assert engine.swaps.active() == [] and modeling_qwen2.apply_rotary_pos_emb is ORIGINAL
    finally:
        engine.stop()


def test_profile_lists_a_rope_target(tmp_path, monkeypatch):
    engine = make_engine(tmp_path)
    engine.start()
    try:
        assert engine.generate([1, 2, 3, 4, 5], 2, timeout=60).output_ids
        prof = engine.call(engine.profile, exclusive=True).result()
        monkeypatch.setattr(profiling_module, "run_profiler", lambda *a, **k: None)
        fallback = engine.call(engine.profile, exclusive=True).result()
    finally:
        engine.stop()
    for result in (prof, fallback):
        rope = next(t for t in result["targets"] if t["op"] == "rope")
        assert rope["module_class"] == "apply_rotary_pos_emb" and rope["functions"] == [DOTTED]
        assert rope["qualified_class"] == "gpuyantra.ops.rope.ApplyRotaryPosEmb"
        assert rope["modules"] == 2 and rope["adapter"] == [] and rope["swapped"] == []
        assert rope["shapes"] and all(len(s) == 4 and s[1] == 4 and s[3] == 16 for s in rope["shapes"])
        assert 0 <= rope["share"] <= 1
    assert prof["source"] == "profiler" and fallback["source"] == "fallback"
