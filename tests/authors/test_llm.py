"""The LLM author against a real local HTTP server speaking the OpenAI and Gemini APIs."""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
import torch

from gpuyantra.authors import Attempt, WriteRequest, get_author
from gpuyantra.authors.backends import GeminiBackend, OpenAICompatibleBackend, strict_json_schema
from gpuyantra.authors.llm import CandidateReply, LLMAuthor, UnusableReply, build_prompt, parse_reply, reference_source
from gpuyantra.authors.template import TemplateAuthor
from gpuyantra.candidate import load_candidate
from gpuyantra.ops import get_op
from tests.authors.fake_llm_server import FakeLLM, Reply, reply_json

ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]
FAILURE_MESSAGE = "entry calls torch.rsqrt on the path from entry (attempt-1 marker)"
OPENAI_KEY = "sk-test-secret-123"
GEMINI_KEY = "gm-test-secret-456"
RMS_NORM_SOURCE = resources.files("gpuyantra.kernels").joinpath("rms_norm.py").read_text()
LLM_ENV = (
    "GPUYANTRA_AUTHOR",
    "GPUYANTRA_LLM_BASE_URL",
    "GPUYANTRA_LLM_MODEL",
    "GPUYANTRA_LLM_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GPUYANTRA_LLM_TIMEOUT",
    "GPUYANTRA_LLM_MAX_ATTEMPTS",
)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLM]:
    fake = FakeLLM().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in LLM_ENV:
        monkeypatch.delenv(key, raising=False)


def make_request(**overrides: Any) -> WriteRequest:
    fields: dict[str, Any] = dict(
        op="rms_norm",
        module_class="Qwen2RMSNorm",
        adapter=[dict(b) for b in ADAPTER],
        shapes=[[1, 896], [7, 896]],
        dtype="bfloat16",
        hardware="nvidia-h200",
        history=[
            Attempt(
                strategy={"name": "torch-fallback", "notes": ""},
                reward=-1,
                failures=[{"layer": "static", "rule": "torch-compute-call", "message": FAILURE_MESSAGE}],
            ),
            Attempt(strategy={"name": "one-row", "notes": ""}, reward=1, kernel_us=9.5, floor_us=2.5),
        ],
        iteration=2,
    )
    fields.update(overrides)
    return WriteRequest(**fields)


def openai_author(server: FakeLLM, **options: Any) -> LLMAuthor:
    options.setdefault("backoff_s", 0.0)
    return LLMAuthor(OpenAICompatibleBackend(f"{server.url}/v1", "fake-coder", OPENAI_KEY), **options)


def gemini_author(server: FakeLLM, **options: Any) -> LLMAuthor:
    options.setdefault("backoff_s", 0.0)
    return LLMAuthor(GeminiBackend("gemini-2.5-flash", GEMINI_KEY, server.url), **options)


def good_reply() -> Reply:
    return Reply(text=reply_json(RMS_NORM_SOURCE, ADAPTER, name="one-row-fused"))


def objects_have_named_properties(schema: Any) -> bool:
    """No free-form dicts: every object schema names its properties and allows nothing else."""
    if isinstance(schema, dict):
        kind = str(schema.get("type", "")).lower()
        if kind == "object":
            if not schema.get("properties") or schema.get("additionalProperties") not in (None, False):
                return False
        return all(objects_have_named_properties(v) for v in schema.values())
    if isinstance(schema, list):
        return all(objects_have_named_properties(v) for v in schema)
    return True


def assert_prompt_carries_request(prompt: str) -> None:
    family = get_op("rms_norm")
    assert inspect.getsource(family.reference).strip() in prompt
    assert json.dumps(ADAPTER) in prompt
    assert FAILURE_MESSAGE in prompt
    assert "torch-compute-call" in prompt
    assert "9.50 us" in prompt and "2.50 us" in prompt  # kernel_us vs floor_us
    assert "def entry(x, *, weight, eps)" in prompt
    assert "[7, 896]" in prompt and "bfloat16" in prompt and "nvidia-h200" in prompt
    assert "try/except" in prompt and "module-level caches" in prompt.lower()


# --- OpenAI-compatible ---------------------------------------------------------------------------


def test_openai_author_returns_the_model_source(server: FakeLLM, tmp_path) -> None:
    server.script(good_reply())
    request = make_request()
    written = openai_author(server).write(request)

    assert written.source == RMS_NORM_SOURCE
    assert written.author == "llm:openai:fake-coder"
    assert written.strategy == {"name": "one-row-fused", "notes": "returned by the fake server"}
    assert "fallback" not in written.notes

    [received] = server.requests
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    body = received.body
    assert body["model"] == "fake-coder"
    assert body["temperature"] == 0
    assert body["seed"] == 42
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert_prompt_carries_request(body["messages"][1]["content"])
    response_format = body["response_format"]
    assert response_format["type"] == "json_schema"
    schema = response_format["json_schema"]["schema"]
    assert response_format["json_schema"]["strict"] is True
    assert set(schema["properties"]) == {"source", "adapter", "strategy"}
    binding = schema["properties"]["adapter"]["items"]
    assert schema["properties"]["adapter"]["type"] == "array"
    assert set(binding["properties"]) == {"kernel_param", "module_attr"}
    assert set(schema["properties"]["strategy"]["properties"]) == {"name", "notes"}
    assert objects_have_named_properties(schema)

    path = tmp_path / "rms_norm_llm.py"
    path.write_text(written.source)
    candidate = load_candidate(path)
    assert candidate.op == "rms_norm"
    assert candidate.adapter == ADAPTER
    assert callable(candidate.entry)


def test_openai_model_is_discovered_when_not_configured(server: FakeLLM) -> None:
    server.script(good_reply())
    author = LLMAuthor(OpenAICompatibleBackend(f"{server.url}/v1/"), backoff_s=0.0)
    written = author.write(make_request())
    assert written.source == RMS_NORM_SOURCE
    assert written.author == "llm:openai:fake-coder"
    assert [r.api for r in server.requests] == ["models", "openai"]
    assert "authorization" not in server.requests[1].headers  # no key configured: no header
    assert server.requests[1].body["model"] == "fake-coder"


def test_openai_retries_a_server_error_then_uses_the_reply(server: FakeLLM) -> None:
    server.script(Reply(status=503, body={"error": "busy"}), good_reply())
    written = openai_author(server, max_attempts=3).write(make_request())
    assert written.source == RMS_NORM_SOURCE
    assert written.author == "llm:openai:fake-coder"
    assert "after 2 attempts" in written.notes
    assert len(server.requests) == 2


def test_openai_http_500_falls_back_to_the_template_after_bounded_retries(server: FakeLLM, caplog) -> None:
    server.script(default=Reply(status=500, body={"error": f"boom (key {OPENAI_KEY})"}))
    request = make_request()
    with caplog.at_level(logging.DEBUG):
        written = openai_author(server, max_attempts=3).write(request)
    assert len(server.requests) == 3
    template = TemplateAuthor().write(request)
    assert written.source == template.source
    assert written.strategy == template.strategy
    assert written.author.startswith("template (llm fallback: ")
    assert "HTTP 500" in written.author and "gave up after 3 attempts" in written.author
    assert "llm:openai:fake-coder gave no usable candidate" in written.notes
    # The key never leaks: not in the label, the notes, or the logs (even when the server echoes it).
    assert OPENAI_KEY not in written.author + written.notes + caplog.text


def test_openai_client_error_is_not_retried(server: FakeLLM) -> None:
    server.script(default=Reply(status=401, body={"error": "invalid api key"}))
    written = openai_author(server, max_attempts=3).write(make_request())
    assert len(server.requests) == 1
    assert "HTTP 401" in written.author and written.author.startswith("template (llm fallback:")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("I would write a kernel that loads each row once and...", "not JSON"),
        (json.dumps({"strategy": {"name": "x", "notes": ""}, "adapter": ADAPTER}), "source"),
        (
            json.dumps(
                {
                    "strategy": {"name": "x", "notes": ""},
                    "source": RMS_NORM_SOURCE,
                    "adapter": {"weight": "weight", "eps": "variance_epsilon"},
                }
            ),
            "adapter",
        ),
        (
            reply_json(re.sub(r"^OP = .*$", 'OP = "layer_norm"', RMS_NORM_SOURCE, count=1, flags=re.M), ADAPTER),
            "OP is 'layer_norm', expected 'rms_norm'",
        ),
        (
            reply_json(re.sub(r"^OP = .*$", "", RMS_NORM_SOURCE, count=1, flags=re.M), ADAPTER),
            "defines no top-level OP",
        ),
        (reply_json("def entry(x:\n    pass\n", ADAPTER), "not valid Python"),
        (json.dumps([1, 2, 3]), "not an object"),
    ],
)
def test_openai_unusable_reply_falls_back_to_the_template(server: FakeLLM, text: str, reason: str) -> None:
    server.script(Reply(text=text))
    request = make_request()
    written = openai_author(server).write(request)
    assert len(server.requests) == 1  # a bad reply is not an HTTP failure: no retry
    assert written.source == TemplateAuthor().write(request).source
    assert written.author.startswith("template (llm fallback: ")
    assert reason in written.author
    assert "the template author wrote this one" in written.notes


def test_openai_unreachable_server_falls_back() -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    author = LLMAuthor(OpenAICompatibleBackend(f"http://127.0.0.1:{port}/v1", "m"), max_attempts=2, backoff_s=0.0)
    written = author.write(make_request())
    assert written.author.startswith("template (llm fallback: ")
    assert "ConnectError" in written.author


# --- Gemini --------------------------------------------------------------------------------------


def test_gemini_author_returns_the_model_source(server: FakeLLM, tmp_path) -> None:
    server.script(good_reply())
    written = gemini_author(server).write(make_request())

    assert written.source == RMS_NORM_SOURCE
    assert written.author == "llm:gemini:gemini-2.5-flash"
    assert written.strategy["name"] == "one-row-fused"

    [received] = server.requests
    assert received.path == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert received.headers["x-goog-api-key"] == GEMINI_KEY
    body = received.body
    config = body["generationConfig"]
    assert config["temperature"] == 0
    assert config["seed"] == 42
    assert config["responseMimeType"] == "application/json"
    schema = config["responseSchema"]
    assert set(schema["properties"]) == {"source", "adapter", "strategy"}
    assert schema["properties"]["adapter"]["type"].upper() == "ARRAY"
    assert set(schema["properties"]["adapter"]["items"]["properties"]) == {"kernel_param", "module_attr"}
    assert set(schema["properties"]["strategy"]["properties"]) == {"name", "notes"}
    assert objects_have_named_properties(schema)
    prompt = "".join(part["text"] for content in body["contents"] for part in content["parts"])
    assert_prompt_carries_request(prompt)
    assert "expert GPU kernel engineer" in body["systemInstruction"]["parts"][0]["text"]

    path = tmp_path / "rms_norm_gemini.py"
    path.write_text(written.source)
    assert load_candidate(path).op == "rms_norm"


def test_gemini_garbage_reply_falls_back(server: FakeLLM) -> None:
    server.script(Reply(text="{not json at all"))
    request = make_request()
    written = gemini_author(server).write(request)
    assert written.source == TemplateAuthor().write(request).source
    assert written.author.startswith("template (llm fallback: reply is not JSON")


def test_gemini_http_500_falls_back_after_bounded_retries(server: FakeLLM, caplog) -> None:
    server.script(default=Reply(status=500, body={"error": {"code": 500, "message": "internal", "status": "INTERNAL"}}))
    with caplog.at_level(logging.DEBUG):
        written = gemini_author(server, max_attempts=2).write(make_request())
    assert len(server.requests) == 2
    assert written.author.startswith("template (llm fallback: Gemini answered HTTP 500")
    assert GEMINI_KEY not in written.author + written.notes + caplog.text


# --- reply parsing and prompt --------------------------------------------------------------------


def test_reply_schema_has_no_free_form_dicts() -> None:
    schema = strict_json_schema(CandidateReply)
    assert objects_have_named_properties(schema)
    assert "$ref" not in json.dumps(schema)


def test_parse_reply_accepts_fenced_json_and_fenced_source() -> None:
    fenced_source = "```python\n" + RMS_NORM_SOURCE + "```"
    text = "Here you go:\n```json\n" + reply_json(fenced_source, ADAPTER) + "\n```\n"
    source, adapter, strategy, remarks = parse_reply(text, make_request())
    assert source == RMS_NORM_SOURCE
    assert adapter == ADAPTER and remarks == []
    assert strategy["name"] == "fake-strategy"


def test_parse_reply_notes_an_adapter_that_differs_from_the_source() -> None:
    other = [{"kernel_param": "weight", "module_attr": "weight"}, {"kernel_param": "eps", "module_attr": "eps"}]
    source, adapter, _, remarks = parse_reply(reply_json(RMS_NORM_SOURCE, other), make_request())
    assert source == RMS_NORM_SOURCE  # the source (what the verifier checks) is kept as written
    assert any("differs from the source's ADAPTER" in r for r in remarks)
    with pytest.raises(UnusableReply, match="adapter is invalid"):
        parse_reply(reply_json(RMS_NORM_SOURCE, [{"kernel_param": "not an id", "module_attr": "w"}]), make_request())


def test_prompt_shows_the_helpers_the_reference_calls() -> None:
    from gpuyantra.ops import UnknownOpError

    try:
        family = get_op("rope")
    except UnknownOpError:
        pytest.skip("no rope family registered")
    source = reference_source(family)
    assert inspect.getsource(family.reference).strip() in source
    assert "def _apply(" in source and "def _rotate_half(" in source  # helpers, found recursively


def test_prompt_includes_the_seed_source() -> None:
    prompt = build_prompt(make_request(seed_source="# SEED-SKILL-SOURCE\n", seed_strategy={"NUM_WARPS": 8}))
    assert "# SEED-SKILL-SOURCE" in prompt and '"NUM_WARPS": 8' in prompt


# --- configuration -------------------------------------------------------------------------------


def test_get_author_defaults_to_the_template() -> None:
    assert isinstance(get_author(), TemplateAuthor)


def test_get_author_openai_requires_a_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUYANTRA_AUTHOR", "openai")
    with pytest.raises(ValueError, match="GPUYANTRA_LLM_BASE_URL"):
        get_author()


def test_get_author_gemini_requires_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUYANTRA_AUTHOR", "gemini")
    with pytest.raises(ValueError, match="GEMINI_API_KEY"):
        get_author()


def test_get_author_rejects_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown author 'claude'"):
        get_author("claude")
    monkeypatch.setenv("GPUYANTRA_LLM_BASE_URL", "http://127.0.0.1:1/v1")
    monkeypatch.setenv("GPUYANTRA_LLM_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="GPUYANTRA_LLM_TIMEOUT"):
        get_author("openai")
    monkeypatch.setenv("GPUYANTRA_LLM_TIMEOUT", "30")
    monkeypatch.setenv("GPUYANTRA_LLM_BASE_URL", "127.0.0.1:8000")
    with pytest.raises(ValueError, match="GPUYANTRA_LLM_BASE_URL"):
        get_author("openai")


def test_get_author_builds_configured_llm_authors(server: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUYANTRA_AUTHOR", "openai")
    monkeypatch.setenv("GPUYANTRA_LLM_BASE_URL", f"{server.url}/v1")
    monkeypatch.setenv("GPUYANTRA_LLM_MODEL", "fake-coder")
    monkeypatch.setenv("GPUYANTRA_LLM_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("GPUYANTRA_LLM_MAX_ATTEMPTS", "2")
    author = get_author()
    assert isinstance(author, LLMAuthor)
    assert author.name == "llm:openai:fake-coder" and author.max_attempts == 2
    assert OPENAI_KEY not in repr(author) + repr(vars(author.backend).get("base_url"))
    server.script(good_reply())
    assert author.write(make_request()).source == RMS_NORM_SOURCE
    assert server.requests[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"

    for key in ("GPUYANTRA_LLM_BASE_URL", "GPUYANTRA_LLM_MODEL", "GPUYANTRA_LLM_API_KEY"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("GPUYANTRA_AUTHOR", "gemini")
    monkeypatch.setenv("GOOGLE_API_KEY", GEMINI_KEY)
    author = get_author()
    assert author.name == "llm:gemini:gemini-2.5-flash"
    assert GEMINI_KEY not in repr(author)


def test_an_unexpected_backend_exception_falls_back_without_the_key() -> None:
    class Exploding:
        name, model = "openai", "m"

        def complete(self, *args: Any, **kwargs: Any) -> str:
            raise RuntimeError(f"bad header Authorization: Bearer {OPENAI_KEY}")

        def redact(self, text: str) -> str:
            return text.replace(OPENAI_KEY, "***")

    written = LLMAuthor(Exploding(), backoff_s=0.0).write(make_request())
    assert written.author.startswith("template (llm fallback: RuntimeError: bad header")
    assert OPENAI_KEY not in written.author + written.notes


class ScaledTanh(torch.nn.Module):
    """An open target's module (module level: a saved target pickles it)."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = 1.75

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x.sum(dim=1, keepdim=True)) * self.gain


def test_prompt_for_an_open_target_shows_the_module_its_inputs_and_the_failures() -> None:
    from gpuyantra.authors import Attempt
    from gpuyantra.ops.open import build_open_target, register_open

    target = build_open_target(ScaledTanh(), [torch.randn(6, 40, 3)])
    register_open(target)
    failure = {"layer": "correctness", "rule": "wrong-values", "message": "SEEN-FAILURE"}
    prompt = build_prompt(
        make_request(
            op=target.op,
            module_class="ScaledTanh",
            adapter=target.adapter,
            shapes=[[6, 40, 3]],
            history=[Attempt(strategy={}, reward=-1, failures=[failure])],
        )
    )
    assert "return torch.tanh(x.sum(dim=1, keepdim=True)) * self.gain" in prompt  # the module's source
    assert "gain = 1.75" in prompt and "keyword 'gain'" in prompt  # its bound float, live value
    assert "input x: shape [6, 40, 3] float32" in prompt and "def entry(x, *, gain)" in prompt
    assert "SEEN-FAILURE" in prompt
