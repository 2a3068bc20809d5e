"""References and allowances kept per process: the same question is computed once, a judging that
asks while another computes waits for it, the budget holds, and a cached reference judges exactly as
a fresh one (a wrong output is still caught on a hit)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

import gpuyantra.verifier.judge as judge_module
from gpuyantra.ops import get_op
from gpuyantra.verifier.cases import plan
from gpuyantra.verifier.judge import OutputValues, References
from gpuyantra.verifier.reference_cache import BUDGET_ENV, ReferenceCache, budget_bytes
from tests.verifier.conftest import module_outputs

SPECS = [{"name": "weight", "kind": "tensor", "shape": ["H"]}, {"name": "eps", "kind": "float", "value": 1e-6}]


class _Blob:
    def __init__(self, size: int, name: str = "") -> None:
        self.size, self.name = size, name

    def nbytes(self) -> int:
        return self.size


def test_a_plan_larger_than_the_budget_keeps_its_first_keys_instead_of_pushing_out_each_one():
    # Plain least-recently-used order keeps nothing of a plan judged in the same order each time.
    cache: ReferenceCache[_Blob] = ReferenceCache(budget=100)
    for _ in range(3):  # three verifications of one plan of six 25-byte cases
        for key in "abcdef":
            cache.get("plan", key, lambda: _Blob(25))
    assert cache.nbytes == 100 and len(cache) == 4
    assert (cache.hits, cache.misses) == (8, 10)  # a-d hit on the second and third verification


def test_another_plan_pushes_out_the_least_recently_used_plan_whole():
    cache: ReferenceCache[_Blob] = ReferenceCache(budget=100)
    for key in "ab":
        cache.get("old", key, lambda: _Blob(25))
    for key in "ab":
        cache.get("recent", key, lambda: _Blob(25))
    cache.get("old", "a", lambda: pytest.fail("kept"))  # "old" is now the most recently used
    cache.get("new", "a", lambda: _Blob(25))  # 125 > 100: "recent" leaves, whole
    assert cache.get("recent", "b", lambda: _Blob(1, "again")).name == "again"
    assert cache.get("old", "b", lambda: _Blob(1, "again")).name == ""
    cache.get("huge", "a", lambda: _Blob(30))  # past a quarter of the budget: computed, not kept
    assert cache.get("huge", "a", lambda: _Blob(30, "recomputed")).name == "recomputed"


def _asked_at_once(cache: ReferenceCache[_Blob], size: int, n: int = 4) -> tuple[list[_Blob], list[int], Callable]:
    """(what `n` threads got asking for one key of `size` bytes, the computations, the computation):
    the first starts computing, the others ask meanwhile."""
    calls: list[int] = []
    started = threading.Event()

    def compute() -> _Blob:
        calls.append(1)
        started.set()
        time.sleep(0.2)  # the others ask meanwhile
        return _Blob(size)

    got: list[_Blob] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get("plan", "k", compute))) for _ in range(n)]
    threads[0].start()
    assert started.wait(10)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(10)
    return got, calls, compute


def test_a_key_asked_for_at_once_is_computed_once():
    got, calls, _ = _asked_at_once(ReferenceCache(budget=1000), size=10)
    assert len(calls) == 1 and len(got) == 4 and all(g is got[0] for g in got)


def test_a_key_too_large_to_keep_asked_for_at_once_is_still_computed_once():
    # Before: each waiter found nothing kept and computed it again, one after another.
    cache: ReferenceCache[_Blob] = ReferenceCache(budget=100)
    got, calls, compute = _asked_at_once(cache, size=60)  # past a quarter of the budget: never kept
    assert len(calls) == 1 and len(got) == 4 and all(g is got[0] for g in got)
    assert len(cache) == 0  # and the next asker computes it again
    cache.get("plan", "k", compute)
    assert len(calls) == 2


def test_a_failed_computation_is_not_kept_and_the_next_asker_computes_again():
    cache: ReferenceCache[_Blob] = ReferenceCache(budget=1000)

    def broken() -> _Blob:
        raise RuntimeError("reference failed")

    with pytest.raises(RuntimeError):
        cache.get("plan", "k", broken)
    assert cache.get("plan", "k", lambda: _Blob(5, "ok")).name == "ok"
    # One waiting on a computation that raises computes (and raises) its own.
    started, release = threading.Event(), threading.Event()

    def slow_broken() -> _Blob:
        started.set()
        release.wait(10)
        raise RuntimeError("reference failed")

    errors: list[str] = []
    values: list[str] = []

    def ask(compute) -> None:  # noqa: ANN001
        try:
            values.append(cache.get("plan", "other", compute).name)
        except RuntimeError as exc:
            errors.append(str(exc))

    first = threading.Thread(target=ask, args=(slow_broken,))
    first.start()
    assert started.wait(10)
    second = threading.Thread(target=ask, args=(lambda: _Blob(5, "own"),))
    second.start()
    time.sleep(0.1)  # the second now waits on the first's computation
    release.set()
    first.join(10)
    second.join(10)
    assert errors == ["reference failed"] and values == ["own"]


def test_zero_budget_turns_the_cache_off_and_a_malformed_one_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(BUDGET_ENV, "0")
    assert budget_bytes("cuda") == 0
    cache: ReferenceCache[_Blob] = ReferenceCache(budget_bytes("cpu"))
    cache.get("plan", "k", lambda: _Blob(1))
    assert len(cache) == 0
    monkeypatch.setenv(BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match=BUDGET_ENV):
        budget_bytes("cpu")


def test_the_cuda_default_grows_with_the_gpu_between_its_floor_and_its_cap(monkeypatch):
    monkeypatch.delenv(BUDGET_ENV, raising=False)
    gib = 2**30
    assert budget_bytes("cuda") == 4 * gib  # memory unknown: the floor
    assert budget_bytes("cuda", 16 * gib) == 4 * gib  # a small GPU keeps the floor
    assert budget_bytes("cuda", 80 * gib) == 10 * gib  # an eighth
    assert budget_bytes("cuda", 141 * gib) == 16 * gib  # capped
    assert budget_bytes("cpu", 141 * gib) == 1 * gib  # the host's budget does not follow a GPU
    monkeypatch.setenv(BUDGET_ENV, "2048")
    assert budget_bytes("cuda", 141 * gib) == 2 * gib  # a setting wins


def _one_element_off(out: torch.Tensor) -> None:
    out.view(-1)[3] += 0.5  # a kernel that is wrong in one place


def test_a_cached_reference_judges_as_a_fresh_one_and_still_catches_a_wrong_output(monkeypatch):
    monkeypatch.setattr(judge_module, "_CACHES", {})
    family = get_op("rms_norm")
    cases = plan("cpu", [[3, 32]], ["float32"], (0, 1))
    wrong = cases[1].id

    def judged(references: References) -> dict[int, tuple[str, ...]]:
        values = OutputValues(family, cases, references)
        values.consume(module_outputs(family, cases, SPECS, {wrong: _one_element_off}))
        return {c.id: tuple(f.message for f in values.of(c).findings) for c in cases}

    first = judged(References(family, SPECS, "cpu"))
    cache = judge_module._reference_cache("cpu")
    assert cache.misses == len(cases) and cache.hits == 0
    second = judged(References(family, SPECS, "cpu"))  # another verification of the same op
    assert cache.hits == len(cases) and cache.misses == len(cases)
    assert second == first
    assert first[wrong] and "elements outside" in first[wrong][0]
    assert all(not first[c.id] for c in cases if c.id != wrong)
    monkeypatch.setenv(BUDGET_ENV, "0")
    monkeypatch.setattr(judge_module, "_CACHES", {})
    assert judged(References(family, SPECS, "cpu")) == first  # computed fresh: the same findings


def test_other_specs_or_another_family_object_of_the_same_name_are_other_questions(monkeypatch):
    monkeypatch.setattr(judge_module, "_CACHES", {})
    family = get_op("rms_norm")
    case = plan("cpu", [[2, 16]], ["float32"], (0,))[0]
    kept = References(family, SPECS, "cpu").judged(case)
    assert References(family, SPECS, "cpu").judged(case) is kept
    other_eps = [SPECS[0], {"name": "eps", "kind": "float", "value": 1e-3}]
    assert References(family, other_eps, "cpu").judged(case) is not kept

    class Renamed:  # same name, another object: a test's or a reloaded family
        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(family, name)

    assert References(Renamed(), SPECS, "cpu").judged(case) is not kept
