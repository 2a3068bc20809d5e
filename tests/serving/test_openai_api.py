"""Unit tests of the OpenAI-compatible layer's helpers: stop strings, incremental text, log-probabilities,
and the generation core against a scripted engine."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
import torch

from serving.engine import GenRequest, token_logprobs
from serving.generation import (
    Generation,
    IncrementalText,
    chat_logprobs,
    completion_logprobs,
    stop_overlap,
    truncate_at_stop,
)
from serving.models import ByteTokenizer


@pytest.mark.parametrize(
    "text, stops, want",
    [
        ("hello", None, ("hello", False)),
        ("hello", ["x"], ("hello", False)),
        ("hello world", ["o"], ("hell", True)),
        ("hello world", ["world", "lo"], ("hel", True)),  # the earliest stop wins, whichever is listed first
        ("stop", ["stop"], ("", True)),
    ],
)
def test_truncate_at_stop(text, stops, want):
    assert truncate_at_stop(text, stops) == want


@pytest.mark.parametrize(
    "text, stops, want",
    [
        ("abc", None, 0),
        ("abc", ["x"], 0),
        ("abST", ["STOP"], 2),
        ("abSTO", ["STOP", "O"], 3),
        ("S", ["STOP"], 1),
        ("abSTOP", ["STOP"], 0),  # a whole stop is truncate_at_stop's business
    ],
)
def test_stop_overlap(text, stops, want):
    assert stop_overlap(text, stops) == want


def test_incremental_text_holds_back_incomplete_utf8():
    inc = IncrementalText(ByteTokenizer(512))
    assert [inc.push(b) for b in "aé".encode()] == ["a", "", "é"]
    assert inc.emitted == "aé"


def test_token_logprobs_are_log_softmax_of_float32_logits():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 0.0, 5.0], [9.0, 0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    out = token_logprobs(logits, [2, None, 0], [2, 3, 0])
    want = torch.log_softmax(logits.float(), dim=-1)
    assert out[1] is None
    chosen, top = out[0]
    assert chosen == pytest.approx(float(want[0, 2]))
    assert [i for i, _ in top] == [1, 2] and top[0][1] == pytest.approx(float(want[0, 1]))
    assert out[2] == (pytest.approx(float(want[2, 0])), [])


def test_logprob_objects():
    tok = ByteTokenizer(512)
    ids = [104, 0xC3, 0xA9]  # "h", then "é" as two byte tokens
    entries = [(-0.1, [(104, -0.1), (105, -2.0)]), (-0.5, [(0xC4, -0.4)]), (-0.2, [])]
    legacy = completion_logprobs(tok, ids, entries, [0, 1, 1])
    assert legacy["tokens"] == ["h", "\ufffd", "\ufffd"] and legacy["token_logprobs"] == [-0.1, -0.5, -0.2]
    assert legacy["top_logprobs"][0] == {"h": -0.1, "i": -2.0}
    assert legacy["top_logprobs"][1] == {"\ufffd": -0.4}  # two ids with one text: the likelier one's
    assert legacy["top_logprobs"][2] == {"\ufffd": -0.2}  # the chosen token is always there
    assert legacy["text_offset"] == [0, 1, 1]
    # By id, likeliest first: the ids one text merged above stay apart (the chosen one is not added).
    assert legacy["top_token_logprobs"] == [[[104, -0.1], [105, -2.0]], [[0xC4, -0.4]], []]
    chat = chat_logprobs(tok, ids, entries)["content"]
    assert chat[0] == {
        "token": "h",
        "logprob": -0.1,
        "bytes": [104],
        "top_logprobs": [
            {"token": "h", "logprob": -0.1, "bytes": [104]},
            {"token": "i", "logprob": -2.0, "bytes": [105]},
        ],
    }
    assert bytes(chat[1]["bytes"] + chat[2]["bytes"]).decode() == "é" and chat[2]["top_logprobs"] == []


class ScriptedEngine:
    """Engine stand-in: each submitted request 'generates' the script's bytes on its own thread,
    with made-up log-probabilities, until max_tokens or cancel."""

    def __init__(self, script: str, eos: int | None = None):
        self.tokenizer = ByteTokenizer(512)
        self.tokenizer.eos_token_ids = frozenset({eos} if eos is not None else ())
        self.script = list(script.encode())
        self.usable_len = 64
        self.model_name = "scripted"

    def validate(self, req: GenRequest) -> None:
        pass

    def submit(self, req: GenRequest) -> None:
        def run():
            reason = "length"
            for k, token in enumerate(self.script[: req.max_tokens]):
                if req.cancelled:
                    reason = "cancelled"
                    break
                if token in req.stop_token_ids:
                    reason = "stop"
                    break
                if req.logprobs is not None:
                    req.output_logprobs.append((-float(k), [(token, -float(k))]))
                req.output_ids.append(token)
                req.on_token(token)
            req.finish_reason = reason
            req.done.set()
            req.on_finish(req)

        threading.Thread(target=run, daemon=True).start()


def run_generation(engine, **kw):
    """(all deltas, the Generation) of one prompt [1, 2] on `engine`."""

    async def collect(gen):
        return [d async for d in gen.deltas()]

    async def go():
        params = dict(n=1, max_tokens=None, temperature=0.0, top_p=1.0, seed=None, stops=None, logprobs=None)
        gen = Generation(engine, [[1, 2]], **{**params, **kw})
        gen.start()
        return await asyncio.wait_for(collect(gen), 10), gen

    return asyncio.run(go())


def test_generation_streams_without_ever_sending_a_stop_string():
    deltas, gen = run_generation(ScriptedEngine("Hello STOP world"), stops=["STOP", "xyz"], logprobs=0)
    assert all("S" not in d.text for d in deltas)  # "S", "ST", "STO" were held back, then dropped
    assert "".join(d.text for d in deltas) == "Hello "
    assert deltas[-1].finish_reason == "stop" and all(d.finish_reason is None for d in deltas[:-1])
    ids = [i for d in deltas for i in d.token_ids]
    assert bytes(ids) == b"Hello STOP"  # up to the token that completed the stop string
    assert [e[0] for d in deltas for e in d.logprobs] == [-float(k) for k in range(10)]
    assert [o for d in deltas for o in d.offsets] == list(range(10))
    assert gen.usage() == {"prompt_tokens": 2, "completion_tokens": 10, "total_tokens": 12}


def test_generation_n_samples_length_and_eos():
    deltas, gen = run_generation(ScriptedEngine("abcdef"), n=3, max_tokens=4)
    for index in range(3):
        mine = [d for d in deltas if d.index == index]
        assert "".join(d.text for d in mine) == "abcd" and mine[-1].finish_reason == "length"
    assert [c.req.seed for c in gen.choices] == [None] * 3 and gen.usage()["completion_tokens"] == 12
    _, gen = run_generation(ScriptedEngine("abc"), n=2, seed=7)
    assert [c.req.seed for c in gen.choices] == [7, 8]  # independent samples
    deltas, _ = run_generation(ScriptedEngine("ab\ncd", eos=ord("\n")))
    assert "".join(d.text for d in deltas) == "ab" and deltas[-1].finish_reason == "stop"
    # Without max_tokens the budget is the rest of the context.
    _, gen = run_generation(ScriptedEngine("a"))
    assert gen.choices[0].req.max_tokens == 64 - 2 + 1


def test_sample_seeds_stay_in_torch_range():
    from serving.generation import SEED_MAX, _sample_seed

    assert _sample_seed(None, 3) is None and _sample_seed(5, 2) == 7
    assert _sample_seed(SEED_MAX, 1) == 0
    torch.Generator().manual_seed(_sample_seed(SEED_MAX - 1, 1))


@pytest.mark.parametrize("seed", range(3))
def test_incremental_text_of_a_long_completion_equals_its_whole_decoding(tmp_path, seed):
    # Past its window the decoder slides; its deltas must still add up to the whole decoding, with
    # multi-byte characters split over tokens (byte tokenizer) and with a byte-level BPE tokenizer.
    from transformers import AutoTokenizer

    from serving.models import HFTokenizer
    from tests.serving.helpers import write_hf_cache_model

    folder = write_hf_cache_model(tmp_path, "org/tok")
    bpe = HFTokenizer(AutoTokenizer.from_pretrained(folder), type("Config", (), {"vocab_size": 258})())
    text = "".join(random.Random(seed).choice(["a", " b", "é", "水", "🙂", "\n", "xyz "]) for _ in range(300))
    for tok in (ByteTokenizer(512), bpe):
        ids = tok.encode(text)
        inc = IncrementalText(tok)
        deltas = [inc.push(i) for i in ids]
        assert "".join(deltas) == inc.emitted == tok.decode(ids) == text
        assert len(ids) > 4 * IncrementalText.WINDOW_TOKENS


def test_tokens_posted_from_another_thread_arrive_in_order_with_one_wake_up_per_burst(monkeypatch):
    from serving import generation

    wake_ups = []
    deliver = generation._Mailbox._deliver

    def counted(self):
        wake_ups.append(1)
        deliver(self)

    monkeypatch.setattr(generation._Mailbox, "_deliver", counted)

    async def run() -> list[list[int]]:
        box = generation._mailbox(asyncio.get_running_loop())
        queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(8)]

        def engine_thread() -> None:
            for step in range(50):  # a decode step hands each of 8 streams its token, back to back
                for q in queues:
                    box.post(q, step)

        thread = threading.Thread(target=engine_thread)
        thread.start()
        got = [[await q.get() for _ in range(50)] for q in queues]
        thread.join()
        return got

    assert asyncio.run(run()) == [list(range(50))] * 8
    assert 1 <= len(wake_ups) < 400  # posted 400 times


def test_tokens_queued_behind_a_busy_consumer_go_out_as_one_delta_per_choice():
    # The event loop fell behind: five tokens of choice 0 and three of choice 1 wait in the queue.
    # They go out as one delta each (text, token ids, offsets and logprobs together), then the
    # finish deltas; nothing is lost or reordered.
    async def go() -> list:
        params = dict(max_tokens=None, temperature=0.0, top_p=1.0, seed=None, stops=None, logprobs=0)
        gen = Generation(ScriptedEngine(""), [[1, 2]], n=2, **params)  # not started: tokens posted here
        for index, word in ((0, b"hello"), (1, b"abc")):
            req = gen.choices[index].req
            for k, token in enumerate(word):
                req.output_ids.append(token)
                req.output_logprobs.append((-float(k), [(token, -float(k))]))
                gen._post(index, "token", token)
        stream = gen.deltas()
        got = [await stream.__anext__(), await stream.__anext__()]
        for index, c in enumerate(gen.choices):
            c.req.finish_reason = "length"
            gen._post(index, "finish", c.req)
        return got + [d async for d in stream]

    deltas = asyncio.run(asyncio.wait_for(go(), 10))
    assert [(d.index, d.text, bytes(d.token_ids), d.offsets, d.finish_reason) for d in deltas] == [
        (0, "hello", b"hello", [0, 1, 2, 3, 4], None),
        (1, "abc", b"abc", [0, 1, 2], None),
        (0, "", b"", [], "length"),
        (1, "", b"", [], "length"),
    ]
    assert [e[0] for e in deltas[0].logprobs] == [-0.0, -1.0, -2.0, -3.0, -4.0]
