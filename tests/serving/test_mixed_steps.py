"""Mixed steps: a request arriving while others decode brings its prompt tokens into the next decode
step as rows of their own, instead of a prefill pass that stalls every stream. Passes are driven by
hand (no engine thread) so that the request arrives mid-flight at a known step; every request must get
the tokens a full forward gives, on the static-shape graph step (eager on the CPU) and on the eager
decode path, with either decode attention."""

from __future__ import annotations

import pytest
import torch

from serving.engine import Engine, GenRequest
from serving.models import load_model
from tests.serving.helpers import PROMPTS, reference_greedy

LONG_PROMPT = [(13 * i + 5) % 500 for i in range(20)]  # past the mixed budget below: prefills alone


def make_engine(tmp_path, **kw) -> Engine:
    options = {"max_batch": 4, "max_seq_len": 64, "mixed_prompt_tokens": 8, **kw}
    return Engine(load_model("tiny-qwen2"), state_dir=tmp_path, **options)


def drive(engine: Engine, first: list[GenRequest], later: list[GenRequest], after_passes: int = 3) -> None:
    """Submit `first`, run a few passes (a prefill, then decode steps), submit `later`, run to the end."""
    for r in first:
        engine.submit(r)
    for _ in range(after_passes):
        engine.scheduler._one_pass()
    for r in later:
        engine.submit(r)
    for _ in range(200):
        if all(r.done.is_set() for r in first + later):
            return
        engine.scheduler._one_pass()
    raise AssertionError("requests did not finish")


@pytest.mark.parametrize("graphs", [True, False], ids=["graph-step", "eager"])
@pytest.mark.parametrize("attention", ["sdpa", "triton"])
@pytest.mark.parametrize("after_passes", [1, 3], ids=["after-a-prefill", "while-a-step-runs-ahead"])
def test_requests_joining_mid_flight_get_the_tokens_of_a_full_forward(tmp_path, graphs, attention, after_passes):
    engine = make_engine(tmp_path, cuda_graphs=graphs, decode_attention=attention)
    first = [GenRequest(PROMPTS[0], 10), GenRequest(PROMPTS[2], 8)]
    # Two short prompts that fit one mixed step together (3 + 4 tokens), one too long for it.
    later = [GenRequest(PROMPTS[1], 6), GenRequest(PROMPTS[4], 6), GenRequest(LONG_PROMPT, 4)]
    drive(engine, first, later, after_passes)
    assert engine.mixed_admissions == 2  # the long prompt was prefilled on its own
    if graphs:
        assert engine.graphs is not None and engine.graphs.mixed_steps == 1
        if after_passes == 1:  # no step ahead: the mixed step fed from the host, the next queued from it
            assert engine.graphs.mixed_fed_steps == 0 and engine.steps_queued_from_host == 1
        else:  # queued behind the step ahead, its decode rows fed on the device, and the next one after it
            assert engine.graphs.mixed_fed_steps == 1 and engine.steps_queued_from_host == 0
    for r in first + later:
        assert r.finish_reason == "length"
        assert r.output_ids == reference_greedy(engine.model, r.prompt_ids, r.max_tokens)


def test_a_joining_request_reports_the_logprobs_of_a_prefill_pass(tmp_path):
    plain = make_engine(tmp_path / "plain", mixed_prompt_tokens=0)
    mixed = make_engine(tmp_path / "mixed")
    got = {}
    for name, engine in (("plain", plain), ("mixed", mixed)):
        joining = GenRequest(PROMPTS[4], 4, logprobs=3)
        drive(engine, [GenRequest(PROMPTS[0], 10)], [joining])
        got[name] = joining
    assert mixed.mixed_admissions == 1 and plain.mixed_admissions == 0
    assert got["mixed"].output_ids == got["plain"].output_ids
    for (lp_m, top_m), (lp_p, top_p) in zip(got["mixed"].output_logprobs, got["plain"].output_logprobs):
        assert lp_m == pytest.approx(lp_p, abs=1e-4)
        assert [t for t, _ in top_m] == [t for t, _ in top_p]


def test_a_sampled_request_joining_mid_flight_draws_what_it_draws_alone(tmp_path):
    # The same seed gives the same sample whether its first token comes from a mixed step or a prefill.
    outputs = []
    for name, tokens in (("plain", 0), ("mixed", 8)):
        engine = make_engine(tmp_path / name, mixed_prompt_tokens=tokens, cuda_graphs=True)
        sampled = GenRequest(PROMPTS[3], 6, temperature=0.9, seed=11)
        drive(engine, [GenRequest(PROMPTS[0], 12)], [sampled])
        assert engine.mixed_admissions == (1 if tokens else 0)
        outputs.append(sampled.output_ids)
    assert outputs[0] == outputs[1]


def test_the_graph_check_covers_the_mixed_step(tmp_path):
    engine = make_engine(tmp_path, cuda_graphs=True)
    assert engine.graphs is not None and engine.graphs.mixed_buckets == [4 + 8]
    report = engine.graphs.verify(previous=engine.graphs.reference_logits())
    assert "mixed:12" in report["buckets"] and report["max_rel_diff"] == 0.0


def test_mixed_steps_are_on_by_default_only_where_graphs_are_captured_and_their_cost_measured(tmp_path):
    from serving.engine import MIXED_ROW_TILE, mixed_tokens

    # Here (a CPU) graph steps run eagerly and nothing measures a mixed step: off unless asked for.
    engine = Engine(load_model("tiny-qwen2"), state_dir=tmp_path, max_batch=2, max_seq_len=32, cuda_graphs=True)
    assert engine.mixed_prompt_tokens == 0 and engine.graphs is not None and engine.graphs.mixed_buckets == []
    # CUDA graphs: on, the mixed graph's rows (decode rows and prompt rows) whole 64-row tiles.
    assert mixed_tokens(None, captured=True, max_batch=8) == 56 and MIXED_ROW_TILE == 64
    assert mixed_tokens(None, captured=True, max_batch=1) == 63
    assert mixed_tokens(None, captured=True, max_batch=48) == 80  # at least 32 prompt rows: two tiles
    assert mixed_tokens(72, captured=True, max_batch=8) == 72  # asked for: as asked
    assert mixed_tokens(None, captured=False, max_batch=8) == 0  # no measured graphs: off
    assert mixed_tokens(0, captured=True, max_batch=8) == 0  # 0 turns it off
    with pytest.raises(ValueError, match="mixed_prompt_tokens"):
        make_engine(tmp_path / "bad", mixed_prompt_tokens=-1)


def test_a_failing_mixed_step_fails_its_rows_and_serving_goes_on(tmp_path, monkeypatch):
    engine = make_engine(tmp_path, cuda_graphs=True)
    decoding, joining = GenRequest(PROMPTS[0], 10), GenRequest(PROMPTS[1], 4)

    def broken(*_args, **_kw) -> torch.Tensor:
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.runner, "mixed_rows", broken)
    monkeypatch.setattr(engine.graphs, "mixed_fed", broken)  # queued ahead: the request waits, then fails
    drive(engine, [decoding], [joining])
    assert decoding.finish_reason == "error" and joining.finish_reason == "error"
    assert "device lost" in (joining.error or "")
    later = GenRequest(PROMPTS[2], 3)
    drive(engine, [later], [])
    assert later.output_ids == reference_greedy(engine.model, PROMPTS[2], 3)


def test_with_a_measured_cost_a_mixed_step_is_taken_only_while_it_costs_less_than_a_prefill(tmp_path):
    # On a GPU the mixed graph's extra cost is measured after each capture; here it is set by hand.
    engine = make_engine(tmp_path, cuda_graphs=True)
    assert engine.graphs is not None
    engine.graphs.mixed_extra_ms = 1e9  # dearer than any prefill: arrivals prefill alone, and are timed
    costly = GenRequest(PROMPTS[1], 4)
    drive(engine, [GenRequest(PROMPTS[0], 12)], [costly])
    assert engine.mixed_admissions == 0 and len(engine.scheduler._interrupting_prefill_ms) == 1
    engine.graphs.mixed_extra_ms = 0.0  # cheaper than the prefill just timed
    cheap = GenRequest(PROMPTS[4], 4)
    drive(engine, [GenRequest(PROMPTS[2], 12)], [cheap])
    assert engine.mixed_admissions == 1
    for r in (costly, cheap):
        assert r.output_ids == reference_greedy(engine.model, r.prompt_ids, r.max_tokens)


def test_a_mixed_step_waits_for_a_timed_prefill_when_its_cost_is_known(tmp_path):
    engine = make_engine(tmp_path, cuda_graphs=True)
    assert engine.graphs is not None
    engine.graphs.mixed_extra_ms = 0.0
    assert not engine.mixed_pays()  # nothing to weigh it against yet
    engine.scheduler._interrupting_prefill_ms.append(0.5)
    assert engine.mixed_pays()


def test_a_prefill_that_captured_a_graph_is_no_sample_of_what_a_prefill_costs(tmp_path, monkeypatch):
    # A prefill graph's first use runs eagerly and captures (tens of ms on a GPU): weighing mixed
    # steps against it would take them where a replayed prefill is cheaper.
    engine = make_engine(tmp_path, cuda_graphs=True)
    assert engine.graphs is not None and engine.prefill_graphs is not None
    engine.graphs.mixed_extra_ms = 1e9  # every arrival prefills alone
    graphs, replay = engine.prefill_graphs, engine.prefill_graphs.run

    def first_use(row, prompt_ids):
        graphs.captures += 1  # what a capture at first use counts on a GPU
        return replay(row, prompt_ids)

    monkeypatch.setattr(graphs, "run", first_use)
    drive(engine, [GenRequest(PROMPTS[0], 12)], [GenRequest(PROMPTS[1], 4)])
    assert not engine.scheduler._interrupting_prefill_ms
    monkeypatch.setattr(graphs, "run", replay)
    drive(engine, [GenRequest(PROMPTS[2], 12)], [GenRequest(PROMPTS[4], 4)])
    assert len(engine.scheduler._interrupting_prefill_ms) == 1 and engine.mixed_admissions == 0


def test_the_kernels_report_says_what_the_interrupting_prefills_held(tmp_path):
    engine = make_engine(tmp_path, cuda_graphs=True, mixed_prompt_tokens=0)
    drive(engine, [GenRequest(PROMPTS[0], 12)], [GenRequest(PROMPTS[1], 4), GenRequest(PROMPTS[4], 4)])
    info = engine.mixed_info()
    assert info["admissions"] == 0 and info["interrupting_prefill_rows"] == [2]
    assert info["interrupting_prefill_ms"] is not None


def test_a_request_joins_ahead_into_the_row_of_a_request_that_ended(tmp_path):
    # Row 0 ends first; the arrival takes it while row 1 decodes and a step runs ahead of the host. The
    # prompt (8 tokens) reaches past where row 0's old request would still write, riding along.
    engine = make_engine(tmp_path, cuda_graphs=True)
    assert engine.graphs is not None
    short, long = GenRequest(PROMPTS[1], 2), GenRequest(PROMPTS[2], 14)
    drive(engine, [short, long], [], after_passes=0)  # runs until both end: start again by hand below
    short, long = GenRequest(PROMPTS[1], 2), GenRequest(PROMPTS[2], 14)
    for r in (short, long):
        engine.submit(r)
    while not short.done.is_set():
        engine.scheduler._one_pass()
    assert engine.scheduler._ahead is not None and engine.scheduler.slots[0] is None
    joining = GenRequest(list(range(30, 38)), 5)
    drive(engine, [], [joining], after_passes=0)
    while not long.done.is_set():
        engine.scheduler._one_pass()
    assert engine.graphs.mixed_fed_steps == 1 and engine.mixed_admissions == 1
    for r in (short, long, joining):
        assert r.output_ids == reference_greedy(engine.model, r.prompt_ids, r.max_tokens)


def test_a_sampled_arrival_joins_from_the_host_not_ahead(tmp_path):
    # A step queued ahead hands out argmax tokens only: a request that samples waits for the host's pass.
    engine = make_engine(tmp_path, cuda_graphs=True)
    assert engine.graphs is not None
    sampled = GenRequest(PROMPTS[1], 5, temperature=0.9, seed=3)
    drive(engine, [GenRequest(PROMPTS[0], 12)], [sampled])
    assert engine.graphs.mixed_fed_steps == 0 and engine.mixed_admissions == 1
    alone = make_engine(tmp_path / "alone", mixed_prompt_tokens=0)
    again = GenRequest(PROMPTS[1], 5, temperature=0.9, seed=3)
    drive(alone, [again], [])
    assert sampled.output_ids == again.output_ids


def test_streams_arriving_while_others_decode_get_the_tokens_of_a_full_forward(tmp_path):
    # The engine's own thread: each request's first token brings the next request, so every arrival
    # finds rows decoding (and, mostly, a step queued ahead of the host). The tokens must be a full
    # forward's whichever way each one joined.
    engine = make_engine(tmp_path, cuda_graphs=True)
    assert engine.graphs is not None
    prompts = [PROMPTS[i % len(PROMPTS)] + [i + 20] for i in range(8)]
    requests = [GenRequest(p, 6 + i % 4) for i, p in enumerate(prompts)]
    submitted: set[str] = set()

    def bring(following: GenRequest):
        def on_token(_token: int) -> None:
            if following.id not in submitted:
                submitted.add(following.id)
                engine.submit(following)

        return on_token

    for r, following in zip(requests, requests[2:]):
        r.on_token = bring(following)
    engine.start()
    try:
        for r in requests[:2]:
            submitted.add(r.id)
            engine.submit(r)
        for r in requests:
            assert r.done.wait(120)
    finally:
        engine.stop()
    assert engine.mixed_admissions >= 1 and engine.graphs.mixed_fed_steps >= 1
    for r in requests:
        assert r.finish_reason == "length"
        assert r.output_ids == reference_greedy(engine.model, r.prompt_ids, r.max_tokens)
