"""LLM backends for the LLM author: one structured-output chat call each, nothing more.

A backend sends a system prompt and a user prompt, asks for a reply that follows a JSON schema
(given as a pydantic model), and returns the reply's text. Retries, parsing and fallback belong to
the author (`gpuyantra.authors.llm`); a backend only says whether a failure is worth retrying.

- `OpenAICompatibleBackend`: `POST {base_url}/chat/completions` with `response_format`
  `{"type": "json_schema", ...}` (OpenAI, vLLM, llama.cpp's server, and other compatible servers).
- `GeminiBackend`: the google-genai SDK's `models.generate_content` with `response_schema`.

API keys live only in request headers; they never appear in `repr`, logs or error messages.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Protocol

import httpx
from pydantic import BaseModel

log = logging.getLogger(__name__)

SEED = 42
TEMPERATURE = 0.0
# Status codes worth another try: timeouts, rate limits, server-side failures.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_BODY_EXCERPT = 300


class BackendError(Exception):
    """A call that produced no usable reply text. `retryable`: the same call may succeed later."""

    def __init__(
        self, message: str, *, retryable: bool, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after


class Backend(Protocol):
    name: str  # "openai" | "gemini"

    @property
    def model(self) -> str | None: ...

    def complete(self, system: str, user: str, reply_model: type[BaseModel], timeout: float) -> str:
        """The reply's text, which should be JSON following `reply_model`; raises BackendError."""
        ...

    def redact(self, text: str) -> str:
        """`text` with any secret the backend holds replaced by `***`."""
        ...


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema with `$ref`s inlined, every object closed and every property required.

    The form OpenAI's strict structured outputs require, and the one local servers' grammar
    compilers (vLLM, llama.cpp) handle most reliably.
    """
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                name = node["$ref"].rsplit("/", 1)[-1]
                return resolve(copy.deepcopy(defs[name]))
            out: dict[str, Any] = {}
            for key, value in node.items():
                if key == "properties" and isinstance(value, dict):  # property names are data
                    out[key] = {name: resolve(prop) for name, prop in value.items()}
                elif key != "title":
                    out[key] = resolve(value)
            if out.get("type") == "object":
                out["additionalProperties"] = False
                out["required"] = list(out.get("properties", {}))
            return out
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)


def _redact(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


class OpenAICompatibleBackend:
    """Chat completions with JSON-schema structured output.

    `base_url` is the API root including its version, as the OpenAI SDK takes it:
    `https://api.openai.com/v1`, `http://127.0.0.1:8000/v1` (vLLM), `http://127.0.0.1:8080/v1`
    (llama.cpp). Without a `model`, the first model `GET {base_url}/models` lists is used (a local
    server usually serves exactly one).
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        *,
        max_tokens: int | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        if not base_url:
            raise ValueError("OpenAICompatibleBackend needs a base_url")
        self.base_url = base_url.rstrip("/")
        self.model = model or None
        self._api_key = api_key or None
        self.max_tokens = max_tokens
        self.connect_timeout = connect_timeout

    def __repr__(self) -> str:
        return f"OpenAICompatibleBackend(base_url={self.base_url!r}, model={self.model!r})"

    def redact(self, text: str) -> str:
        return _redact(text, self._api_key)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _timeout(self, timeout: float) -> httpx.Timeout:
        return httpx.Timeout(timeout, connect=min(self.connect_timeout, timeout))

    def _send(self, method: str, path: str, timeout: float, body: dict[str, Any] | None = None) -> Any:
        url = f"{self.base_url}{path}"
        try:
            with httpx.Client(timeout=self._timeout(timeout), follow_redirects=True) as client:
                response = client.request(method, url, headers=self._headers(), json=body)
        except httpx.TimeoutException as exc:
            raise BackendError(
                f"{method} {url} timed out after {timeout:.0f} s ({type(exc).__name__})", retryable=True
            ) from None
        except httpx.HTTPError as exc:
            raise BackendError(
                f"{method} {url} failed: {type(exc).__name__}: {_redact(str(exc), self._api_key)}", retryable=True
            ) from None
        if response.status_code >= 400:
            excerpt = _redact(response.text[:_BODY_EXCERPT], self._api_key)
            raise BackendError(
                f"{method} {url} answered HTTP {response.status_code}: {excerpt}",
                retryable=response.status_code in RETRYABLE_STATUS,
                status=response.status_code,
                retry_after=_retry_after(response.headers),
            )
        try:
            return response.json()
        except ValueError:
            raise BackendError(
                f"{method} {url} answered non-JSON: {response.text[:_BODY_EXCERPT]!r}",
                retryable=False,
                status=response.status_code,
            ) from None

    def resolve_model(self, timeout: float) -> str:
        if self.model is None:
            data = self._send("GET", "/models", timeout)
            try:
                self.model = str(data["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                raise BackendError(
                    f"GET {self.base_url}/models listed no model; set GPUYANTRA_LLM_MODEL", retryable=False
                ) from None
            log.info("openai backend: using model %s listed by %s/models", self.model, self.base_url)
        return self.model

    def request_body(self, system: str, user: str, reply_model: type[BaseModel], model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "temperature": TEMPERATURE,
            "seed": SEED,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": reply_model.__name__,
                    "strict": True,
                    "schema": strict_json_schema(reply_model),
                },
            },
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def complete(self, system: str, user: str, reply_model: type[BaseModel], timeout: float) -> str:
        model = self.resolve_model(timeout)
        log.info("openai backend: POST %s/chat/completions model=%s", self.base_url, model)
        data = self._send("POST", "/chat/completions", timeout, self.request_body(system, user, reply_model, model))
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise BackendError(
                f"chat completion has no choices[0].message: {str(data)[:_BODY_EXCERPT]}", retryable=False
            ) from None
        content = message.get("content") if isinstance(message, dict) else None
        if choice.get("finish_reason") == "length":
            raise BackendError("the reply was cut off at the token limit (finish_reason=length)", retryable=False)
        if not isinstance(content, str) or not content.strip():
            refusal = message.get("refusal") if isinstance(message, dict) else None
            raise BackendError(
                f"the reply has no content{f' (refusal: {refusal})' if refusal else ''}", retryable=False
            )
        return content


class GeminiBackend:
    """Gemini through the google-genai SDK, with a response schema and JSON mime type.

    `base_url` points the SDK at another endpoint (a proxy or a test server); `api_version` is the
    REST version in the path (`/v1beta/models/{model}:generateContent`).
    """

    name = "gemini"

    def __init__(
        self,
        model: str = "gemini-2.5-flash",
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        api_version: str = "v1beta",
    ) -> None:
        if not api_key:
            raise ValueError("GeminiBackend needs an api_key")
        from google import genai
        from google.genai import types

        self.model = model
        self.base_url = base_url or None
        self._types = types
        # Retries are the author's (bounded, with a deadline): one attempt per SDK call.
        self._client = genai.Client(
            api_key=api_key,
            http_options=types.HttpOptions(
                base_url=self.base_url,
                api_version=api_version,
                retry_options=types.HttpRetryOptions(attempts=1),
            ),
        )
        self._api_key = api_key

    def __repr__(self) -> str:
        return f"GeminiBackend(model={self.model!r}, base_url={self.base_url!r})"

    def redact(self, text: str) -> str:
        return _redact(text, self._api_key)

    def complete(self, system: str, user: str, reply_model: type[BaseModel], timeout: float) -> str:
        from google.genai import errors

        types = self._types
        config = types.GenerateContentConfig(
            system_instruction=system,
            temperature=TEMPERATURE,
            seed=SEED,
            response_mime_type="application/json",
            response_schema=reply_model,
            http_options=types.HttpOptions(
                timeout=max(1, int(timeout * 1000)), retry_options=types.HttpRetryOptions(attempts=1)
            ),
        )
        log.info("gemini backend: generate_content model=%s", self.model)
        try:
            response = self._client.models.generate_content(model=self.model, contents=user, config=config)
        except errors.APIError as exc:
            message = _redact(f"{exc.code} {exc.status or ''} {exc.message or ''}".strip(), self._api_key)
            raise BackendError(
                f"Gemini answered HTTP {message}"[: _BODY_EXCERPT + 60],
                retryable=exc.code in RETRYABLE_STATUS,
                status=exc.code,
            ) from None
        except httpx.TimeoutException as exc:
            raise BackendError(
                f"Gemini timed out after {timeout:.0f} s ({type(exc).__name__})", retryable=True
            ) from None
        except httpx.HTTPError as exc:
            raise BackendError(
                f"Gemini request failed: {type(exc).__name__}: {_redact(str(exc), self._api_key)}", retryable=True
            ) from None
        text = response.text
        if not text or not text.strip():
            finish = None
            if response.candidates:
                finish = response.candidates[0].finish_reason
            feedback = response.prompt_feedback
            raise BackendError(
                f"Gemini returned no text (finish reason {finish}, prompt feedback {feedback})", retryable=False
            )
        candidate = response.candidates[0] if response.candidates else None
        if candidate is not None and str(candidate.finish_reason or "").endswith("MAX_TOKENS"):
            raise BackendError("the reply was cut off at the token limit (finish reason MAX_TOKENS)", retryable=False)
        return text
