"""One-row prefill through a length bucket (`serving.prefill_graphs`): the prompt right-padded to the
bucket, the same static-shape pass a CUDA graph replays (run eagerly on the CPU). It writes only its
own cache row, gives the logits of the unpadded pass, leaves long prompts to the eager path, and its
graphs are dropped whenever the decode graphs start replaying other forwards."""

from __future__ import annotations

import torch

from serving.engine import Engine, GenRequest
from serving.models import load_model
from serving.prefill_graphs import MAX_BUCKET, length_buckets
from serving.routes_admin import graphs_info
from tests.serving.helpers import PROMPTS, RMS_NORM_KERNEL, reference_greedy

COUNTS = {"captures": 0, "replays": 0}  # nothing is captured on a CPU


def make_engine(tmp_path, **kw) -> Engine:
    kw.setdefault("max_seq_len", 128)
    return Engine(load_model("tiny-qwen2"), state_dir=tmp_path, max_batch=4, cuda_graphs=True, **kw)


def test_buckets_are_powers_of_two_within_the_context():
    assert length_buckets(127) == [16, 32, 64]
    assert length_buckets(4095)[-1] == MAX_BUCKET and length_buckets(8) == []


def test_a_padded_prefill_writes_its_row_alone_and_gives_the_unpadded_logits(tmp_path):
    engine = make_engine(tmp_path)
    graphs = engine.prefill_graphs
    assert graphs is not None and engine.graphs.on_forwards_changed == [graphs.invalidate]
    prompt = PROMPTS[2]  # 7 tokens: the 16-token bucket
    other = engine.cache
    engine.prefill_graphs = None
    want = engine.prefill_row(1, prompt).clone()  # eager, unpadded
    keys_row1 = other.keys[0][1, :, : len(prompt)].clone()
    for layer in other.keys:
        layer[1].zero_()  # its own row: written again by the padded pass
        layer[2].fill_(7.0)  # another row's cache: must stay as it is
    engine.prefill_graphs = graphs
    got = engine.prefill_row(1, prompt)
    assert graphs.static.keys() == {16} and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(other.keys[0][1, :, : len(prompt)], keys_row1, atol=1e-5, rtol=1e-5)
    assert all(bool((layer[2] == 7.0).all()) for layer in other.keys)


def test_a_prompt_past_the_largest_bucket_prefills_eagerly(tmp_path):
    engine = make_engine(tmp_path, max_seq_len=40)  # buckets 16 and 32
    long_prompt = [(7 * i + 3) % 500 for i in range(35)]
    assert engine.prefill_graphs.run(0, long_prompt) is None
    engine.start()
    try:
        request = engine.submit(GenRequest(long_prompt, 4))
        assert request.done.wait(60)
    finally:
        engine.stop()
    assert request.output_ids == reference_greedy(engine.model, long_prompt, 4)


def test_served_tokens_are_the_same_with_and_without_prefill_graphs(tmp_path):
    outputs = []
    for on in (True, False):
        engine = make_engine(tmp_path / str(on), prefill_graphs=on)
        assert (engine.prefill_graphs is not None) == on
        engine.start()
        try:
            requests = [engine.submit(GenRequest(p, 5)) for p in PROMPTS]
            for r in requests:
                assert r.done.wait(60)
        finally:
            engine.stop()
        outputs.append([r.output_ids for r in requests])
    assert outputs[0] == outputs[1] == [reference_greedy(engine.model, p, 5) for p in PROMPTS]


def test_rows_admitted_together_prefill_one_bucket_pass_each_when_their_prompts_are_short(tmp_path, monkeypatch):
    engine = make_engine(tmp_path, max_seq_len=256)  # buckets 16 ... 256
    graphs = engine.prefill_graphs
    long_prompt = [(5 * i + 1) % 500 for i in range(140)]  # the 256-token bucket: past ROWWISE_MAX_BUCKET
    assert graphs.takes_rows(PROMPTS[:3]) and not graphs.takes_rows([PROMPTS[0], long_prompt])
    rows_run: list[int] = []
    original = graphs.run
    monkeypatch.setattr(graphs, "run", lambda row, prompt: rows_run.append(row) or original(row, prompt))
    prompts = PROMPTS[:3]
    got = engine.prefill_rows([0, 1, 2], prompts)
    assert rows_run == [0, 1, 2]
    engine.prefill_graphs = None
    want = engine.prefill_rows([0, 1, 2], prompts)  # one eager pass, right-padded
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    engine.prefill_graphs = graphs
    rows_run.clear()
    engine.prefill_rows([0, 1], [PROMPTS[0], long_prompt])  # one long prompt: the shared eager pass
    assert rows_run == []


def test_a_swap_drops_the_captured_prefill_graphs(tmp_path):
    engine = make_engine(tmp_path)
    graphs = engine.prefill_graphs
    graphs.run(0, PROMPTS[0])
    graphs.static[16]["graph"], graphs.broken[32] = object(), "capture failed: stand-in"
    assert graphs_info(engine)["prefill"]["broken"] == {32: "capture failed: stand-in"}
    engine.swaps.swap(RMS_NORM_KERNEL)  # re-captures the decode graphs: the forwards changed
    assert graphs.static[16]["graph"] is None and graphs.broken == {}
    assert graphs_info(engine)["prefill"] == {"buckets": [16, 32, 64], "captured": [], "broken": {}, **COUNTS}
    assert graphs_info(make_engine(tmp_path / "eager", prefill_graphs=False))["prefill"] is None
