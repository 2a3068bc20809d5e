"""On CUDA the child waits for the device once per group of calls, not after each call (`_settle`).
These tests run `run_cases` with device "cuda" on CPU tensors, `torch.cuda.synchronize` replaced by a
recorder: what is waited for when, and what a wait that raises (a device fault) leaves behind."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gpuyantra.verifier import cases as cases_module
from gpuyantra.verifier import child
from gpuyantra.verifier.cases import Case


class _Sink:
    def __init__(self) -> None:
        self.saved: list[int] = []
        self.groups = 0

    def add(self, case_id: int, outs: list) -> None:
        self.saved.append(case_id)
        return None

    def end_group(self) -> None:
        self.groups += 1


def _plan(groups: int, per_group: int) -> list[Case]:
    return [
        Case(g * per_group + k, "main", "float32", (4, 8 + g), k, 1.0) for g in range(groups) for k in range(per_group)
    ]


def _run(monkeypatch, entry, cases: list[Case], fault_on_wait: int | None = None) -> tuple[bool, dict, list, _Sink]:
    """run_cases on `cases` as on CUDA; `fault_on_wait`: the n-th synchronize (from 1) raises."""
    events: list[Any] = []

    def synchronize() -> None:
        events.append("wait")
        if fault_on_wait is not None and events.count("wait") == fault_on_wait:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: "default")
    monkeypatch.setattr(torch.cuda, "default_stream", lambda: "default")
    monkeypatch.setattr(
        cases_module,
        "make_case",
        lambda family, case, specs, device: ((torch.full(case.shape, float(case.id + 1)),), {}),
    )
    counter = child._Counter()

    def counted(*args: Any) -> Any:
        counter.launches += 1
        events.append(("call", float(args[0].flatten()[0]) - 1))
        return entry(*args)

    ctx = {
        "family": SimpleNamespace(activations=["x"]),
        "entry": counted,
        "counter": counter,
        "recorder": child._recorder(counter),
        "device": "cuda",
        "param_specs": [],
    }
    results: dict[str, Any] = {"checks": []}
    sink = _Sink()
    passed = child.run_cases(cases, ctx, results, sink)  # type: ignore[arg-type]
    return passed, results, events, sink


def _copy(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def test_a_group_of_calls_is_waited_for_once(monkeypatch):
    passed, results, events, sink = _run(monkeypatch, _copy, _plan(groups=2, per_group=3))
    assert passed
    # Each group: its three calls, then one wait for the device (the input checks are read after it).
    calls = [("call", float(i)) for i in range(6)]
    assert events == [*calls[:3], "wait", *calls[3:], "wait"]
    assert [r["id"] for r in results["checks"]] == list(range(6))
    assert all(r["mutated"] == [] for r in results["checks"])
    assert sink.saved == list(range(6)) and sink.groups == 2


def test_inputs_are_compared_after_every_stream_is_done(monkeypatch):
    # A kernel left running on a stream of the candidate's own may write an input after entry returns:
    # the comparison to the snapshot is queued only after the wait. Modelled here by a write that
    # lands when the device is waited for.
    written: list[torch.Tensor] = []

    def late_writer(x: torch.Tensor) -> torch.Tensor:
        written.append(x)
        return x.clone()

    real = child._settle

    def settle(unsettled, unread, device, results, part="correctness"):
        for x in written:
            x.add_(1.0)  # lands while the device is waited for
        written.clear()
        return real(unsettled, unread, device, results, part)

    monkeypatch.setattr(child, "_settle", settle)
    passed, results, _, _ = _run(monkeypatch, late_writer, _plan(groups=1, per_group=3))
    assert not passed
    assert all(r["mutated"] == ["activation x"] for r in results["checks"])
    assert results["stopped"].startswith("stopped after call 0")


def test_a_fault_reported_by_the_wait_names_the_calls_it_covers(monkeypatch):
    passed, results, events, sink = _run(monkeypatch, _copy, _plan(groups=2, per_group=3), fault_on_wait=2)
    assert not passed
    # Group 0 settled; group 1's wait raised: its first call carries the
    # error, the records after it are dropped (which call faulted cannot be told), nothing is saved.
    assert [r["id"] for r in results["checks"]] == [0, 1, 2, 3]
    error = results["checks"][3]["error"]
    assert error.startswith("RuntimeError: CUDA error: an illegal memory access")
    assert "calls 3-5" in error
    assert sink.saved == [0, 1, 2]


def test_large_inputs_are_settled_before_the_group_ends(monkeypatch):
    monkeypatch.setattr(child, "SETTLE_BYTES", 2 * 4 * 4 * 8)  # inputs and snapshots of one 4x8 call, float32
    passed, _, events, _ = _run(monkeypatch, _copy, [Case(k, "main", "float32", (4, 8), k, 1.0) for k in range(3)])
    assert passed
    # Past the bound after the second call: a wait there, then the third call, then the group's end.
    assert events == [("call", 0.0), ("call", 1.0), "wait", ("call", 2.0), "wait"]


@pytest.mark.parametrize("finding", ["raises", "host_op"])
def test_a_call_that_rejects_alone_still_settles_the_calls_before_it(monkeypatch, finding):
    def entry(x: torch.Tensor) -> torch.Tensor:
        if float(x.flatten()[0]) == 2.0:  # the second call
            if finding == "raises":
                raise ValueError("no kernel for this shape")
            return torch.sin(x)  # a host-side torch op: rejects on its own
        return x.clone()

    passed, results, events, _ = _run(monkeypatch, entry, _plan(groups=1, per_group=3))
    assert not passed
    assert events[:2] == [("call", 0.0), ("call", 1.0)] and events[2:] == ["wait"]
    assert results["checks"][0]["mutated"] == []
    last = results["checks"][-1]
    assert last["id"] == 1 and (("error" in last) if finding == "raises" else last["host_ops"] == ["aten::sin"])
