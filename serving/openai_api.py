# Over 600 lines: the two OpenAI routes' bodies and error bodies, declared together in the OpenAPI schema.
"""The OpenAI-compatible public API: `POST /v1/completions` and `POST /v1/chat/completions` (`add_routes`).

Request bodies and the error bodies (declared in the OpenAPI schema) live here; the generation core
both routes share is `serving/generation.py` (`Generation`: one engine request per (prompt, sample),
text deltas, stop strings, log-probabilities). The routes only format its `Delta`s as
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
  log-probabilities, `text_offset[i]` is where token i's text starts in the choice's text, and
  `top_token_logprobs[i]` (an addition) lists the k most likely as `[token id, log-probability]`,
  likeliest first (ids that share a text stay apart). Chat
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

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from serving.engine import Engine
from serving.generation import (
    SEED_MAX,
    Generation,
    chat_logprobs,
    completion_logprobs,
)
from serving.limits import OffLoopJSONRoute, RequestLimits, client_address, off_loop, until_disconnected
from serving.request import RequestError
from serving.responses import NOT_READY
from serving.state import State

MAX_N = 128
MAX_LOGPROBS = 20


# ====================================================================== error bodies
class OpenAIError(BaseModel):
    message: str
    type: str = Field(..., description="invalid_request_error, model_not_found, rate_limit_exceeded or server_error")
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


def openai_responses(answer: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """What a route of this module answers: `answer` (or its stream), and the errors."""
    return {
        200: {
            "model": answer,
            "description": "the completion; with `stream: true`, server-sent events (`data: {chunk}` lines, the "
            "last `data: [DONE]`)",
            "content": {"text/event-stream": {"schema": SSE_EVENT}},
        },
        400: {
            "model": ErrorBody,
            "description": "the engine cannot run it (context, token ids, chat template), more choices (prompts x "
            "n) or prompt tokens than the server's limits, or text that is not valid Unicode (a lone surrogate)",
        },
        404: {"model": ErrorBody, "description": "`model` names another model than the one served"},
        413: {"model": ErrorBody, "description": "the body is larger than the server's limit (`--max-body-bytes`)"},
        429: {
            "model": ErrorBody,
            "description": "this client (its address) already has as many requests in flight as the server allows "
            "(`--max-client-requests`); `Retry-After` says when to ask again",
        },
        422: {"model": ValidationErrorBody, "description": "malformed body"},
        500: {"model": ErrorBody, "description": "generation failed"},
        **NOT_READY,
    }


# ====================================================================== answers
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """Per generated token: its text, log-probability, the k most likely (text -> log-probability, the
    chosen token's included) and where its text starts in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]
    top_token_logprobs: list[list[tuple[int, float]]] = Field(
        ..., description="per token, the k most likely [token id, log-probability], likeliest first"
    )


class CompletionChoice(BaseModel):
    index: int = Field(..., description="prompt index x n + sample")
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None = Field(..., description="length or stop")
    token_ids: list[int] = Field(..., description="the generated token ids")


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TokenLogprob):
    top_logprobs: list[TokenLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int = Field(..., description="sample index")
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None = Field(..., description="length or stop")


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


def openai_error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": kind, "code": status}, "detail": message}
    )


# ====================================================================== request bodies


def stop_strings(stop: str | list[str] | None) -> list[str] | None:
    """`stop` as a list (the request validator already turns one string into a list of one)."""
    return [stop] if isinstance(stop, str) else stop


class _SamplingRequest(BaseModel):
    # Unknown OpenAI fields are ignored; known ones are strict: JSON true or "5" is no number, 1 is no boolean.
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    temperature: float = Field(0.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: StrictInt = Field(1, ge=1, le=MAX_N, description="independent samples per prompt")
    stream: bool = False
    stop: str | list[str] | None = Field(None, description="up to 4 strings; the text is cut before the first")
    seed: int | None = Field(None, ge=0, le=SEED_MAX, description="sample j of n uses seed + j")
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


def _texts(value: Any) -> list[str]:
    """Every string in a request value (nested lists and objects included)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def _encoding_refusal(*values: Any) -> JSONResponse | None:
    """A 400 for text with a lone surrogate (JSON's "\\ud800" escape): it has no UTF-8 form to tokenize."""
    for text in (t for v in values for t in _texts(v)):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return openai_error(400, f"the request's text is not valid Unicode: {exc.reason} at character {exc.start}")
    return None


def _choices_refusal(prompts: int, n: int, limits: RequestLimits) -> JSONResponse | None:
    if prompts * n > limits.max_choices:
        return openai_error(
            400,
            f"{prompts} prompt(s) x n={n} is {prompts * n} choices; this server runs at most {limits.max_choices} "
            "per request (gpuyantra serve --max-choices)",
        )
    return None


def _prompt_tokens_refusal(prompts: list[list[int]], limits: RequestLimits) -> JSONResponse | None:
    total = sum(len(p) for p in prompts)
    if total > limits.max_prompt_tokens:
        return openai_error(
            400,
            f"the prompts hold {total} tokens; this server takes at most {limits.max_prompt_tokens} per request "
            "(gpuyantra serve --max-prompt-tokens)",
        )
    return None


def _prompt_count(p: str | list[str] | list[int] | list[list[int]]) -> int:
    return 1 if isinstance(p, str) or all(isinstance(x, int) for x in p) else len(p)


async def _tokenized(tok: Any, p: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
    """The prompt(s) as token ids; long text is tokenized on a worker thread."""
    if isinstance(p, str):
        return await off_loop(len(p), lambda: [tok.encode(p)])
    if all(isinstance(x, int) for x in p):
        return [list(p)]  # type: ignore[arg-type]
    if all(isinstance(x, str) for x in p):
        texts: list[str] = list(p)  # type: ignore[arg-type]
        return await off_loop(sum(len(t) for t in texts), lambda: [tok.encode(t) for t in texts])
    return [list(x) for x in p]  # type: ignore[arg-type]


async def _collect_while_connected(
    gen: Generation, request: Request | None
) -> tuple[dict[int, dict[str, Any]], str | None] | None:
    """`_collect(gen)`, or None with every engine request cancelled once the client has gone away."""
    if request is None:
        return await _collect(gen)
    return await until_disconnected(request, _collect(gen), gen.cancel)


def _client_gone() -> JSONResponse:
    # Nobody reads it: the connection is closed. It keeps the handler's answer in the declared shape.
    return openai_error(400, "the client closed the connection before the completion was done")


# ====================================================================== /v1/completions
async def create_completion(
    engine: Engine, body: CompletionRequest, limits: RequestLimits | None = None, request: Request | None = None
):
    limits = limits or RequestLimits()
    refusal = (
        _encoding_refusal(body.model, body.prompt, body.stop)
        or _check_model(engine, body.model)
        or _choices_refusal(_prompt_count(body.prompt), body.n, limits)
    )
    if refusal is not None:
        return refusal
    tok = engine.tokenizer
    prompts = await _tokenized(tok, body.prompt)
    bos = getattr(tok, "bos_token_id", None)
    prompts = [ids if ids else ([bos] if bos is not None else []) for ids in prompts]
    refusal = _prompt_tokens_refusal(prompts, limits)
    if refusal is not None:
        return refusal
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
            client=client_address(request),
        )
    except RequestError as exc:
        return openai_error(400, str(exc))
    gen.start()
    created, cid, model = int(time.time()), f"cmpl-{uuid.uuid4().hex[:24]}", engine.model_name

    def logprobs(ids, entries, offsets):
        return completion_logprobs(tok, ids, entries, offsets) if body.logprobs is not None else None

    if not body.stream:
        collected = await _collect_while_connected(gen, request)
        if collected is None:
            return _client_gone()
        out, error = collected
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
async def create_chat_completion(
    engine: Engine, body: ChatCompletionRequest, limits: RequestLimits | None = None, request: Request | None = None
):
    limits = limits or RequestLimits()
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    refusal = (
        _encoding_refusal(body.model, messages, body.stop)
        or _check_model(engine, body.model)
        or _choices_refusal(1, body.n, limits)
    )
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
    try:
        size = sum(len(t) for t in _texts(messages))
        prompt = await off_loop(size, lambda: tok.apply_chat_template(messages))
    except Exception as exc:  # noqa: BLE001 - the template's own checks (roles must alternate, ...)
        return openai_error(400, f"the chat template refused the messages: {type(exc).__name__}: {exc}")
    refusal = _prompt_tokens_refusal([prompt], limits)
    if refusal is not None:
        return refusal
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
            client=client_address(request),
        )
    except RequestError as exc:
        return openai_error(400, str(exc))
    gen.start()
    created, cid, model = int(time.time()), f"chatcmpl-{uuid.uuid4().hex[:24]}", engine.model_name

    def logprobs(ids, entries):
        return chat_logprobs(tok, ids, entries) if top is not None else None

    if not body.stream:
        collected = await _collect_while_connected(gen, request)
        if collected is None:
            return _client_gone()
        out, error = collected
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
async def completions(body: CompletionRequest, state: State, request: Request):
    return await create_completion(state.require_engine(), body, state.config.request_limits(), request)


async def chat_completions(body: ChatCompletionRequest, state: State, request: Request):
    return await create_chat_completion(state.require_engine(), body, state.config.request_limits(), request)


def add_routes(app: FastAPI) -> None:
    # OffLoopJSONRoute: a large body is parsed as JSON on a worker thread (serving/limits.py); the app's
    # own add_api_route takes no route class, its router's does (the same list of routes).
    routes = (("/v1/completions", completions, Completion), ("/v1/chat/completions", chat_completions, ChatCompletion))
    for path, endpoint, answer in routes:
        app.router.add_api_route(
            path,
            endpoint,
            methods=["POST"],
            responses=openai_responses(answer),
            route_class_override=OffLoopJSONRoute,
        )
