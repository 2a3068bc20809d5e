"""The generation core both OpenAI routes share (`serving/openai_api.py` formats its output).

`Generation` submits one engine request per (prompt, sample), turns the engine's tokens into text
deltas (`IncrementalText` holds back a trailing incomplete UTF-8 sequence, `stop_overlap` text that
could still grow into a stop string), cuts at the first stop string (`truncate_at_stop`) and reports
log-probabilities in the completions or the chat shape. Kept apart from the routes so that the
request/response formats and the token-to-text logic can each be read on their own.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from serving.engine import Engine
from serving.request import GenRequest

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes


# ====================================================================== text helpers
class IncrementalText:
    """Text deltas of a growing token list; holds back a trailing incomplete UTF-8 sequence.

    Each push decodes a window of the latest tokens, not the whole list (a 4,000-token completion
    decoded whole at every token costs the event loop O(n^2)). The window starts a few tokens back
    (CONTEXT_TOKENS: what a tokenizer needs to space and merge the next piece) and slides forward
    once it holds WINDOW_TOKENS and its text ends on a whole character; what was emitted of it is
    counted in characters of the window's own decoding, so a tokenizer that decodes a piece
    differently at the start of a text (a leading space dropped) changes no delta.
    """

    CONTEXT_TOKENS = 4
    WINDOW_TOKENS = 16

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""
        self._start = 0  # the window: ids[_start:]
        self._window_sent = 0  # characters of the window's decoding already emitted

    def push(self, token: int) -> str:
        self.ids.append(token)
        raw = self.tokenizer.decode(self.ids[self._start :])
        text = raw.rstrip("\ufffd")
        delta = text[self._window_sent :] if len(text) > self._window_sent else ""
        self.emitted += delta
        self._window_sent += len(delta)
        if len(self.ids) - self._start >= self.WINDOW_TOKENS and raw == text:
            self._start = len(self.ids) - self.CONTEXT_TOKENS
            self._window_sent = len(self.tokenizer.decode(self.ids[self._start :]))
        return delta


def stop_overlap(text: str, stops: list[str] | None) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    best = 0
    for stop in stops or ():
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                best = max(best, k)
                break
    return best


def truncate_at_stop(text: str, stops: list[str] | None) -> tuple[str, bool]:
    """`text` cut before the earliest stop string it contains, and whether it contained one."""
    if not stops:
        return text, False
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


LogprobEntry = tuple[float, list[tuple[int, float]]]  # the engine's: (chosen, [(id, logprob), ...])


def completion_logprobs(tok, ids: list[int], entries: list[LogprobEntry], offsets: list[int]) -> dict[str, Any]:
    """The legacy completions `logprobs` object of these tokens."""
    top: list[dict[str, float]] = []
    for token, (chosen, alternatives) in zip(ids, entries):
        best: dict[str, float] = {}
        for alt, lp in [*alternatives, (token, chosen)]:
            best.setdefault(tok.token_text(alt), lp)  # two ids with one text: the likelier one's
        top.append(best)
    return {
        "tokens": [tok.token_text(i) for i in ids],
        "token_logprobs": [e[0] for e in entries],
        "top_logprobs": top,
        "text_offset": list(offsets),
        # Beyond OpenAI's object: by token id, so two tokens sharing a text stay apart.
        "top_token_logprobs": [[[a, lp] for a, lp in alternatives] for _, alternatives in entries],
    }


def chat_logprobs(tok, ids: list[int], entries: list[LogprobEntry]) -> dict[str, Any]:
    """The chat `logprobs` object (`{"content": [...]}`) of these tokens."""

    def item(token: int, lp: float) -> dict[str, Any]:
        return {"token": tok.token_text(token), "logprob": lp, "bytes": list(tok.token_bytes(token))}

    return {
        "content": [
            {**item(token, chosen), "top_logprobs": [item(a, lp) for a, lp in alternatives]}
            for token, (chosen, alternatives) in zip(ids, entries)
        ]
    }


# ====================================================================== engine thread -> event loop
class _Mailbox:
    """What the engine thread hands one event loop's generations: one wake-up of the loop per burst.
    A decode step hands each of its rows a token; posted one by one, eight streams woke the loop
    (a write to its self-pipe each) eight times a step, 600 steps a second."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._items: list[tuple[asyncio.Queue, Any]] = []
        self._lock = threading.Lock()

    def post(self, queue: asyncio.Queue, item: Any) -> None:  # engine thread
        with self._lock:
            self._items.append((queue, item))
            if len(self._items) > 1:
                return  # the wake-up of the first item still to be delivered takes this one too
        self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:  # event loop
        with self._lock:
            items, self._items = self._items, []
        for queue, item in items:
            queue.put_nowait(item)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = weakref.WeakKeyDictionary()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    box = _mailboxes.get(loop)
    if box is None:
        box = _mailboxes[loop] = _Mailbox(loop)
    return box


# ====================================================================== the generation core
@dataclass
class Delta:
    """New output of one choice: text, its tokens (with log-probabilities when asked) and, on its
    last delta, the finish reason (or the error)."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[LogprobEntry] | None
    offsets: list[int]
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class _Choice:
    req: GenRequest
    decoder: IncrementalText
    sent: str = ""
    count: int = 0  # tokens kept: up to the one that completed a stop string
    reported: int = 0  # tokens already in a Delta
    offsets: list[int] = field(default_factory=list)
    stopped: bool = False
    finished: bool = False


class Generation:
    """`n` samples of each prompt on the engine; choice index = prompt index * n + sample."""

    def __init__(
        self,
        engine: Engine,
        prompts: list[list[int]],
        *,
        n: int,
        max_tokens: int | None,
        temperature: float,
        top_p: float,
        seed: int | None,
        stops: list[str] | None,
        logprobs: int | None,
        client: str | None = None,
    ):
        self.engine = engine
        self.tok = engine.tokenizer
        self.prompts = prompts
        self.stops = stops
        self.logprobs = logprobs
        self.loop = asyncio.get_running_loop()
        self.mailbox = _mailbox(self.loop)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices: list[_Choice] = []
        for ids in prompts:
            for j in range(n):
                index = len(self.choices)
                budget = max_tokens if max_tokens is not None else max(1, engine.usable_len - len(ids) + 1)
                req = GenRequest(
                    prompt_ids=ids,
                    max_tokens=budget,
                    temperature=temperature,
                    top_p=top_p,
                    seed=_sample_seed(seed, j),
                    logprobs=logprobs,
                    client=client,
                    stop_token_ids=frozenset(self.tok.eos_token_ids),
                    on_token=partial(self._post, index, "token"),
                    on_finish=partial(self._post, index, "finish"),
                )
                engine.validate(req)  # RequestError: 400, before anything runs
                self.choices.append(_Choice(req, IncrementalText(self.tok)))

    def _post(self, index: int, kind: str, value: Any) -> None:  # engine thread
        self.mailbox.post(self.queue, (index, kind, value))

    def start(self) -> None:
        for c in self.choices:
            self.engine.submit(c.req)

    def cancel(self) -> None:
        for c in self.choices:
            if not c.req.done.is_set():
                c.req.cancel()

    def usage(self) -> dict[str, int]:
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(c.count for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _delta(self, index: int, c: _Choice, text: str, upto: int | None = None, **extra: Any) -> Delta:
        """The delta of `text` with the tokens not yet reported, up to token `upto` (default all)."""
        lo, hi = c.reported, c.count if upto is None else upto
        c.reported = hi
        return Delta(
            index,
            text,
            c.req.output_ids[lo:hi],
            c.req.output_logprobs[lo:hi] if self.logprobs is not None else None,
            c.offsets[lo:hi],
            **extra,
        )

    def _take_token(self, c: _Choice, token: int) -> str:
        """Add one token to its choice; the text it makes safe to send (held back: a trailing
        incomplete character, or what could still grow into a stop string)."""
        stops = self.stops
        c.offsets.append(len(c.decoder.emitted))
        c.decoder.push(token)
        c.count += 1
        text, hit = truncate_at_stop(c.decoder.emitted, stops)
        if hit:
            c.stopped = True
            c.req.cancel()
            safe = len(text)
        else:
            safe = len(text) - stop_overlap(text, stops)
        if safe <= len(c.sent):
            return ""
        delta = text[len(c.sent) : safe]
        c.sent += delta
        return delta

    def _last_delta(self, index: int, c: _Choice, req: GenRequest, held: str) -> Delta:
        """A finished choice's last delta: `held` (its text not yet sent), the rest of its text and
        its finish reason, or its error."""
        if req.finish_reason == "error":
            return self._delta(index, c, held, error=f"generation failed: {req.error}")
        full, hit = truncate_at_stop(self.tok.decode(req.output_ids[: c.count]), self.stops)
        tail = full[len(c.sent) :] if full.startswith(c.sent) else ""
        c.sent += tail
        reason = "stop" if (c.stopped or hit or req.finish_reason != "length") else "length"
        return self._delta(index, c, held + tail, finish_reason=reason)

    async def _drain(self) -> list[tuple[int, str, Any]]:
        """The next item from the engine and every other one already queued behind it."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        return items

    async def deltas(self) -> AsyncIterator[Delta]:
        """Deltas until every choice finished; cancels what is left when the consumer goes away.

        What queued up while the consumer was busy goes out as one delta per choice: when the
        event loop falls behind the engine (eight streams at hundreds of tokens a second each), it
        sends fewer, larger events instead of falling further behind."""
        done = 0
        try:
            while done < len(self.choices):
                held: dict[int, tuple[str, int]] = {}  # choice -> (text to send, tokens it covers)
                for index, kind, value in await self._drain():
                    c = self.choices[index]
                    if c.finished or (kind == "token" and c.stopped):
                        continue
                    if kind == "token":
                        text = self._take_token(c, value)
                        if text:
                            held[index] = (held.get(index, ("", 0))[0] + text, c.count)
                        continue
                    c.finished = True
                    done += 1
                    yield self._last_delta(index, c, value, held.pop(index, ("", 0))[0])
                for index, (text, upto) in held.items():
                    yield self._delta(index, self.choices[index], text, upto)
        finally:
            self.cancel()


def _sample_seed(seed: int | None, sample: int) -> int | None:
    """Seed of sample `sample` of a request seeded `seed`: seed + sample, wrapped into torch's range."""
    if seed is None:
        return None
    s = seed + sample
    return s - 2**64 if s > SEED_MAX else s
