"""The generation engine in-process: slot cache correctness, batching, swaps between forward passes,
the static-shape (CUDA-graph) decode path run eagerly on the CPU, benchmark and profile."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from gpuyantra.swap import swapped_id
from serving import profiling as profiling_module
from serving import scheduler as scheduler_module
from serving.engine import Engine, GenRequest, RequestError
from serving.models import load_model
from serving.plan import StepPlan
from serving.scheduler import share_between_clients
from tests.serving.helpers import PROMPTS, RMS_NORM_KERNEL, reference_greedy


def make_engine(tmp_path, preset="tiny-qwen2", **kw):
    kw.setdefault("max_batch", 4)
    kw.setdefault("max_seq_len", 128)
    return Engine(load_model(preset), state_dir=tmp_path, **kw)


def record_plans(engine) -> list[StepPlan]:
    """Every step plan the scheduler hands the engine's runner from now on."""
    plans: list[StepPlan] = []
    run = engine.runner.run

    def recorded(plan: StepPlan):
        plans.append(plan)
        return run(plan)

    engine.runner.run = recorded
    return plans


def test_step_plans_refuse_what_no_pass_could_run():
    decode = StepPlan.decode([5, 6, 7], [3, 9, 4], graph_bucket=4)
    assert (decode.kind, decode.rows, decode.input_rows, decode.graph_bucket) == ("decode", (0, 1, 2), 3, 4)
    prefill = StepPlan.prefill([2, 0], [[1, 2, 3], [4]])
    assert (prefill.rows, prefill.prompts, prefill.input_rows) == ((2, 0), ((1, 2, 3), (4,)), 2)
    assert StepPlan.mixed([5, 1, 2], [7, 0, 1], [0, 3, 3]).rows == (0, 3, 3)
    with pytest.raises(ValueError, match="bucket 2 is smaller than the step's 3 rows"):
        StepPlan.decode([5, 6, 7], [3, 9, 4], graph_bucket=2)
    with pytest.raises(ValueError, match="one prompt per cache row"):
        StepPlan.prefill([0, 1], [[1]])
    with pytest.raises(ValueError, match="a position and a cache row per token"):
        StepPlan.mixed([5, 1], [7, 0], [0])


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-llama", "tiny-gpt2"])
def test_batched_generation_matches_full_forward(tmp_path, preset):
    engine = make_engine(tmp_path, preset)
    assert engine.self_check_report["ok"]
    want = [reference_greedy(engine.model, p, 6) for p in PROMPTS]
    plans = record_plans(engine)
    engine.start()
    try:
        reqs = [engine.submit(GenRequest(p, 6)) for p in PROMPTS * 2]  # 10 requests, 4 slots
        for r in reqs:
            assert r.done.wait(60)
        assert [r.output_ids for r in reqs] == want * 2
        assert all(r.finish_reason == "length" for r in reqs)
        # Every pass went through the runner as a plan: prefills of the 10 prompts, eager decode steps.
        assert {p.kind for p in plans} == {"prefill", "decode"}
        prefills = [p for p in plans if p.kind == "prefill"]
        assert sum(p.input_rows for p in prefills) == 10
        assert all(len(set(p.rows)) == len(p.rows) and set(p.rows) <= set(range(4)) for p in prefills)
        assert all(p.graph_bucket is None and p.input_rows <= 4 for p in plans if p.kind == "decode")
    finally:
        engine.stop()


def test_static_decode_path_matches_eager_and_recaptures_on_swap(tmp_path):
    # cuda_graphs on a CPU: the same static-shape step (full-length masked attention, positions
    # from a static buffer, writes at the scratch position while "capturing") runs eagerly.
    engine = make_engine(tmp_path, cuda_graphs=True)
    assert engine.graphs is not None and not engine.graphs.capture_enabled
    want = [reference_greedy(engine.model, p, 5) for p in PROMPTS]
    plans = record_plans(engine)
    engine.start()
    try:
        captures = engine.graphs.captures
        reqs = [engine.submit(GenRequest(p, 5)) for p in PROMPTS]
        for r in reqs:
            assert r.done.wait(60)
        assert [r.output_ids for r in reqs] == want
        graph_steps = [p for p in plans if p.kind == "decode"]  # the steps the host fed (not run ahead)
        assert graph_steps and all(p.graph_bucket == engine.graphs.bucket_for(p.input_rows) for p in graph_steps)
        record = engine.call(lambda: engine.swaps.swap(RMS_NORM_KERNEL)).result()
        assert record.parity["graph"]["buckets"] == [1, 2, 4]
        assert engine.graphs.captures == captures + 1
        reqs = [engine.submit(GenRequest(p, 5)) for p in PROMPTS]
        for r in reqs:
            assert r.done.wait(120)
        assert [r.output_ids for r in reqs] == want
        engine.call(lambda: engine.swaps.rollback(all=True)).result()
        assert engine.graphs.captures == captures + 2  # rollback re-captures with the originals
    finally:
        engine.stop()


def test_compare_captures_each_side_once_and_serves_the_swap_after(tmp_path):
    engine = make_engine(tmp_path, cuda_graphs=True)
    want = [reference_greedy(engine.model, p, 5) for p in PROMPTS]
    engine.start()
    try:
        record = engine.call(lambda: engine.swaps.swap(RMS_NORM_KERNEL)).result()
        captures = engine.graphs.captures
        seen = []
        real_benchmark = engine.speed.benchmark

        def benchmark(*args):  # which forwards each phase measures
            seen.append(swapped_id(engine.model.model.norm))
            return real_benchmark(*args)

        engine.speed.benchmark = benchmark  # type: ignore[method-assign]
        answer = engine.call(
            lambda: engine.compare_swap(record.swap_id, [1, 2], rounds=2, max_tokens=3, repeats=1), exclusive=True
        ).result()
        assert engine.graphs.captures == captures + 2  # one per side, not one per phase
        assert seen == [record.swap_id] * 2 + [None] * 4 + [record.swap_id] * 2  # with, without, without, with
        assert [len(b["drops"]) for b in answer["batches"]] == [2, 2]
        assert swapped_id(engine.model.model.norm) == record.swap_id
        reqs = [engine.submit(GenRequest(p, 5)) for p in PROMPTS]
        for r in reqs:
            assert r.done.wait(120)
        assert [r.output_ids for r in reqs] == want
    finally:
        engine.stop()


def test_swaps_only_happen_between_forward_passes(tmp_path):
    engine = make_engine(tmp_path)
    norms = [m for m in engine.model.modules() if type(m).__name__ == "Qwen2RMSNorm"]
    violations: list[str] = []
    states: list[str | None] = []
    current: dict[str, object] = {}

    def state() -> set:
        return {swapped_id(m) for m in norms}

    def before(module, args, kwargs):
        s = state()
        if len(s) != 1:
            violations.append(f"half-swapped at the start of a pass: {s}")
        current["s"] = s

    def after(module, args, kwargs, output):
        if state() != current["s"]:
            violations.append(f"forwards changed during a pass: {current['s']} -> {state()}")
        states.append(next(iter(current["s"])))

    engine.model.register_forward_pre_hook(before, with_kwargs=True)
    engine.model.register_forward_hook(after, with_kwargs=True)
    want = {tuple(p): reference_greedy(engine.model, p, 4) for p in PROMPTS}
    states.clear()
    engine.start()
    stop = threading.Event()
    errors: list[str] = []

    def client(k):
        i = k
        while not stop.is_set():
            p = PROMPTS[i % len(PROMPTS)]
            r = engine.generate(p, 4, timeout=60)
            if r.output_ids != want[tuple(p)]:
                errors.append(f"{p}: {r.output_ids}")
            i += 1

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(8):
            record = engine.call(lambda: engine.swaps.swap(RMS_NORM_KERNEL)).result(timeout=60)
            engine.call(lambda swap_id=record.swap_id: engine.swaps.rollback(swap_id)).result(timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        engine.stop()
    assert not violations, violations[:3]
    assert not errors, errors[:3]
    assert None in states and any(s is not None for s in states)  # passes ran on both sides


def test_request_limits(tmp_path):
    engine = make_engine(tmp_path, max_seq_len=32)
    with pytest.raises(RequestError, match="exceeds the served context"):
        engine.validate(GenRequest(list(range(20)), 20))
    with pytest.raises(RequestError, match="empty"):
        engine.validate(GenRequest([], 2))
    with pytest.raises(RequestError, match=r"\[0, 512\)"):
        engine.validate(GenRequest([512], 2))
    engine.validate(GenRequest(list(range(20)), 11))  # 20 + 11 - 1 = 30 <= 31 usable


def test_benchmark_and_fallback_profile(tmp_path, monkeypatch):
    engine = make_engine(tmp_path)
    engine.start()
    try:
        assert engine.generate([1, 2, 3], 3).output_ids
        bench = engine.call(lambda: engine.benchmark(max_tokens=4, prompt_tokens=6, batch=2), exclusive=True).result()
        assert bench["tokens_per_s"] > 0 and bench["batch"] == 2 and bench["path"] == "eager"
        monkeypatch.setattr(profiling_module, "run_profiler", lambda *a, **k: None)  # no profiler module
        prof = engine.call(engine.profile, exclusive=True).result()
    finally:
        engine.stop()
    assert prof["source"] == "fallback"
    by_op = {t["op"]: t for t in prof["targets"]}
    norm = by_op["rms_norm"]
    for key in ("op", "module_class", "qualified_class", "modules", "adapter", "shapes", "dtype", "regime", "share"):
        assert key in norm, key
    assert norm["module_class"] == "Qwen2RMSNorm" and norm["modules"] == 5 and norm["dtype"] == "float32"
    assert norm["regime"] == "unknown" and 0 <= norm["share"] <= 1
    assert [1, 3, 64] in norm["shapes"]  # the prefill shape seen in traffic
    assert {"kernel_param": "eps", "module_attr": "variance_epsilon"} in norm["adapter"]


def test_faulty_kernel_pass_is_rerun_on_the_original_forwards(tmp_path):
    from tests.serving.candidates import rms_norm_source

    engine = make_engine(tmp_path)
    long_prompt = list(range(1, 21))  # 20 prefill rows
    want = reference_greedy(engine.model, long_prompt, 4)
    engine.start()
    try:
        path = tmp_path / "faulty.py"
        path.write_text(rms_norm_source(max_rows=8))
        record = engine.call(lambda: engine.swaps.swap(path, live_shapes=[[1, 1, 64], [1, 8, 64]])).result()
        passes = engine.forward_passes
        req = engine.generate(long_prompt, 4, timeout=60)
        assert req.finish_reason == "length" and req.output_ids == want
        assert engine.forward_passes == passes + 1 + 4  # the faulted prefill ran twice, then 3 decode steps
        history = {r["swap_id"]: r for r in engine.swaps.history()}
        assert history[record.swap_id]["status"] == "rolled_back"
        assert history[record.swap_id]["fallbacks"] >= 1 and engine.swaps.active() == []
    finally:
        engine.stop()


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-gpt2"])
def test_waiting_requests_are_prefilled_together(tmp_path, preset):
    engine = make_engine(tmp_path, preset)
    want = [reference_greedy(engine.model, p, 4) for p in PROMPTS[:4]]
    reqs = [engine.submit(GenRequest(p, 4)) for p in PROMPTS[:4]]  # queued before the loop starts
    passes = engine.forward_passes
    engine.start()
    try:
        for r in reqs:
            assert r.done.wait(60)
        assert [r.output_ids for r in reqs] == want  # prompts of 5, 3, 7, 3 tokens, right-padded
        # one prefill pass for all four rows, then 3 decode steps (the 4th token needs no pass)
        assert engine.forward_passes - passes == 1 + 3
    finally:
        engine.stop()


def test_prefill_batches_stay_within_the_token_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(scheduler_module, "PREFILL_TOKEN_BUDGET", 10)
    engine = make_engine(tmp_path)  # not started: _admit is driven by hand
    for p in PROMPTS[:4]:  # prompt lengths 5, 3, 7, 3
        engine.submit(GenRequest(p, 2))

    def admit_lengths():
        admitted = engine.scheduler._admit()
        return [len(r.prompt_ids) for _, r in admitted]

    assert admit_lengths() == [5, 3]  # 2 rows x 5 tokens = 10 fits; adding 7 would pad to 3 x 7
    assert admit_lengths() == [7]  # a lone prompt always fits; 7 + 3 would pad to 2 x 7 = 14
    assert admit_lengths() == [3]
    assert engine.scheduler._admit() == []


def test_waiting_requests_are_shared_between_clients_by_what_each_holds():
    flood = [GenRequest([1], 1, client="10.0.0.9") for _ in range(3)]
    busy = GenRequest([1], 1, client="10.0.0.2")  # two of its requests decode already
    in_process = GenRequest([1], 1)
    order = share_between_clients([*flood, busy, in_process], Counter({"10.0.0.2": 2}))
    # ranks: flood 0, 1, 2; busy 2; in_process 0; ties go in arrival order
    assert [r.id for r in order] == [r.id for r in (flood[0], in_process, flood[1], flood[2], busy)]
    assert share_between_clients(flood, Counter()) == flood  # one client: its order stands


def test_a_client_flooding_the_queue_does_not_hold_back_another(tmp_path):
    engine = make_engine(tmp_path, max_batch=2)  # not started: _admit is driven by hand
    flood = [engine.submit(GenRequest(PROMPTS[0], 2, client="10.0.0.9")) for _ in range(3)]
    other = engine.submit(GenRequest(PROMPTS[1], 2, client="10.0.0.1"))
    assert [r.id for _, r in engine.scheduler._admit()] == [flood[0].id, other.id]
    assert engine.scheduler.waiting_count == 2


def test_live_speed_reads_served_steps_without_pausing_traffic(tmp_path):
    engine = make_engine(tmp_path, max_seq_len=2048)
    engine.start()
    try:
        idle = engine.live_speed(batch=1, window_s=0.5, min_steps=5)
        assert idle["measured"] == "none" and "no live traffic" in idle["reason"]
        request = engine.submit(GenRequest(PROMPTS[0], 2000))  # one row decoding while we watch
        while len(request.output_ids) < 3:
            assert not request.done.wait(0.01)
        seen = len(request.output_ids)
        live = engine.live_speed(batch=1, window_s=0.5, min_steps=5, repeats=3)
        assert live["measured"] == "live" and live["batch"] == 1 and live["steps"] >= 5
        assert live["tokens_per_s"] > 0 and live["repeats"] == 3 and len(live["tokens_per_s_samples"]) == 3
        assert len(request.output_ids) >= seen + live["steps"]  # it kept decoding: nothing was paused
        if not request.done.is_set():
            wider = engine.live_speed(batch=2, window_s=0.2, min_steps=5)
            assert wider["measured"] == "none" and "at 2 row(s)" in wider["reason"]
        request.cancel()
        assert request.done.wait(30)
    finally:
        engine.stop()
