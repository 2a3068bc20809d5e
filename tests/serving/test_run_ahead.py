"""Graph decode one step ahead of the host: step k+1, fed on the device by step k, is queued before
the host reads step k's tokens. Whatever the requests do meanwhile (end by length or stop token,
sample, ask for logprobs, join mid-flight, meet a swap), every request gets exactly the tokens it
gets when the engine waits for each step. The static-shape step runs eagerly on the CPU."""

from __future__ import annotations

import threading

from serving.engine import Engine, GenRequest
from serving.models import load_model
from tests.serving.helpers import PROMPTS, RMS_NORM_KERNEL, reference_greedy


def make_engine(tmp_path, run_ahead: bool) -> Engine:
    return Engine(
        load_model("tiny-qwen2"), state_dir=tmp_path, max_batch=4, max_seq_len=64, cuda_graphs=True, run_ahead=run_ahead
    )


def workload(stop_token: int) -> list[GenRequest]:
    """Greedy rows of different lengths, one ended by a stop token, one sampled, one with logprobs."""
    return [
        GenRequest(PROMPTS[0], 9),
        GenRequest(PROMPTS[1], 3),
        GenRequest(PROMPTS[2], 12, stop_token_ids=frozenset({stop_token})),
        GenRequest(PROMPTS[3], 6, temperature=0.8, seed=7),
        GenRequest(PROMPTS[4], 5, logprobs=2),
        GenRequest(PROMPTS[0], 7),  # waits for a free slot, joins while the others decode
    ]


def serve(engine: Engine, requests: list[GenRequest]) -> list[tuple[list[int], str | None, list]]:
    """The first three requests, then the rest once the first has its first token (mid-flight)."""
    first_token = threading.Event()
    requests[0].on_token = lambda _t: first_token.set()
    engine.start()
    try:
        for r in requests[:3]:
            engine.submit(r)
        assert first_token.wait(60)
        for r in requests[3:]:
            engine.submit(r)
        for r in requests:
            assert r.done.wait(120)
    finally:
        engine.stop()
    return [(r.output_ids, r.finish_reason, r.output_logprobs) for r in requests]


def test_run_ahead_serves_the_tokens_of_waiting_for_every_step(tmp_path):
    waiting = make_engine(tmp_path / "a", run_ahead=False)
    stop_token = reference_greedy(waiting.model, PROMPTS[2], 4)[3]  # ends request 3 after 3 tokens
    want = serve(waiting, workload(stop_token))
    assert waiting.graphs.fed_steps == 0

    ahead = make_engine(tmp_path / "b", run_ahead=True)
    got = serve(ahead, workload(stop_token))
    assert ahead.graphs.fed_steps > 0  # it did run ahead
    assert got == want
    assert got[2][1] == "stop" and len(got[2][0]) == 3
    assert got[0][0] == reference_greedy(ahead.model, PROMPTS[0], 9)


def test_a_swap_between_steps_run_ahead_keeps_every_token(tmp_path):
    engine = make_engine(tmp_path, run_ahead=True)
    want = [reference_greedy(engine.model, p, 14) for p in PROMPTS[:4]]
    first_token = threading.Event()
    requests = [GenRequest(p, 14) for p in PROMPTS[:4]]
    requests[0].on_token = lambda _t: first_token.set()
    engine.start()
    try:
        for r in requests:
            engine.submit(r)
        assert first_token.wait(60)
        engine.call(lambda: engine.swaps.swap(RMS_NORM_KERNEL)).result(timeout=300)  # re-captures mid-flight
        for r in requests:
            assert r.done.wait(120)
    finally:
        engine.stop()
    assert [r.output_ids for r in requests] == want
    assert engine.graphs.fed_steps > 0


def test_the_benchmark_runs_ahead_and_generates_the_same_tokens(tmp_path):
    engine = make_engine(tmp_path, run_ahead=True)
    ahead = engine.benchmark(max_tokens=6, prompt_tokens=4, batch=2)
    fed = engine.graphs.fed_steps
    engine.run_ahead = False
    waiting = engine.benchmark(max_tokens=6, prompt_tokens=4, batch=2)
    assert fed >= 5 and engine.graphs.fed_steps == fed
    assert ahead["run_ahead"] and not waiting["run_ahead"]
    assert ahead["output_ids"] == waiting["output_ids"]


def test_a_request_joining_the_slot_of_one_that_stopped_mid_run_ahead_is_served_right(tmp_path):
    # Two slots, all greedy: B ends by a stop token while the step after it is already queued; C,
    # whose prompt is longer than B got, is prefilled into B's slot. The queued step still carries
    # B's row: nothing may run ahead from it into C's cache.
    engine = Engine(load_model("tiny-qwen2"), state_dir=tmp_path, max_batch=2, max_seq_len=64, cuda_graphs=True)
    long_prompt = [(13 * i + 5) % 500 for i in range(24)]
    stop_token = reference_greedy(engine.model, PROMPTS[2], 4)[3]
    requests = [
        GenRequest(PROMPTS[0], 16),
        GenRequest(PROMPTS[2], 16, stop_token_ids=frozenset({stop_token})),
        GenRequest(long_prompt, 6),
    ]
    engine.start()
    try:
        for r in requests:
            engine.submit(r)
        for r in requests:
            assert r.done.wait(120)
    finally:
        engine.stop()
    assert requests[1].finish_reason == "stop"
    assert requests[0].output_ids == reference_greedy(engine.model, PROMPTS[0], 16)
    assert requests[2].output_ids == reference_greedy(engine.model, long_prompt, 6)
    assert engine.graphs.fed_steps > 0


def test_a_recapture_while_a_step_runs_ahead_hands_it_out_and_feeds_the_next_from_the_host(tmp_path):
    # Passes driven by hand (no engine thread): a step is queued ahead, then the graphs are captured
    # again (what a swap between passes does: the fed inputs are reset). The queued step's tokens
    # still count, and the next step loads its inputs from the host instead of running ahead.
    engine = make_engine(tmp_path, run_ahead=True)
    requests = [engine.submit(GenRequest(p, 8)) for p in PROMPTS[:2]]
    engine.scheduler._one_pass()  # prefill both
    engine.scheduler._one_pass()  # a decode step, and the next one queued ahead
    assert engine.scheduler._ahead is not None and engine.graphs.fed_steps == 1
    engine.graphs.capture_all()
    for _ in range(20):
        if all(r.done.is_set() for r in requests):
            break
        engine.scheduler._one_pass()
    assert [r.finish_reason for r in requests] == ["length", "length"]
    assert [r.output_ids for r in requests] == [reference_greedy(engine.model, p, 8) for p in PROMPTS[:2]]


def test_a_row_ending_before_the_others_does_not_stop_the_steps_running_ahead(tmp_path):
    # Three rows, the middle one ends first: its row rides along (tokens dropped) and every decode
    # step after the first still runs ahead. Each request gets the tokens of a full forward.
    engine = make_engine(tmp_path, run_ahead=True)
    lengths = [12, 4, 12]
    requests = [engine.submit(GenRequest(p, n)) for p, n in zip(PROMPTS[:3], lengths)]
    for _ in range(40):
        if all(r.done.is_set() for r in requests):
            break
        engine.scheduler._one_pass()
    assert [r.output_ids for r in requests] == [reference_greedy(engine.model, p, n) for p, n in zip(PROMPTS, lengths)]
    assert engine.graphs.fed_steps == max(lengths) - 2  # decode steps (all but the prefill's token) but the first


def test_decode_timing_reports_the_host_cycle_of_each_step_run_ahead(tmp_path):
    # Every step queued ahead (all but the first decode step, fed from the host) is timed from the
    # previous step's tokens: its cycle holds its wait for the tokens and the host's own share.
    engine = make_engine(tmp_path, run_ahead=True)
    assert engine.decode_timing() is None  # nothing decoded yet
    requests = [engine.submit(GenRequest(p, 10)) for p in PROMPTS[:2]]
    for _ in range(30):
        if all(r.done.is_set() for r in requests):
            break
        engine.scheduler._one_pass()
    timing = engine.decode_timing()
    assert timing is not None and timing["steps"] == engine.graphs.fed_steps
    assert 0 <= timing["wait_ms"] <= timing["cycle_ms"] <= timing["cycle_p90_ms"]
    assert timing["host_ms"] > 0


def test_after_a_request_joins_the_next_step_is_queued_before_the_tokens_are_handed_out(tmp_path):
    # Passes driven by hand. Two rows decode running ahead; a third request arrives, is prefilled into
    # the free slot while a step runs ahead, and that step cannot feed the next one (the new row's
    # input comes from the host). The next step is then queued from the host before the queued
    # step's tokens are handed out, and every request still gets the tokens of full forwards.
    engine = make_engine(tmp_path, run_ahead=True)
    lengths = [10, 10, 6]
    requests = [engine.submit(GenRequest(p, n)) for p, n in zip(PROMPTS[:2], lengths)]
    for _ in range(4):
        engine.scheduler._one_pass()  # prefill, then decode steps running ahead
    assert engine.scheduler._ahead is not None and engine.steps_queued_from_host == 0
    requests.append(engine.submit(GenRequest(PROMPTS[2], lengths[2])))
    engine.scheduler._one_pass()  # its prefill, with a step in flight
    engine.scheduler._one_pass()  # that step handed out: the next one queued from the host first
    assert engine.steps_queued_from_host == 1 and engine.scheduler._ahead is not None
    for _ in range(30):
        if all(r.done.is_set() for r in requests):
            break
        engine.scheduler._one_pass()
    want = [reference_greedy(engine.model, p, n) for p, n in zip(PROMPTS, lengths)]
    assert [r.output_ids for r in requests] == want
    assert engine.steps_queued_from_host == 1  # afterwards every step ran ahead on the device
