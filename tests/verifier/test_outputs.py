"""Outputs of any total size reach the parent's judgement: the child hands them over in chunks the
parent judges and deletes while the child goes on, never more than the output budget unread; one
call past the budget fails naming it; a damaged chunk is a harness error, never a silent pass.

The limits are lowered here instead of allocating gigabytes: the CPU plan's outputs (about a
megabyte) then exceed the sandbox's file-size limit as a KernelBench batched matmul's 16 GiB
exceed the real one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from gpuyantra.verifier import run_verification
from gpuyantra.verifier import sandbox as sandbox_module
from gpuyantra.verifier.cases import SEEDS
from gpuyantra.verifier.child import OutputSink, chunk_name
from gpuyantra.verifier.sandbox import OutputReader
from gpuyantra.verifier.transport import host_chunk
from tests.verifier.conftest import candidate_path, rules_of

# float32 only: 4 shapes x (5 seeds x 4 scales + 2 x 2 distributions) + 2 stress shapes.
CHECKS = 4 * (len(SEEDS) * 4 + 2 * 2) + 2
PLAN_OUTPUT_BYTES = 4 * (22 * (1000 + 3 * 64 + 67 * 96 + 2 * 3 * 64) + 1031 * 8 + 2 * 16411)
LARGEST_CALL_BYTES = 4 * 2 * 16411  # the [2, 16411] stress call


def test_outputs_past_the_file_size_limit_are_judged(monkeypatch):
    # Before: every output went into one file, cut at the file-size limit, and the parent read a
    # corrupt archive ("cannot read the saved outputs ... failed finding central directory").
    monkeypatch.setenv("GPUYANTRA_PLAN_CLASSES", "0")  # the grid's sizes above, not the classes' wider calls
    limit = PLAN_OUTPUT_BYTES // 3
    assert 2 * LARGEST_CALL_BYTES < limit < PLAN_OUTPUT_BYTES
    monkeypatch.setattr(sandbox_module, "FILE_SIZE_LIMIT", limit)
    verdict = run_verification(candidate_path("honest_rowwise"), device="cpu", dtypes=["float32"])
    assert verdict.accepted, verdict.failures
    assert verdict.checks == CHECKS and rules_of(verdict) == set()


def test_wrong_values_in_a_later_chunk_are_still_found(monkeypatch):
    monkeypatch.setenv("GPUYANTRA_PLAN_CLASSES", "0")  # the grid's sizes above, not the classes' wider calls
    monkeypatch.setattr(sandbox_module, "FILE_SIZE_LIMIT", PLAN_OUTPUT_BYTES // 3)
    verdict = run_verification(candidate_path("cheat_ignores_weight"), device="cpu", dtypes=["float32"])
    assert not verdict.accepted
    assert ("correctness", "wrong-values") in rules_of(verdict)
    assert ("sandbox", "internal-error") not in rules_of(verdict)


def test_one_call_past_the_output_budget_fails_naming_the_limit(monkeypatch):
    monkeypatch.setattr(sandbox_module, "OUTPUT_BUDGET", LARGEST_CALL_BYTES - 1)
    verdict = run_verification(candidate_path("honest_rowwise"), device="cpu", dtypes=["float32"])
    assert rules_of(verdict) == {("sandbox", "output-limit")}
    (failure,) = verdict.failures
    assert "128.2 KiB of outputs" in failure.message and "output budget" in failure.message


def _outputs(case_id: int, nbytes: int) -> list[tuple[int, torch.Tensor]]:
    return [(0, torch.full((nbytes // 4,), float(case_id)))]


def test_the_child_never_leaves_more_than_the_budget_unread(tmp_path):
    budget = 64 * 1024
    seen: list[str] = []
    most_unread = [0]

    def consume(chunk: dict) -> None:
        unread = sum(p.stat().st_size for p in tmp_path.glob("chunk-*.pt"))
        most_unread[0] = max(most_unread[0], unread)
        for key, tensor in chunk.items():
            assert float(tensor[0]) == float(key.split(":")[0])
        seen.extend(chunk)
        time.sleep(0.02)  # a slow judge: the child must wait for room, not run ahead

    reader = OutputReader(tmp_path, budget, consume)
    reader.start()
    sink = OutputSink(str(tmp_path), budget)
    for case_id in range(40):
        assert sink.add(case_id, _outputs(case_id, 6 * 1024)) is None
        if case_id % 7 == 6:
            sink.end_group()
    sink.drain()
    assert not list(tmp_path.glob("chunk-*.pt"))  # drained: everything read and deleted
    reader.finish()
    assert seen == [f"{i}:0" for i in range(40)] and reader.error is None
    assert sink.written > 4 and sink.wait_seconds > 0  # several chunks, and it did wait for room
    assert most_unread[0] <= budget + 4096  # zip headers on top of the tensors


def test_a_call_past_the_budget_is_refused_with_its_size(tmp_path):
    sink = OutputSink(str(tmp_path), 4096)
    refusal = sink.add(7, _outputs(7, 8192))
    assert refusal is not None and "call 7 returned 8.0 KiB" in refusal and "4.0 KiB" in refusal
    sink.drain()
    assert sink.written == 0


def test_a_damaged_chunk_is_a_harness_error_and_reading_goes_on(tmp_path):
    got: list[str] = []
    reader = OutputReader(tmp_path, 2**20, lambda chunk: got.extend(chunk))
    (tmp_path / chunk_name(0)).write_bytes(b"PK\x03\x04 cut short")
    torch.save(host_chunk({"1:0": torch.ones(3)}), tmp_path / chunk_name(1))
    reader.start()
    reader.finish()
    assert reader.error is not None and "cannot read the saved outputs (chunk-000000.pt)" in reader.error
    assert got == ["1:0"] and not list(Path(tmp_path).iterdir())


def test_chunks_are_read_while_the_child_runs(tmp_path):
    reader = OutputReader(tmp_path, 2**20, lambda chunk: None)
    reader.start()
    try:
        torch.save(host_chunk({"0:0": torch.ones(3)}), tmp_path / chunk_name(0))
        deadline = time.monotonic() + 10
        while (tmp_path / chunk_name(0)).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not (tmp_path / chunk_name(0)).exists()  # read before finish() was called
    finally:
        reader.finish()
    assert not reader.is_alive()


@pytest.mark.parametrize("chunk_per_group", [True, False])
def test_groups_become_chunks_only_where_asked(tmp_path, chunk_per_group):
    written: list[int] = []
    reader = OutputReader(tmp_path, 2**20, lambda chunk: written.append(len(chunk)))
    reader.start()
    sink = OutputSink(str(tmp_path), 2**20, chunk_per_group=chunk_per_group)
    for case_id in range(6):
        sink.add(case_id, _outputs(case_id, 64))
        if case_id % 2 == 1:
            sink.end_group()
    sink.drain()
    reader.finish()
    assert written == ([2, 2, 2] if chunk_per_group else [6])


def test_small_groups_share_a_chunk_until_it_holds_the_least_a_group_chunk_may(tmp_path):
    # Each chunk costs the parent a mapping, a copy and a wait for the device: groups of a few KiB
    # (one row, the recheck's) go together; a group that fills the least goes as soon as it ends.
    written: list[list[str]] = []
    reader = OutputReader(tmp_path, 2**20, lambda chunk: written.append(sorted(chunk)))
    sink = OutputSink(str(tmp_path), 2**20, chunk_per_group=True, group_chunk_bytes=1000)
    for case_id, nbytes in enumerate((64, 64, 64, 4000, 64, 64)):
        sink.add(case_id, _outputs(case_id, nbytes))
        sink.end_group()  # one call per group
        reader.read_ready()
    assert written == [["0:0", "1:0", "2:0", "3:0"]]  # the fourth group filled it
    sink.flush()  # the end of the phase (`drain`, `close`)
    reader.read_ready()
    assert written[1:] == [["4:0", "5:0"]]
