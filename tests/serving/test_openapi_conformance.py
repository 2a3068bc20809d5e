"""The served API against its own OpenAPI schema (schemathesis): a real `gpuyantra serve` of tiny-qwen2 on
127.0.0.1, valid and invalid bodies, checks not_a_server_error, response_schema_conformance and
negative_data_rejection. Bounded: few examples per route, small generations, a timeout per request and
for the whole test."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import negative_data_rejection, response_schema_conformance

pytestmark = pytest.mark.integration

ROUTES = ["/v1/completions", "/admin/logits", "/admin/swap", "/admin/benchmark"]
CHECKS = [not_a_server_error, response_schema_conformance, negative_data_rejection]
MAX_EXAMPLES = 25
REQUEST_TIMEOUT_S = 60
# Valid bodies may ask for long runs (max_tokens up to 1e6, 20 benchmark repeats of 5 s): capped, in range.
CAPS = {
    "max_tokens": 4,
    "max_completion_tokens": 4,
    "prompt_tokens": 8,
    "repeats": 2,
    "min_repeat_s": 0.0,
    "batch": 2,
    "n": 2,
}


@pytest.fixture(scope="module")
def api_schema(shared_server):
    schema = schemathesis.openapi.from_url(shared_server.url + "/openapi.json", timeout=30)
    schema.config.update(base_url=shared_server.url)
    return schema


# Hypothesis drives the cases here: schemathesis' own pytest loader (`from_fixture`) does not run on pytest 9.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("route", ROUTES)
def test_api_conforms_to_its_schema(api_schema, shared_server, route, mode):
    (operation,) = [
        result.ok()
        for result in api_schema.get_all_operations()
        if result.ok().path == route and result.ok().method.upper() == "POST"
    ]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        if mode == GenerationMode.POSITIVE and isinstance(case.body, dict):
            for key, cap in CAPS.items():
                if isinstance(case.body.get(key), (int, float)) and not isinstance(case.body[key], bool):
                    case.body[key] = min(case.body[key], cap)
        case.call_and_validate(headers=shared_server.admin, checks=CHECKS, timeout=REQUEST_TIMEOUT_S)

    check()
