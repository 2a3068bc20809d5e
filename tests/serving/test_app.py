"""The HTTP API in-process (FastAPI TestClient): auth, body validation, completions, admin routes."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from serving.app import ServeConfig, create_app
from tests.serving.candidates import rms_norm_source
from tests.serving.helpers import RMS_NORM_KERNEL, TOKEN, attested, metric_value, tiny_cpu_config

AUTH = {"Authorization": f"Bearer {TOKEN}"}
ADMIN_ROUTES = [
    ("get", "/admin/kernels", None),
    ("post", "/admin/swap", {"path": str(RMS_NORM_KERNEL)}),
    ("post", "/admin/rollback", {"all": True}),
    ("post", "/admin/profile", {}),
    ("post", "/admin/benchmark", {"max_tokens": 2}),
    ("post", "/admin/compare", {"swap_id": "swap-x"}),
]


def wait_ready(client: TestClient, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/readyz").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError(f"not ready: {client.get('/readyz').json()}")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    config = tiny_cpu_config(tmp_path_factory.mktemp("app-state"))
    with TestClient(create_app(config)) as c:
        wait_ready(c)
        yield c


def completion(client, **body):
    body.setdefault("temperature", 0)
    return client.post("/v1/completions", json=body)


# ---------------------------------------------------------------------- auth
@pytest.mark.parametrize("method, path, body", ADMIN_ROUTES)
@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}, {"Authorization": "Basic " + TOKEN}]
)
def test_admin_routes_need_the_token(client, method, path, body, headers):
    r = getattr(client, method)(path, headers=headers, **({"json": body} if body is not None else {}))
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["detail"] == "missing or wrong bearer token"


def test_auth_is_checked_before_the_body(client):
    r = client.post("/admin/swap", json={"nonsense": 1})
    assert r.status_code == 401
    r = client.post("/admin/swap", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 401


def test_admin_disabled_without_a_configured_token(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUYANTRA_ADMIN_TOKEN", raising=False)
    app = create_app(ServeConfig(model="tiny-qwen2", device="cpu", state_dir=str(tmp_path)))
    with TestClient(app) as c:
        r = c.get("/admin/kernels", headers={"Authorization": "Bearer anything"})
        assert r.status_code == 401 and "disabled" in r.json()["detail"]


def test_token_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUYANTRA_ADMIN_TOKEN", "from-env")
    app = create_app(ServeConfig(model="tiny-qwen2", device="cpu", state_dir=str(tmp_path)))
    with TestClient(app) as c:
        wait_ready(c)
        assert c.get("/admin/kernels", headers={"Authorization": "Bearer from-env"}).status_code == 200
        assert c.get("/admin/kernels", headers=AUTH).status_code == 401


# ---------------------------------------------------------------------- 422
@pytest.mark.parametrize(
    "path, body, message",
    [
        ("/admin/swap", {}, "give exactly one of 'source'"),
        ("/admin/swap", {"source": "x", "path": "/a.py"}, "give exactly one of 'source'"),
        ("/admin/swap", {"path": "relative/file.py"}, "'path' must be absolute"),
        ("/admin/swap", {"path": "/a.py", "modul_class": "X"}, "modul_class: Extra inputs are not permitted"),
        ("/admin/swap", {"source": 3}, "source: Input should be a valid string"),
        ("/admin/swap", {"source": "x", "shapes": [[0, 64]]}, "positive dims"),
        ("/admin/swap", [1, 2], "Input should be a valid dictionary"),
        ("/admin/swap", {"source": "x", "attestation": {"digest": "ab"}}, "attestation.digest: String should match"),
        ("/admin/swap", {"source": "x", "rows_gate": {"kernel": [1], "original": []}}, "rows_gate.original: List"),
        ("/admin/swap", {"source": "x", "rows_gate": {"kernel": [0], "original": [8]}}, "rows_gate.kernel.0: Input"),
        ("/admin/rollback", {}, "give either 'swap_id' or 'all'"),
        ("/admin/rollback", {"swap_id": "a", "all": True}, "give either 'swap_id' or 'all'"),
        ("/admin/rollback", {"all": "maybe"}, "all: Input should be a valid boolean"),
        ("/admin/benchmark", {"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ("/admin/benchmark", {"batch": 1000}, "batch must be between 1 and max_batch"),
        ("/admin/benchmark", {"max_tokens": True}, "max_tokens: Input should be a valid integer"),
        ("/admin/benchmark", {"repeats": "2"}, "repeats: Input should be a valid integer"),
        ("/admin/logits", {"prompt": [1, True]}, "prompt"),  # token ids are integers, not booleans
        ("/admin/logits", {"prompt": [10**9]}, "prompt must encode to token ids in [0, "),
        ("/admin/swap", {"source": "x", "shapes": [[True, 64]]}, "shapes.0.0: Input should be a valid integer"),
        ("/admin/profile", {"ops": ["rms_norm"]}, "ops: Extra inputs are not permitted"),
        ("/v1/completions", {"max_tokens": 3}, "prompt: Field required"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ("/v1/completions", {"prompt": "x", "n": 0}, "n: Input should be greater than or equal to 1"),
        ("/v1/completions", {"prompt": [1, True]}, "prompt"),  # token ids are integers, not booleans
        ("/v1/completions", {"prompt": [[1], [False]]}, "prompt"),
        ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs: Input should be a valid integer"),
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs: Input should be less than or equal to 20"),
        ("/v1/completions", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop takes at most 4"),
        ("/v1/completions", {"prompt": "x", "echo": True}, "echo is not supported"),
        ("/v1/completions", {"prompt": "x", "seed": 2**64}, "seed: Input should be less than or equal to"),
        ("/v1/chat/completions", {"messages": []}, "messages: List should have at least 1 item"),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages.0.role: Field required"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "only text content parts",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs needs logprobs: true",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": True}, "n: Input should be"),
        ("/v1/completions", {"prompt": []}, "prompt must not be an empty list"),
        (
            "/v1/completions",
            {"prompt": "x", "temperature": -1},
            "temperature: Input should be greater than or equal to 0",
        ),
    ],
)
def test_malformed_bodies_get_422_with_a_message(client, path, body, message):
    r = client.post(path, json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert message in r.json()["message"], r.json()


def test_invalid_json_gets_422(client):
    r = client.post("/admin/swap", content=b"{not json", headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 422 and "JSON decode error" in r.json()["message"]


def test_candidate_that_does_not_load_gets_422(client, tmp_path):
    # (An unparsable source cannot be attested: tests/serving/test_attestation.py posts one unverified.)
    r = client.post("/admin/swap", json={"path": str(tmp_path / "missing.py")}, headers=AUTH)
    assert r.status_code == 422 and "does not exist" in r.json()["detail"]["reason"]


def test_undecodable_body_gets_422_with_the_validation_shape(client):
    r = client.post("/v1/completions", content=b"\xff\xfe{", headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["type"] == "json_invalid" and r.json()["message"]


def test_admin_routes_declare_their_real_422_bodies(client):
    schema = client.get("/openapi.json").json()
    ref = {
        path: schema["paths"][path]["post"]["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
        for path in ("/admin/benchmark", "/admin/logits", "/admin/swap")
    }
    assert ref["/admin/benchmark"].endswith("/RequestErrorBody") and ref["/admin/logits"].endswith("/RequestErrorBody")
    assert ref["/admin/swap"].endswith("/SwapUnprocessable")
    assert set(schema["components"]["schemas"]["RequestErrorBody"]["required"]) == {"detail", "message"}


def test_503_while_loading_says_when_to_retry(tmp_path, monkeypatch):
    import serving.app as app_module

    release = threading.Event()

    def slow_load(*args, **kwargs):
        release.wait(30)
        raise RuntimeError("no model here")

    monkeypatch.setattr(app_module, "load_model", slow_load)
    with TestClient(
        create_app(ServeConfig(model="tiny-qwen2", device="cpu", admin_token=TOKEN, state_dir=str(tmp_path)))
    ) as c:
        for r in (
            c.get("/v1/models"),
            c.get("/readyz"),
            c.post("/admin/logits", json={"prompt": [1]}, headers=AUTH),
            c.post("/v1/completions", json={"prompt": [1]}),
        ):
            assert r.status_code == 503 and r.headers["retry-after"] == "5", (r.request.url, r.text)
        release.set()
        c.app.state.loader.join(30)
        r = c.get("/v1/models")
        assert r.status_code == 503 and "no model here" in r.text and "retry-after" not in r.headers


# ---------------------------------------------------------------------- admin behaviour
def test_swap_parity_failure_is_409_and_rollback_errors(client):
    before = client.get("/metrics").text
    wrong = rms_norm_source(scale=2.0)  # attested anyway: parity is the server's own second check
    r = client.post("/admin/swap", json={"source": wrong, "attestation": attested(wrong)}, headers=AUTH)
    assert r.status_code == 409
    detail = r.json()["detail"]
    assert detail["status"] == "rolled_back" and "parity failed" in detail["reason"]
    after = client.get("/metrics").text
    assert (
        metric_value(after, "gpuyantra_parity_failures_total")
        == metric_value(before, "gpuyantra_parity_failures_total") + 1
    )
    r = client.post("/admin/rollback", json={"swap_id": detail["swap_id"]}, headers=AUTH)
    assert r.status_code == 409 and r.json()["detail"]["status"] == "not_active"
    r = client.post("/admin/rollback", json={"swap_id": "swap-9999-none"}, headers=AUTH)
    assert r.status_code == 404


def test_swap_kernels_rollback_roundtrip(client):
    want = completion(client, prompt="roundtrip", max_tokens=5).json()["choices"][0]["token_ids"]
    r = client.post(
        "/admin/swap",
        json={
            "path": str(RMS_NORM_KERNEL),
            "module_class": "Qwen2RMSNorm",
            "attestation": attested(RMS_NORM_KERNEL.read_bytes()),
            "rows_gate": {"kernel": [1], "original": [4096]},  # prompts go to the original, decode to the kernel
        },
        headers=AUTH,
    )
    assert r.status_code == 200, r.text
    swap = r.json()
    assert swap["rows_gate"] == {"kernel": [1], "original": [4096]}
    assert {k: swap[k] for k in ("op", "module_class", "modules", "status")} == {
        "op": "rms_norm",
        "module_class": "Qwen2RMSNorm",
        "modules": 5,
        "status": "committed",
    }
    assert set(swap["parity"]) >= {"max_abs_err", "max_rel_err", "checked"}
    assert completion(client, prompt="roundtrip", max_tokens=5).json()["choices"][0]["token_ids"] == want
    kernels = client.get("/admin/kernels", headers=AUTH).json()
    assert [a["swap_id"] for a in kernels["active"]] == [swap["swap_id"]]
    assert kernels["active"][0]["calls"] > 0 and kernels["active"][0]["original_calls"] == 0  # 9-token prompt: kernel
    assert swap["swap_id"] in [h["swap_id"] for h in kernels["history"]]
    r = client.post("/admin/rollback", json={"all": True}, headers=AUTH)
    assert r.status_code == 200 and [x["swap_id"] for x in r.json()["rolled_back"]] == [swap["swap_id"]]
    assert client.get("/admin/kernels", headers=AUTH).json()["active"] == []


def test_profile_answers_the_contract_shape(client):
    completion(client, prompt="some traffic first", max_tokens=3)
    r = client.post("/admin/profile", json={}, headers=AUTH)
    assert r.status_code == 200, r.text
    prof = r.json()
    assert prof["device"] == "cpu" and prof["targets"]
    norm = next(t for t in prof["targets"] if t["op"] == "rms_norm")
    for key in ("module_class", "qualified_class", "modules", "adapter", "shapes", "dtype", "regime", "share"):
        assert key in norm, key
    assert norm["module_class"] == "Qwen2RMSNorm" and norm["modules"] == 5 and norm["dtype"] == "float32"
    assert client.post("/admin/profile", headers=AUTH).status_code == 200  # empty body too


def test_benchmark(client):
    r = client.post("/admin/benchmark", json={"max_tokens": 4, "prompt_tokens": 4, "batch": 2}, headers=AUTH)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["tokens_per_s"] > 0 and out["batch"] == 2 and out["path"] == "eager"


def test_compare_measures_a_swap_off_and_on_in_turns_and_leaves_it_on(client):
    source = rms_norm_source()
    r = client.post("/admin/swap", json={"source": source, "attestation": attested(source)}, headers=AUTH)
    assert r.status_code == 200, r.text
    swap_id = r.json()["swap_id"]
    try:
        body = {"swap_id": swap_id, "batches": [2, 1], "rounds": 2, "max_tokens": 3, "repeats": 1, "min_repeat_s": 0}
        r = client.post("/admin/compare", json=body, headers=AUTH)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["measured"] == "paired" and out["order"] == ["with", "without", "without", "with"]
        assert [b["batch"] for b in out["batches"]] == [1, 2]
        for entry in out["batches"]:
            assert len(entry["with"]["tokens_per_s_samples"]) == len(entry["without"]["tokens_per_s_samples"]) == 2
            assert len(entry["drops"]) == 2
        assert out["active_swaps"] == [swap_id]  # on again, not rolled back
        assert [a["swap_id"] for a in client.get("/admin/kernels", headers=AUTH).json()["active"]] == [swap_id]
        r = client.post("/admin/compare", json={**body, "batches": [99]}, headers=AUTH)
        assert r.status_code == 422 and "max_batch" in r.json()["message"]
    finally:
        client.post("/admin/rollback", json={"all": True}, headers=AUTH)
    r = client.post("/admin/compare", json={"swap_id": swap_id}, headers=AUTH)
    assert r.status_code == 409 and r.json()["detail"]["status"] == "not_active"
    assert client.post("/admin/compare", json={"swap_id": "swap-none"}, headers=AUTH).status_code == 404
    r = client.post("/admin/compare", json={"swap_id": swap_id, "rounds": 1}, headers=AUTH)
    assert r.status_code == 422 and "rounds" in r.text


# ---------------------------------------------------------------------- public routes
def test_probes_models_metrics(client):
    assert client.get("/healthz").json()["status"] == "ok"
    ready = client.get("/readyz").json()
    assert ready["status"] == "ready" and ready["model"] == "tiny-qwen2"
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny-qwen2"
    completion(client, prompt="metrics", max_tokens=2)
    text = client.get("/metrics").text
    for name in (
        "gpuyantra_requests_total",
        "gpuyantra_generated_tokens_total",
        "gpuyantra_tokens_per_second",
        "gpuyantra_request_latency_seconds_bucket",
        "gpuyantra_time_to_first_token_seconds_bucket",
        "gpuyantra_swaps_total",
        "gpuyantra_rollbacks_total",
        "gpuyantra_parity_failures_total",
        "gpuyantra_kernel_fallbacks_total",
        "gpuyantra_active_swaps",
    ):
        assert name in text, name
    assert metric_value(text, "gpuyantra_requests_total", 'status="ok"') >= 1


def test_completions_text_ids_batch_and_stream(client):
    one = completion(client, prompt="Hello", max_tokens=6).json()
    assert one["object"] == "text_completion" and one["model"] == "tiny-qwen2"
    choice = one["choices"][0]
    assert len(choice["token_ids"]) == 6 and choice["finish_reason"] == "length"
    assert one["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    # Byte-level fallback tokenizer: the prompt's UTF-8 bytes are its token ids.
    same = completion(client, prompt=list(b"Hello"), max_tokens=6).json()["choices"][0]
    assert same["token_ids"] == choice["token_ids"] and same["text"] == choice["text"]
    many = completion(client, prompt=["Hello", "other"], max_tokens=6).json()["choices"]
    assert [c["index"] for c in many] == [0, 1] and many[0]["token_ids"] == choice["token_ids"]
    # Streaming: same tokens and text, SSE chunks, [DONE].
    with client.stream(
        "POST",
        "/v1/completions",
        json={
            "prompt": "Hello",
            "max_tokens": 6,
            "stream": True,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    import json

    events = [json.loads(line[6:]) for line in lines[:-1]]
    ids = [i for e in events for c in e["choices"] for i in c["token_ids"]]
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert ids == choice["token_ids"] and text == choice["text"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 6


def test_completions_errors_and_stop(client):
    assert completion(client, prompt="x", model="gpt-4").status_code == 404
    r = completion(client, prompt="x" * 300, max_tokens=10)
    assert r.status_code == 400 and "exceeds the served context" in r.json()["error"]["message"]
    r = completion(client, prompt=[600], max_tokens=2)
    assert r.status_code == 400
    full = completion(client, prompt="Hello", max_tokens=8).json()["choices"][0]["text"]
    stop = full[2:4]
    cut = completion(client, prompt="Hello", max_tokens=8, stop=[stop]).json()["choices"][0]
    assert cut["text"] == full[: full.find(stop)] and cut["finish_reason"] == "stop"


def test_openai_routes_declare_their_error_bodies(client):
    schema = client.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = schema["paths"][path]["post"]["responses"]
        assert responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ValidationErrorBody")
        for status in ("400", "404", "500"):
            assert responses[status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert set(schema["components"]["schemas"]["ValidationErrorBody"]["properties"]) == {"detail", "message"}


def test_chat_without_a_chat_template_is_400(client):
    # The presets' byte-level tokenizer has no chat template.
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    assert "has no chat template" in r.json()["error"]["message"] and r.json()["detail"]


def test_completions_n_logprobs_and_stop(client):
    base = completion(client, prompt="Hello", max_tokens=6).json()["choices"][0]
    out = completion(client, prompt=["Hello", "other"], max_tokens=6, n=2, logprobs=3).json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert out["choices"][0]["token_ids"] == out["choices"][1]["token_ids"] == base["token_ids"]  # greedy
    assert out["usage"]["prompt_tokens"] == 10 and out["usage"]["completion_tokens"] == 24  # prompts once
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 6
    for chosen, top in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert chosen <= 0 and 1 <= len(top) <= 4
        assert max(top.values()) == pytest.approx(chosen)  # greedy: the chosen token is the likeliest
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert completion(client, prompt="Hello", max_tokens=2).json()["choices"][0]["logprobs"] is None
    # A stop string: text cut before it, token ids and logprobs up to the token that completed it.
    stop = next(ch for ch in base["text"][1:] if ch.isascii() and ch.isprintable())
    cut = completion(client, prompt="Hello", max_tokens=6, stop=stop, logprobs=0).json()["choices"][0]
    assert cut["text"] == base["text"][: base["text"].index(stop)] and cut["finish_reason"] == "stop"
    k = len(cut["token_ids"])
    assert cut["token_ids"] == base["token_ids"][:k] and len(cut["logprobs"]["tokens"]) == k
    assert all(len(t) == 1 for t in cut["logprobs"]["top_logprobs"])  # logprobs 0: the chosen token only


def test_benchmark_live_mode_without_traffic_is_a_409_and_auto_benchmarks(client):
    live = client.post("/admin/benchmark", json={"mode": "live"}, headers=AUTH)
    assert live.status_code == 409 and "no live traffic" in live.json()["message"]
    auto = client.post("/admin/benchmark", json={"max_tokens": 2, "repeats": 1}, headers=AUTH)
    assert auto.status_code == 200 and auto.json()["measured"] == "benchmark"
