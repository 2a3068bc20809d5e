"""The OpenAI-compatible public API: `POST /v1/completions` and `POST /v1/chat/completions` (`add_routes`).

Request bodies, the error bodies (declared in the OpenAPI schema), and one generation core both
routes share: `Generation` submits one engine request per (prompt, sample), turns the engine's
tokens into text deltas (holding back text that could still grow into a stop string), cuts at the
first stop string, and reports log-probabilities; the routes only format its `Delta`s as
`text_completion` or `chat.completion[.chunk]` objects, streamed (SSE `data: {...}` lines ending with
`data: [DONE]`) or whole.

Semantics worth knowing (as vLLM and OpenAI, unless said otherwise):
- `temperature` defaults to 0 (greedy) on both routes; `n` samples are independent requests (with
  `seed`, sample j uses seed + j); with temperature 0 they are identical.
- `stop`: up to 4 strings; generation stops once the decoded text contains one, the text is cut
  before it, `finish_reason` is "stop". `token_ids` / `logprobs` / `usage` count the generated tokens
  up to and including the one that completed the stop string.
- log-probabilities are log_softmax of the model's float32 logits (before temperature / top_p).
  Completions `logprobs: k` (0..20) gives `{tokens, token_logprobs, top_logprobs, text_offset}`:
  `top_logprobs[i]` maps the k most likely tokens' text (plus the chosen token's) to their
  log-probabilities, `text_offset[i]` is where token i's text starts in the choice's text. Chat
  `logprobs: true` (+ `top_logprobs: k`, 0..20) gives `logprobs.content[]` items `{token, logprob,
  bytes, top_logprobs}`.
- chat prompts are the tokenizer's chat template (`apply_chat_template(messages,
  add_generation_prompt=True)`); a tokenizer without one (the presets' byte-level tokenizer) answers
  400, as vLLM does: there is no default template to guess. Text content parts are joined with "\\n";
  other content parts are refused. `max_tokens` / `max_completion_tokens` default to the rest of the
  context.
- each completions choice also carries the generated `token_ids`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from serving.engine import Engine
from serving.request import GenRequest, RequestError
from serving.state import State

MAX_N = 128
MAX_LOGPROBS = 20
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes


# ====================================================================== error bodies
class OpenAIError(BaseModel):
    message: str
    type: str = Field(..., description="invalid_request_error, model_not_found or server_error")
    code: int


class ErrorBody(BaseModel):
    """A request the server cannot run as asked: OpenAI's error object, plus `detail` (the message)."""

    error: OpenAIError
    detail: str


class ValidationIssue(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorBody(BaseModel):
    """A malformed body (422): FastAPI's list of issues and one readable line."""

    detail: list[ValidationIssue]
    message: str = Field(..., description="the issues as one line: 'field: problem; ...'")


# One server-sent event of a stream (schemathesis and OpenAPI 3.2 read a text/event-stream schema per event).
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON chunk; the last event is [DONE]"}},
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the completion; with `stream: true`, server-sent events (`data: {chunk}` lines, the "
        "last `data: [DONE]`)",
        "content": {"text/event-stream": {"schema": SSE_EVENT}},
    },
    400: {"model": ErrorBody, "description": "the engine cannot run it (context, token ids, chat template)"},
    404: {"model": ErrorBody, "description": "`model` names another model than the one served"},
    422: {"model": ValidationErrorBody, "description": "malformed body"},
    500: {"model": ErrorBody, "description": "generation failed"},
}


def openai_error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "code": status}, "detail": message}
    )


# ====================================================================== request bodies


def stop_strings(stop: str | list[str] | None) -> list[str] | None:
    """`stop` as a list (the request validator already turns one string into a list of one)."""
    return [stop] if isinstance(stop, str) else stop


class _SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float = Field(0.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: StrictInt = Field(1, ge=1, le=MAX_N, description="independent samples per prompt")
    stream: bool = False
    stop: str | list[str] | None = Field(None, description="up to 4 strings; the text is cut before the first")
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX, description="sample j of n uses seed + j")
    stream_options: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if isinstance(v, str):
            v = [v]
        if v is not None and (len(v) > 4 or any(not s for s in v)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return v


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: int = Field(16, ge=1, le=1_000_000)
    echo: bool = False
    logprobs: StrictInt | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="log-probabilities of each token and of the k most likely"
    )

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be an empty list")
        if isinstance(v, list) and any(isinstance(p, list) and not p for p in v):
            raise ValueError("token-id prompts must not be empty")
        return v

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, v):
        if v:
            raise ValueError("echo is not supported")
        return v


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, tool_call_id, ... go to the template

    role: str = Field(..., min_length=1)
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v):
        if isinstance(v, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str) for p in v):
                raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
            v = "\n".join(p["text"] for p in v)
        return v


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000, description="default: the rest of the context")
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000, description="same as max_tokens")
    logprobs: bool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _top_needs_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self


# ====================================================================== text helpers
class IncrementalText:
    """Text deltas of a growing token list; holds back a trailing incomplete UTF-8 sequence."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids).rstrip("\ufffd")
        if text.startswith(self.emitted) and len(text) > len(self.emitted):
            delta = text[len(self.emitted) :]
            self.emitted = text
            return delta
        return ""


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
    ):
        self.engine = engine
        self.tok = engine.tokenizer
        self.prompts = prompts
        self.stops = stops
        self.logprobs = logprobs
        self.loop = asyncio.get_running_loop()
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
                    stop_token_ids=frozenset(self.tok.eos_token_ids),
                    on_token=partial(self._post, index, "token"),
                    on_finish=partial(self._post, index, "finish"),
                )
                engine.validate(req)  # RequestError: 400, before anything runs
                self.choices.append(_Choice(req, IncrementalText(self.tok)))

    def _post(self, index: int, kind: str, value: Any) -> None:  # engine thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, kind, value))

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

    def _delta(self, index: int, c: _Choice, text: str, **extra: Any) -> Delta:
        lo, hi = c.reported, c.count
        c.reported = hi
        return Delta(
            index,
            text,
            c.req.output_ids[lo:hi],
            c.req.output_logprobs[lo:hi] if self.logprobs is not None else None,
            c.offsets[lo:hi],
            **extra,
        )

    async def deltas(self) -> AsyncIterator[Delta]:
        """Deltas until every choice finished; cancels what is left when the consumer goes away."""
        stops = self.stops
        done = 0
        try:
            while done < len(self.choices):
                index, kind, value = await self.queue.get()
                c = self.choices[index]
                if c.finished or (kind == "token" and c.stopped):
                    continue
                if kind == "token":
                    c.offsets.append(len(c.decoder.emitted))
                    c.decoder.push(value)
                    c.count += 1
                    text, hit = truncate_at_stop(c.decoder.emitted, stops)
                    if hit:
                        c.stopped = True
                        c.req.cancel()
                        safe = len(text)
                    else:
                        safe = len(text) - stop_overlap(text, stops)
                    if safe > len(c.sent):
                        delta = text[len(c.sent) : safe]
                        c.sent += delta
                        yield self._delta(index, c, delta)
                    continue
                c.finished = True
                done += 1
                req: GenRequest = value
                if req.finish_reason == "error":
                    yield self._delta(index, c, "", error=f"generation failed: {req.error}")
                    continue
                full, hit = truncate_at_stop(self.tok.decode(req.output_ids[: c.count]), stops)
                tail = full[len(c.sent) :] if full.startswith(c.sent) else ""
                c.sent += tail
                reason = "stop" if (c.stopped or hit or req.finish_reason != "length") else "length"
                yield self._delta(index, c, tail, finish_reason=reason)
        finally:
            self.cancel()


def _sample_seed(seed: int | None, sample: int) -> int | None:
    """Seed of sample `sample` of a request seeded `seed`: seed + sample, wrapped into torch's range."""
    if seed is None:
        return None
    s = seed + sample
    return s - 2**64 if s > SEED_MAX else s


def _check_model(engine: Engine, model: str | None) -> JSONResponse | None:
    if model not in (None, "", engine.model_name):
        return openai_error(
            404, f"model {model!r} is not served here (serving {engine.model_name!r})", "model_not_found"
        )
    return None


def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _streaming(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


async def _collect(gen: Generation) -> tuple[dict[int, dict[str, Any]], str | None]:
    """Run a generation to its end: per choice index its text, token ids, log-probabilities,
    offsets and finish reason; and the first error."""
    out: dict[int, dict[str, Any]] = {
        i: {"text": "", "token_ids": [], "logprobs": [], "offsets": [], "finish_reason": None}
        for i in range(len(gen.choices))
    }
    error = None
    async for d in gen.deltas():
        acc = out[d.index]
        acc["text"] += d.text
        acc["token_ids"] += d.token_ids
        acc["logprobs"] += d.logprobs or []
        acc["offsets"] += d.offsets
        acc["finish_reason"] = d.finish_reason or acc["finish_reason"]
        error = error or d.error
    return out, error


def _usage_wanted(body: _SamplingRequest) -> bool:
    return bool((body.stream_options or {}).get("include_usage"))


# ====================================================================== /v1/completions
async def create_completion(engine: Engine, body: CompletionRequest):
    refusal = _check_model(engine, body.model)
    if refusal is not None:
        return refusal
    tok = engine.tokenizer
    p = body.prompt
    if isinstance(p, str):
        prompts = [tok.encode(p)]
    elif all(isinstance(x, int) for x in p):
        prompts = [list(p)]
    elif all(isinstance(x, str) for x in p):
        prompts = [tok.encode(x) for x in p]
    else:
        prompts = [list(x) for x in p]  # type: ignore[arg-type]
    bos = getattr(tok, "bos_token_id", None)
    prompts = [ids if ids else ([bos] if bos is not None else []) for ids in prompts]
    try:
        gen = Generation(
            engine,
            prompts,
            n=body.n,
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stops=stop_strings(body.stop),
            logprobs=body.logprobs,
        )
    except RequestError as exc:
        return openai_error(400, str(exc))
    gen.start()
    created, cid, model = int(time.time()), f"cmpl-{uuid.uuid4().hex[:24]}", engine.model_name

    def logprobs(ids, entries, offsets):
        return completion_logprobs(tok, ids, entries, offsets) if body.logprobs is not None else None

    if not body.stream:
        out, error = await _collect(gen)
        if error:
            return openai_error(500, error, "server_error")
        choices = [
            {
                "index": i,
                "text": c["text"],
                "logprobs": logprobs(c["token_ids"], c["logprobs"], c["offsets"]),
                "finish_reason": c["finish_reason"],
                "token_ids": c["token_ids"],
            }
            for i, c in out.items()
        ]
        return {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "usage": gen.usage(),
        }

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return _sse(
            {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": choices, **extra}
        )

    async def events() -> AsyncIterator[str]:
        async for d in gen.deltas():
            if d.error:
                yield _sse({"error": {"message": d.error, "type": "server_error"}})
                continue
            yield chunk(
                [
                    {
                        "index": d.index,
                        "text": d.text,
                        "finish_reason": d.finish_reason,
                        "logprobs": logprobs(d.token_ids, d.logprobs, d.offsets),
                        "token_ids": d.token_ids,
                    }
                ]
            )
        if _usage_wanted(body):
            yield chunk([], usage=gen.usage())
        yield "data: [DONE]\n\n"

    return _streaming(events())


# ====================================================================== /v1/chat/completions
async def create_chat_completion(engine: Engine, body: ChatCompletionRequest):
    refusal = _check_model(engine, body.model)
    if refusal is not None:
        return refusal
    tok = engine.tokenizer
    if not getattr(tok, "chat_template", None):
        kind = "the byte-level tokenizer" if getattr(tok, "is_byte_level", False) else "its tokenizer"
        return openai_error(
            400,
            f"model {engine.model_name!r} has no chat template ({kind} defines none): use "
            "/v1/completions, or serve a model whose tokenizer_config.json / "
            "chat_template.jinja defines one",
        )
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    try:
        prompt = tok.apply_chat_template(messages)
    except Exception as exc:  # noqa: BLE001 - the template's own checks (roles must alternate, ...)
        return openai_error(400, f"the chat template refused the messages: {type(exc).__name__}: {exc}")
    top = (body.top_logprobs or 0) if body.logprobs else None
    try:
        gen = Generation(
            engine,
            [prompt],
            n=body.n,
            max_tokens=body.max_completion_tokens or body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stops=stop_strings(body.stop),
            logprobs=top,
        )
    except RequestError as exc:
        return openai_error(400, str(exc))
    gen.start()
    created, cid, model = int(time.time()), f"chatcmpl-{uuid.uuid4().hex[:24]}", engine.model_name

    def logprobs(ids, entries):
        return chat_logprobs(tok, ids, entries) if top is not None else None

    if not body.stream:
        out, error = await _collect(gen)
        if error:
            return openai_error(500, error, "server_error")
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": c["text"]},
                "logprobs": logprobs(c["token_ids"], c["logprobs"]),
                "finish_reason": c["finish_reason"],
            }
            for i, c in out.items()
        ]
        return {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": choices,
            "usage": gen.usage(),
        }

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return _sse(
            {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": choices,
                **extra,
            }
        )

    async def events() -> AsyncIterator[str]:
        for i in range(len(gen.choices)):
            yield chunk(
                [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
            )
        async for d in gen.deltas():
            if d.error:
                yield _sse({"error": {"message": d.error, "type": "server_error"}})
                continue
            yield chunk(
                [
                    {
                        "index": d.index,
                        "delta": {"content": d.text} if d.text else {},
                        "logprobs": logprobs(d.token_ids, d.logprobs),
                        "finish_reason": d.finish_reason,
                    }
                ]
            )
        if _usage_wanted(body):
            yield chunk([], usage=gen.usage())
        yield "data: [DONE]\n\n"

    return _streaming(events())


# ====================================================================== the routes
async def completions(body: CompletionRequest, state: State):
    return await create_completion(state.require_engine(), body)


async def chat_completions(body: ChatCompletionRequest, state: State):
    return await create_chat_completion(state.require_engine(), body)


def add_routes(app: FastAPI) -> None:
    app.add_api_route("/v1/completions", completions, methods=["POST"], responses=ERROR_RESPONSES)
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"], responses=ERROR_RESPONSES)
