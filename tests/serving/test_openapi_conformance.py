"""The served API against its own OpenAPI schema (schemathesis), as a user fuzzing it from `/openapi.json` would:
every operation the schema publishes (read from the schema, so a route added later is fuzzed too), valid and
invalid requests, against a real `gpuyantra serve` on 127.0.0.1 (tiny-qwen2's config with random weights and a
tokenizer with a chat template). Checked: no 5xx; every status code, content type and body is one the schema
declares; invalid input is refused with a 4xx. Also: a boolean or a string where the schema says number (token
ids, counts, temperatures) is refused; the admin routes declare the token and their refusal without it; an
attested swap and its rollbacks, and every route while the model loads, answer as declared.

Bounded: a per-operation example and time budget, small generations (CAPS), a timeout per request and per test.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema_rs
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from serving.app import ServeConfig, create_app
from serving.auth import is_admin_path
from tests.serving.helpers import RMS_NORM_KERNEL, TOKEN, ServerProcess, attested, cache_model_server

pytestmark = pytest.mark.integration

# What any answer is checked for: its status code, content type and body are ones the schema declares.
AS_DECLARED = [status_code_conformance, content_type_conformance, response_schema_conformance]
DECLARED = [not_a_server_error, *AS_DECLARED]  # and no 5xx
CHECKS = [*DECLARED, negative_data_rejection]
MAX_EXAMPLES = 20  # per operation and generation mode
# Per operation and generation mode: once spent, the rest of its cases are generated but not sent. Profiling
# or benchmarking the model takes seconds a call on a CPU; everything else, milliseconds.
OPERATION_BUDGET_S = 8.0
REQUEST_TIMEOUT_S = 60
# Valid bodies may ask for long runs (max_tokens up to 1e6, 20 benchmark repeats of 5 s, a 30 s live window):
# capped, in range.
CAPS = {
    "max_tokens": 4,
    "max_completion_tokens": 4,
    "prompt_tokens": 8,
    "repeats": 2,
    "min_repeat_s": 0.0,
    "batch": 2,
    "n": 2,
    "live_window_s": 0.5,
    "min_live_steps": 5,
}
CHAT_MODEL = "gpuyantra-test/tiny-chat"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}  # what every server here is started with
VALID_BODIES = 8  # per operation, each with every number in it replaced by a boolean and by a string


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """A server of its own: the fuzzing posts swaps and rollbacks, and no other test may see their effects.
    Its model has a chat template (the presets' byte-level tokenizer has none: every chat request would be a
    400), so chat completions are answered too."""
    server = cache_model_server(tmp_path_factory.mktemp("fuzzed-server"), CHAT_MODEL)
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def api_schema(fuzzed_server):
    schema = schemathesis.openapi.from_url(fuzzed_server.url + "/openapi.json", timeout=30)
    schema.config.update(base_url=fuzzed_server.url)
    return schema


def published_operations(api_schema) -> list[Any]:
    """Every operation of the served schema, in its order; one the loader cannot read fails the test."""
    return [result.ok() for result in api_schema.get_all_operations()]


def takes_input(operation) -> bool:
    """Whether a negative case can be made: the operation declares a body or a parameter."""
    return bool(operation.body) or any(True for _ in operation.iter_parameters())


def cap_run_lengths(body: Any) -> None:
    """Hold a valid body's run-length fields to CAPS (each cap is inside the declared range). In place:
    assigning `case.body` makes schemathesis judge the case again, and it judges a JSON null body invalid."""
    if isinstance(body, dict):
        for key, cap in CAPS.items():
            value = body.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                body[key] = min(value, cap)


def settings_for(max_examples: int):
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def fuzz(operation, mode: GenerationMode, headers: dict[str, str]) -> None:
    """Up to MAX_EXAMPLES cases of one operation in one generation mode, each sent and checked, for at most
    OPERATION_BUDGET_S seconds."""
    deadline = time.monotonic() + OPERATION_BUDGET_S

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings_for(MAX_EXAMPLES)
    def check(case) -> None:
        if time.monotonic() > deadline:
            return
        if mode == GenerationMode.POSITIVE:
            cap_run_lengths(case.body)
        case.call_and_validate(headers=headers, checks=CHECKS, timeout=REQUEST_TIMEOUT_S)

    try:
        check()
    except Unsatisfiable:
        # Every input the operation takes accepts any value (a free-form string): nothing invalid to send.
        if mode != GenerationMode.NEGATIVE:
            raise


# Hypothesis drives the cases here: schemathesis' own pytest loader (`from_fixture`) does not run on pytest 9.
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_every_operation_conforms_to_the_schema(api_schema, fuzzed_server, mode, subtests):
    operations = published_operations(api_schema)
    assert {op.path for op in operations} >= {"/v1/completions", "/admin/swap"}, "the schema lost its routes"
    for operation in operations:
        if mode == GenerationMode.NEGATIVE and not takes_input(operation):
            continue  # nothing to make invalid
        with subtests.test(operation=operation.label):
            fuzz(operation, mode, fuzzed_server.admin)


# ---------------------------------------------------------------------- numbers are numbers only
def valid_json_bodies(operation, count: int) -> list[Any]:
    """`count` valid JSON bodies of an operation (fewer when it has fewer), their run lengths capped."""
    bodies: list[Any] = []

    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE, media_type="application/json"))
    @settings_for(count)
    def collect(case) -> None:
        if isinstance(case.body, (dict, list)):
            body = copy.deepcopy(case.body)
            cap_run_lengths(body)
            bodies.append(body)

    collect()
    return bodies


def number_paths(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Where the numbers (not booleans) are in a JSON value."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from number_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from number_paths(item, (*path, index))


def replaced(value: Any, path: tuple[str | int, ...], new: Any) -> Any:
    """A copy of a JSON value with the item at `path` replaced."""
    out = copy.deepcopy(value)
    parent = out
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = new
    return out


def type_confused(body: Any, is_valid) -> Iterator[tuple[str | int, Any]]:
    """The body with one number replaced by `true` or by its digits, wherever that makes it invalid; with the
    top-level field it is in."""
    for path in number_paths(body):
        item = body
        for step in path:
            item = item[step]
        for wrong in (True, str(item)):
            candidate = replaced(body, path, wrong)
            if not is_valid(candidate):  # where a string is valid too (a text prompt), it is no confusion
                yield path[0], candidate


def names_the_field(response, field: str | int) -> bool:
    """Whether a validation refusal has an issue in this top-level field (not only elsewhere: a random valid
    body can be refused for its model name or its token ids)."""
    issues = response.json().get("detail")
    return isinstance(issues, list) and any(field in issue.get("loc", []) for issue in issues)


@pytest.mark.timeout(120)
def test_a_boolean_or_a_string_is_no_number(api_schema, fuzzed_server, subtests):
    """JSON `true` or `"5"` where the schema says number (token ids, counts, temperatures) is refused with a
    declared 422 that names the field: never read as 1 or 5."""
    for operation in published_operations(api_schema):
        body = operation.get_body_for_media_type("application/json")
        if body is None:
            continue
        is_valid = jsonschema_rs.validator_for(body.validation_schema).is_valid
        with subtests.test(operation=operation.label):
            confused = [
                c for valid in valid_json_bodies(operation, VALID_BODIES) for c in type_confused(valid, is_valid)
            ]
            for field, candidate in confused:
                case = operation.Case(body=candidate, media_type="application/json")
                response = case.call(headers=fuzzed_server.admin, timeout=REQUEST_TIMEOUT_S)
                case.validate_response(response, checks=DECLARED)
                refused = response.status_code == 422 and names_the_field(response, field)
                assert refused, f"{candidate} answered {response.status_code}: {response.text}"


# ---------------------------------------------------------------------- the admin token
def declares_a_token(operation) -> bool:
    return bool(operation.definition.raw.get("security"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-the-token"}, {"Authorization": "Basic dXNlcjpwYXNz"}],
    ids=["no-token", "wrong-token", "not-bearer"],
)
def test_admin_refusals_are_declared(api_schema, fuzzed_server, headers, subtests):
    """Every route under /admin, and every route that declares a security scheme, answers a request without
    the right bearer token with a declared 401; and declares the scheme (so a client knows where the token goes)."""
    admin = [op for op in published_operations(api_schema) if is_admin_path(op.path) or declares_a_token(op)]
    assert admin, "the schema publishes no admin route"
    for operation in admin:
        with subtests.test(operation=operation.label):
            assert declares_a_token(operation), "no security scheme declared"
            case = operation.Case(body={}) if operation.body else operation.Case()
            response = case.call(headers=headers, timeout=REQUEST_TIMEOUT_S)
            assert response.status_code == 401, response.text
            case.validate_response(response, checks=DECLARED)


# ---------------------------------------------------------------------- a real swap
def operation_at(api_schema, method: str, path: str):
    (operation,) = [op for op in published_operations(api_schema) if (op.method.upper(), op.path) == (method, path)]
    return operation


def one_case(operation, body: Any = None):
    """A request of an operation: with this JSON body, or with none."""
    return operation.Case(body=body, media_type="application/json") if body is not None else operation.Case()


def declared_answer(api_schema, server: ServerProcess, method: str, path: str, body: Any = None):
    """Send one request and check its answer is declared; returns the answer."""
    operation = operation_at(api_schema, method, path)
    case = one_case(operation, body)
    response = case.call(headers=server.admin, timeout=REQUEST_TIMEOUT_S)
    case.validate_response(response, checks=DECLARED)
    return response


@pytest.mark.timeout(180)
def test_a_swap_and_its_rollbacks_answer_as_declared(api_schema, fuzzed_server):
    """The answers that carry swap records (no fuzzed swap can have a valid attestation): an attested swap,
    the kernels it leaves, its rollback, rolling it back again (409) and an unknown swap id (404)."""
    proof = attested(RMS_NORM_KERNEL.read_bytes())
    swapped = declared_answer(
        api_schema, fuzzed_server, "POST", "/admin/swap", {"path": str(RMS_NORM_KERNEL), "attestation": proof}
    )
    assert swapped.status_code == 200, swapped.text
    swap_id = swapped.json()["swap_id"]
    kernels = declared_answer(api_schema, fuzzed_server, "GET", "/admin/kernels")
    assert [record["swap_id"] for record in kernels.json()["active"]] == [swap_id]
    for expected in (200, 409):
        rolled = declared_answer(api_schema, fuzzed_server, "POST", "/admin/rollback", {"swap_id": swap_id})
        assert rolled.status_code == expected, rolled.text
    unknown = declared_answer(api_schema, fuzzed_server, "POST", "/admin/rollback", {"swap_id": "no-such-swap"})
    assert unknown.status_code == 404, unknown.text


# ---------------------------------------------------------------------- while the model loads
@pytest.mark.timeout(120)
def test_every_operation_answers_as_declared_while_the_model_loads(tmp_path, monkeypatch, subtests):
    """Before the model is there (an in-process app whose loading waits): one valid request per operation,
    the probes' 503 and every route's 503 (or 422) are answers the schema declares."""
    import serving.app as app_module

    release = threading.Event()

    def waiting_load(*args: Any, **kwargs: Any) -> None:
        release.wait(60)
        raise RuntimeError("no model in this test")

    monkeypatch.setattr(app_module, "load_model", waiting_load)
    config = ServeConfig(model="tiny-qwen2", device="cpu", admin_token=TOKEN, state_dir=str(tmp_path))
    answered = {}
    with TestClient(create_app(config)) as client:
        try:
            schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
            for operation in published_operations(schema):
                with subtests.test(operation=operation.label):
                    bodies = valid_json_bodies(operation, 1) if operation.body else []
                    body = bodies[0] if bodies else None
                    case = one_case(operation, body)
                    response = client.request(case.method, case.formatted_path, json=body, headers=ADMIN)
                    case.validate_response(response, checks=AS_DECLARED)  # a 503 is the answer expected here
                    answered[operation.label] = response.status_code
        finally:
            release.set()
            client.app.state.loader.join(30)
    assert answered["GET /readyz"] == 503 and answered["GET /v1/models"] == 503, answered


def test_the_server_still_serves_after_the_fuzzing(fuzzed_server):
    """Swaps, rollbacks, profiles and benchmarks in any order leave a server that answers completions."""
    body = {"prompt": "Hi", "max_tokens": 2}
    r = httpx.post(fuzzed_server.url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 2, r.text
    assert httpx.get(fuzzed_server.url + "/readyz", timeout=REQUEST_TIMEOUT_S).status_code == 200
