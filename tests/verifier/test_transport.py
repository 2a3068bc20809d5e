"""How outputs travel from the child to the parent (`gpuyantra.verifier.transport`): each chunk names
its transport and the parent dispatches on it; `host` chunks carry the tensors (CPU runs, and CUDA
runs where CUDA IPC failed, with the reason); `cuda_ipc` chunks carry only validated descriptions of
GPU clones the child keeps alive until the parent has copied them. A chunk the parent cannot map
comes again by the host; an entry that fails validation is refused with a message naming the field.

Real CUDA IPC needs a GPU: the protocol around it (hold, acknowledge, nack, resend, budget) is run
here with a stand-in for the export and the import; the GPU tests at the end run the real thing."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuyantra.verifier import run_verification
from gpuyantra.verifier import sandbox as sandbox_module
from gpuyantra.verifier.child import OutputSink, chunk_name
from gpuyantra.verifier.core import record_transport
from gpuyantra.verifier.sandbox import OutputReader, SandboxOutcome
from gpuyantra.verifier.transport import (
    CUDA_IPC,
    HOST,
    IPC_HANDLE_BYTES,
    PACK_ALIGN,
    choose_transport,
    describe_packed,
    host_chunk,
    ipc_chunk,
    pack_outputs,
    storage_key,
    storages,
    validate_chunk,
    validate_entry,
)
from tests.verifier.conftest import candidate_path, rules_of

QUICK = {"seeds": (0,), "dtypes": ["float32"]}
CHILD_PID = 4321
BUDGET = 2**20


# --- the choice ---------------------------------------------------------------------------------


def test_cpu_outputs_go_by_the_host_without_trying_an_export():
    def export() -> dict:
        raise AssertionError("no export on the CPU")

    assert choose_transport("cpu", export) == (HOST, None, None)


def test_cuda_outputs_go_by_cuda_ipc_where_the_export_works():
    assert choose_transport("cuda", lambda: {"0:0": {"handle": b"x"}}) == (CUDA_IPC, {"0:0": {"handle": b"x"}}, None)


def test_a_failed_export_falls_back_to_the_host_with_a_one_line_reason():
    def export() -> dict:
        raise RuntimeError("no IPC\nhere:   driver says no")

    chosen, exported, reason = choose_transport("cuda", export)
    assert (chosen, exported) == (HOST, None)
    assert reason == "cuda_ipc export failed: RuntimeError: no IPC here: driver says no"


# --- the chunk format, end to end through a real child (CPU: host) ------------------------------


def test_a_cpu_verification_hands_its_outputs_over_by_the_host(state):
    verdict = run_verification(candidate_path("honest_rowwise"), device="cpu", **QUICK)
    assert verdict.accepted and rules_of(verdict) == set(), verdict.failures
    assert verdict.timings["outputs_transport"] == HOST
    assert "outputs_fallback" not in verdict.timings  # nothing fell back: the CPU has only the host


def test_the_reader_dispatches_on_the_transport(tmp_path):
    got: list[dict] = []
    reader = OutputReader(tmp_path, BUDGET, got.append)
    torch.save(host_chunk({"0:0": torch.ones(2)}), tmp_path / chunk_name(0))
    torch.save(host_chunk({"1:0": torch.zeros(2)}, "cuda_ipc export failed: X: y"), tmp_path / chunk_name(1))
    torch.save({"transport": "carrier-pigeon", "outputs": {"2:0": torch.ones(1)}}, tmp_path / chunk_name(2))
    torch.save({"3:0": torch.ones(1)}, tmp_path / chunk_name(3))  # no transport named: not a chunk
    torch.save(host_chunk({"4:0": torch.ones(3)}), tmp_path / chunk_name(4))
    reader.read_ready()
    assert [list(chunk) for chunk in got] == [["0:0"], ["1:0"], ["4:0"]]
    assert reader.transports == {HOST: 3}
    assert reader.fallback == "cuda_ipc export failed: X: y"
    assert reader.error is not None and "chunk-000002.pt" in reader.error and "'carrier-pigeon'" in reader.error
    assert not list(tmp_path.iterdir())


def test_a_cuda_ipc_chunk_read_on_the_cpu_is_refused_and_asked_again_by_the_host(tmp_path):
    reader = OutputReader(tmp_path, BUDGET, lambda chunk: pytest.fail("nothing to judge"), child_pid=CHILD_PID)
    torch.save(ipc_chunk({"0:0": good_entry()}), tmp_path / chunk_name(0))
    reader.read_ready()
    assert reader.error is None and reader.transports == {}
    assert reader.fallback == "cuda_ipc import failed: ValueError: outputs are judged on cpu, not on a CUDA device"
    assert [p.name for p in tmp_path.iterdir()] == ["nack-000000"]  # the chunk is gone, its nack stays


def test_record_transport_names_what_was_used_and_why_it_fell_back():
    timings: dict[str, Any] = {"sandbox": 1.0}
    record_transport(timings, SandboxOutcome(transports={HOST: 2, CUDA_IPC: 5}, transport_fallback="why"))
    assert timings == {"sandbox": 1.0, "outputs_transport": "cuda_ipc+host", "outputs_fallback": "why"}
    timings = {}
    record_transport(timings, SandboxOutcome())
    assert timings == {}  # no chunk judged: nothing to name


def test_the_shared_memory_files_of_a_child_that_is_gone_are_removed(tmp_path, monkeypatch):
    # The child leaves without the interpreter's teardown: its reference-counter files would stay.
    monkeypatch.setattr(sandbox_module, "SHARED_MEMORY", tmp_path)
    for name in ("torch_123_98765_0", "torch_123_4", "torch_1234_5_6", "torch_99_1_2", "other_123_1"):
        (tmp_path / name).write_bytes(b"")
    sandbox_module.remove_shared_memory(123)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other_123_1", "torch_1234_5_6", "torch_99_1_2"]


# --- a cuda_ipc chunk on disk: plain data that loads under weights_only -------------------------


class FakeSharedBuffer:
    """What `_share_cuda_` of a chunk's buffer returns, with the Python types torch's gives (bytes for
    the handle, the reference counter and the event), for a buffer the test keeps on the CPU."""

    def __init__(self, nbytes: int) -> None:
        self.handle = b"\x02c" + bytes([7]) * 64
        self.ref_counter = f"/torch_{os.getpid()}_98765_7".encode()
        self.shared = (0, self.handle, nbytes, 512, self.ref_counter, 3, bytes(64), False)


def test_a_chunks_outputs_are_packed_into_one_aligned_buffer():
    outputs = {
        "4:0": torch.arange(1000, dtype=torch.float32),
        "4:1": torch.full((7, 9), 3.0, dtype=torch.bfloat16).t(),
        "4:2": torch.ones(0, 5),
        "5:0": torch.tensor([True, False, True]),
    }
    buffer, views = pack_outputs(outputs)
    assert buffer.dtype == torch.uint8 and buffer.numel() == 4096 + 256 + 0 + 256
    for key, t in outputs.items():
        view = views[key]
        assert view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        assert view.is_contiguous() and view.dtype == t.dtype and torch.equal(view, t)
        assert (view.storage_offset() * view.element_size()) % PACK_ALIGN == 0
    assert [views[k].storage_offset() * views[k].element_size() for k in outputs] == [0, 4096, 4352, 4352]
    with pytest.raises(ValueError, match="outputs on 2 devices do not share one buffer"):
        pack_outputs({"0:0": torch.ones(2), "0:1": torch.ones(2, device="meta")})


def test_every_entry_of_a_chunk_names_its_one_buffer():
    buffer, views = pack_outputs({"4:0": torch.arange(10.0), "4:1": torch.ones(3, 2, dtype=torch.float16)})
    fake = FakeSharedBuffer(buffer.numel())
    entries = describe_packed(views, fake.shared)
    assert {e["handle"] for e in entries.values()} == {fake.handle.hex()}
    assert {(e["storage_bytes"], e["storage_offset_bytes"], e["ref_counter_offset"]) for e in entries.values()} == {
        (buffer.numel(), 512, 3)
    }
    assert entries["4:1"]["offset"] == 256 // 2 and entries["4:1"]["stride"] == [2, 1]
    validated = validate_chunk(entries, 0, BUDGET, os.getpid())
    assert len(storages(validated.values())) == 1  # mapped, and counted against the budget, once
    with pytest.raises(ValueError, match="dtype complex64 does not travel by cuda_ipc"):
        describe_packed({"0:0": torch.ones(2, dtype=torch.complex64)}, fake.shared)


def test_a_cuda_ipc_chunk_is_json_and_validates(tmp_path):
    """The chunk the GPU test's child writes (an empty output among them), through the real packing,
    the child's real write and the parent's real load and validation."""
    shared: list[FakeSharedBuffer] = []

    def export(outputs: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        buffer, views = pack_outputs(outputs)
        shared.append(FakeSharedBuffer(buffer.numel()))
        return describe_packed(views, shared[-1].shared), views

    sink = OutputSink(str(tmp_path), BUDGET, chunk_per_group=True, cuda_ipc=True)
    sink.export = export
    outs = [
        (0, torch.arange(1000, dtype=torch.float32)),
        (1, torch.full((7, 9), 3.0, dtype=torch.bfloat16).t()),
        (2, torch.ones(0, 5)),
    ]
    assert sink.add(4, outs) is None
    sink.end_group()
    assert sink.cuda_ipc and list(sink.held) == [0]

    # Descriptions only: plain JSON, which the parent parses without running anything.
    written = json.loads((tmp_path / chunk_name(0)).read_text())
    assert written["transport"] == CUDA_IPC and sorted(written["outputs"]) == ["4:0", "4:1", "4:2"]

    validated: dict[str, Any] = {}

    def receive(entries: Any) -> dict[str, torch.Tensor]:
        validated.update(validate_chunk(entries, 0, BUDGET, os.getpid()))
        return {key: torch.empty(e.shape, dtype=getattr(torch, e.dtype)) for key, e in validated.items()}

    got: dict[str, torch.Tensor] = {}
    reader = OutputReader(tmp_path, BUDGET, got.update, device="cuda", child_pid=os.getpid())
    reader._import = receive  # type: ignore[method-assign]
    reader.read_ready()
    assert reader.error is None and reader.fallback is None, (reader.error, reader.fallback)
    assert reader.transports == {CUDA_IPC: 1}
    first, second, empty = (validated[f"4:{j}"] for j in range(3))
    assert (first.dtype, first.shape, first.storage_bytes, first.offset) == ("float32", (1000,), 4096 + 256, 0)
    assert first.handle == shared[0].handle and first.storage_offset_bytes == 512
    assert first.ref_counter == shared[0].ref_counter and first.ref_counter_offset == 3
    assert (second.dtype, second.shape, second.stride, second.offset) == ("bfloat16", (9, 7), (7, 1), 4096 // 2)
    assert storage_key(second) == storage_key(first)  # one buffer for the chunk
    assert (empty.shape, empty.storage_bytes, empty.handle, empty.ref_counter) == ((0, 5), 0, b"", b"")
    assert [tuple(got[f"4:{j}"].shape) for j in range(3)] == [(1000,), (9, 7), (0, 5)]
    sink.close()  # the chunk was read: the buffer is released
    assert sink.held == {} and not list(tmp_path.iterdir())


def test_a_json_chunk_that_is_not_data_or_too_large_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_module, "MAX_JSON_CHUNK_BYTES", 1000)
    reader = OutputReader(tmp_path, BUDGET, lambda chunk: pytest.fail("nothing to judge"), child_pid=CHILD_PID)
    (tmp_path / chunk_name(0)).write_text('{"transport": "cuda_ipc", "outputs": ' + "[" * 100)
    reader.read_ready()
    assert reader.error is not None and reader.error.startswith("cannot read the saved outputs (chunk-000000.pt)")
    reader.error = None
    (tmp_path / chunk_name(1)).write_text(json.dumps(ipc_chunk({f"{i}:0": good_entry() for i in range(10)})))
    reader.read_ready()
    assert reader.error is not None and "holds descriptions past 1000 bytes" in reader.error
    assert not list(tmp_path.iterdir())


def test_a_chunk_refused_by_weights_only_is_an_error_naming_the_unpicklers_reason(tmp_path):
    reader = OutputReader(tmp_path, BUDGET, lambda chunk: pytest.fail("nothing to judge"), child_pid=CHILD_PID)
    torch.save(ipc_chunk({"0:0": good_entry(shape=[0, 4], handle=b"", storage_bytes=0)}), tmp_path / chunk_name(0))
    reader.read_ready()
    assert reader.error is not None and "\n" not in reader.error and "\x1b" not in reader.error
    assert reader.error.startswith(
        "cannot read the saved outputs (chunk-000000.pt): UnpicklingError: weights_only load refused it: "
        "Unsupported global: GLOBAL bytes was not an allowed global by default."
    ), reader.error
    assert not list(tmp_path.iterdir())


# --- the protocol, with a stand-in for CUDA IPC -------------------------------------------------


class FakeIpc:
    """Export: the entry is a token; import: the token's clone, cloned again (as the parent copies).
    Clones are tracked by weak reference, so a test sees when the child released them."""

    def __init__(self, fail_import: bool = False) -> None:
        self.clones: dict[int, weakref.ref] = {}
        self.fail_import = fail_import
        self.imports = 0

    def export(self, outputs: dict[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        entries = {}
        for key, t in outputs.items():
            self.clones[len(self.clones)] = weakref.ref(t)
            entries[key] = {"token": len(self.clones) - 1}
        return entries, dict(outputs)

    def receive(self, entries: dict[str, Any]) -> dict[str, torch.Tensor]:
        self.imports += 1
        if self.fail_import:
            raise RuntimeError("cannot map")
        clones = {key: self.clones[entry["token"]]() for key, entry in entries.items()}
        assert all(c is not None for c in clones.values()), "the child released a clone before it was read"
        return {key: c.clone() for key, c in clones.items()}


def ipc_pair(tmp_path: Path, fake: FakeIpc, budget: int, consume) -> tuple[OutputSink, OutputReader]:
    """A sink that exports (CPU tensors, with the fake) and a reader that imports (with the fake)."""
    sink = OutputSink(str(tmp_path), budget, chunk_per_group=True, cuda_ipc=True)
    sink.export = fake.export
    reader = OutputReader(tmp_path, budget, consume, device="cuda", child_pid=CHILD_PID)
    reader._import = fake.receive  # type: ignore[method-assign]
    return sink, reader


def _outputs(case_id: int, nbytes: int) -> list[tuple[int, torch.Tensor]]:
    return [(0, torch.full((nbytes // 4,), float(case_id)))]


def test_clones_are_held_until_read_and_count_against_the_budget(tmp_path):
    budget = 64 * 1024
    fake = FakeIpc()
    seen: list[str] = []
    most_held = [0]

    def consume(chunk: dict) -> None:
        most_held[0] = max(most_held[0], sum(nbytes for nbytes, _ in list(sink.held.values())))
        for key, tensor in chunk.items():
            assert float(tensor[0]) == float(key.split(":")[0])
        seen.extend(chunk)
        time.sleep(0.02)  # a slow judge: the child must wait for room though its chunk files are tiny

    sink, reader = ipc_pair(tmp_path, fake, budget, consume)
    reader.start()
    for case_id in range(40):
        assert sink.add(case_id, _outputs(case_id, 6 * 1024)) is None
        if case_id % 3 == 2:
            sink.end_group()
    sink.close()
    reader.finish()
    assert seen == [f"{i}:0" for i in range(40)] and reader.error is None and reader.fallback is None
    assert reader.transports == {CUDA_IPC: sink.written} and sink.written > 4
    assert sink.held == {} and sink.wait_seconds > 0
    assert 0 < most_held[0] <= budget
    assert all(ref() is None for ref in fake.clones.values())  # released once read
    assert not list(tmp_path.iterdir())


class _RecordingStream:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def synchronize(self) -> None:
        self.events.append("synchronize")


def test_a_chunk_goes_only_once_judged_and_its_mapping_once_the_copies_are_complete(tmp_path, monkeypatch):
    # The child's wait for its chunks to go (`drain`) must end with the parent's GPU work on them:
    # the child times next, alone on the GPU. The copies are only queued on import; the judging's own
    # wait covers them, and the mapping of the child's memory is released after that.
    events: list[str] = []
    fake = FakeIpc()
    stream = _RecordingStream(events)

    def receive(entries: dict[str, Any]) -> dict[str, torch.Tensor]:
        reader._stream = stream
        reader._mapped.append("mapping")
        return fake.receive(entries)

    @contextlib.contextmanager
    def on_stream(where: Any) -> Any:
        events.append("judged on the copies' stream" if where is stream else "elsewhere")
        yield

    def consume(chunk: dict) -> None:
        assert (tmp_path / chunk_name(0)).exists() and reader._mapped == ["mapping"]
        events.append("consume")

    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    sink, reader = ipc_pair(tmp_path, fake, BUDGET, consume)
    reader._import = receive  # type: ignore[method-assign]
    sink.add(0, _outputs(0, 64))
    sink.end_group()
    reader.read_ready()
    assert reader.error is None, reader.error
    assert events == ["judged on the copies' stream", "consume", "synchronize"]
    assert reader._mapped == [] and not (tmp_path / chunk_name(0)).exists()


def test_a_chunk_the_parent_cannot_map_comes_again_by_the_host(tmp_path):
    fake = FakeIpc(fail_import=True)
    seen: list[str] = []
    sink, reader = ipc_pair(tmp_path, fake, BUDGET, lambda chunk: seen.extend(chunk))
    reader.start()
    for case_id in range(6):
        sink.add(case_id, _outputs(case_id, 64))
        if case_id % 2 == 1:
            sink.end_group()
        if case_id == 1:
            sink.drain()  # the nack seen, the outputs sent again and read
            assert not sink.cuda_ipc and seen == ["0:0", "1:0"]
    sink.close()
    reader.finish()
    assert sorted(seen, key=lambda k: int(k.split(":")[0])) == [f"{i}:0" for i in range(6)]
    assert fake.imports == 1 and not sink.cuda_ipc  # the first failure: everything after goes by the host
    assert reader.transports == {HOST: 3} and reader.error is None
    assert reader.fallback == "cuda_ipc import failed: RuntimeError: cannot map"
    assert not list(tmp_path.iterdir())  # the nack was taken back by the child


def test_a_failed_export_sends_the_chunk_by_the_host_with_the_reason(tmp_path):
    seen: list[str] = []
    reader = OutputReader(tmp_path, BUDGET, lambda chunk: seen.extend(chunk), device="cuda", child_pid=CHILD_PID)
    sink = OutputSink(str(tmp_path), BUDGET, chunk_per_group=True, cuda_ipc=True)

    def export(outputs: dict) -> tuple:
        raise RuntimeError("cudaIpcGetMemHandle failed")

    sink.export = export
    sink.add(0, _outputs(0, 64))
    sink.end_group()
    sink.add(1, _outputs(1, 64))
    sink.end_group()
    reader.read_ready()
    assert seen == ["0:0", "1:0"] and reader.transports == {HOST: 2} and not sink.cuda_ipc
    assert reader.fallback == "cuda_ipc export failed: RuntimeError: cudaIpcGetMemHandle failed"


# --- validation of what the untrusted child wrote -----------------------------------------------


def good_entry(**changes: Any) -> dict[str, Any]:
    entry = {
        "dtype": "float16",
        "shape": [3, 4],
        "stride": [4, 1],
        "offset": 0,
        "device": 0,
        "handle": (b"\x02c" + bytes(64)).hex(),
        "storage_bytes": 3 * 4 * 2,
        "storage_offset_bytes": 512,
        "ref_counter": f"/torch_{CHILD_PID}_123456_7".encode().hex(),
        "ref_counter_offset": 3,
    }
    entry.update(changes)
    return entry


def test_a_good_entry_passes():
    entry = validate_entry("5:0", good_entry(), 0, BUDGET, CHILD_PID)
    assert entry.shape == (3, 4) and entry.stride == (4, 1) and len(entry.handle) == IPC_HANDLE_BYTES
    assert entry.handle == b"\x02c" + bytes(64) and entry.ref_counter == f"/torch_{CHILD_PID}_123456_7".encode()
    empty = good_entry(shape=[0, 4], handle="", storage_bytes=0, ref_counter="")
    assert validate_entry("6:0", empty, 0, BUDGET, CHILD_PID).storage_bytes == 0
    older = good_entry(ref_counter=f"/torch_{CHILD_PID}_9".encode().hex())  # torch's older counter names
    assert validate_entry("7:0", older, 0, BUDGET, CHILD_PID).ref_counter_offset == 3


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"dtype": "complex64"}, "dtype 'complex64' is not one of"),
        ({"dtype": torch.float16}, "dtype torch.float16 is not one of"),
        ({"shape": [3, -4]}, "shape[1] -4 is outside"),
        ({"shape": [3, True]}, "shape[1] is a bool, not an int"),
        ({"shape": "3x4"}, "shape must be a list of at most"),
        ({"stride": [4]}, "1 strides for 2 dims"),
        ({"device": 1}, "device 1, but outputs are judged on cuda:0"),
        ({"shape": [1024, 1024], "stride": [1024, 1]}, "2097152 bytes, past the output budget of 1048576"),
        ({"storage_bytes": 2**21}, "storage_bytes 2097152 is outside [0, 1048576]"),
        ({"offset": 1}, "the view reaches past its storage of 24 bytes"),
        ({"stride": [5, 1]}, "the view reaches past its storage"),
        ({"storage_offset_bytes": 513}, "storage_offset_bytes 513 is not 2-aligned"),
        ({"handle": bytes(64).hex()}, "handle is not the 66-byte handle of a cudaMalloc block"),
        ({"handle": (b"\x02e" + bytes(64)).hex()}, "handle is not the 66-byte handle of a cudaMalloc block"),
        ({"handle": b"\x02c" + bytes(64)}, "handle must be lowercase hex of at most 66 bytes"),
        ({"handle": "c" * 66}, "handle is not the 66-byte handle of a cudaMalloc block"),
        ({"handle": "02" * 67}, "handle must be lowercase hex of at most 66 bytes"),
        ({"handle": "0G" + "00" * 65}, "handle must be lowercase hex"),
        ({"handle": "0A" + "00" * 65}, "handle must be lowercase hex"),
        ({"handle": "02 63" + "00" * 64}, "handle must be lowercase hex"),
        ({"handle": "026"}, "handle must be lowercase hex"),
        ({"ref_counter": f"/torch_{CHILD_PID}_1_2".encode()}, "ref_counter must be lowercase hex"),
        ({"ref_counter": "ab" * 257}, "ref_counter must be lowercase hex of at most 256 bytes"),
        ({"ref_counter": b"/torch_1_123_4".hex()}, "is not a counter file of the child"),
        ({"ref_counter": b"/dev/shm/../etc/passwd".hex()}, "is not a counter file of the child"),
        ({"ref_counter_offset": 10000}, "ref_counter_offset 10000 is outside [0, 9999]"),
        ({"shape": [0, 4], "storage_bytes": 0}, "an empty output names memory to map"),
        ({"shape": [0, 4], "handle": "", "storage_bytes": 8}, "an empty output names memory to map"),
        ({"extra": 1}, "fields ['extra'] missing or unexpected"),
    ],
)
def test_bad_entries_are_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError) as refused:
        validate_entry("5:0", good_entry(**changes), 0, BUDGET, CHILD_PID)
    assert str(refused.value).startswith("entry 5:0: ") and message in str(refused.value)


def test_bad_chunks_are_refused():
    with pytest.raises(ValueError, match="entry key 1 is not a string"):
        validate_chunk({1: good_entry()}, 0, BUDGET, CHILD_PID)
    with pytest.raises(ValueError, match="entry 0:0: a list, not a dict"):
        validate_chunk({"0:0": [1, 2]}, 0, BUDGET, CHILD_PID)
    with pytest.raises(ValueError, match="outputs must be a dict"):
        validate_chunk([good_entry()], 0, BUDGET, CHILD_PID)
    with pytest.raises(ValueError, match="no child process"):
        validate_chunk({"0:0": good_entry()}, 0, BUDGET, None)
    many = {
        f"{i}:0": good_entry(shape=[256, 256], stride=[256, 1], storage_bytes=2**17, storage_offset_bytes=2**17 * i)
        for i in range(5)
    }
    with pytest.raises(ValueError, match="the chunk maps 655360 bytes, past the output budget of 524288"):
        validate_chunk(many, 0, BUDGET // 2, CHILD_PID)
    # Views of one storage count it once: five outputs packed in one buffer.
    one = {
        f"{i}:0": good_entry(shape=[64, 256], stride=[256, 1], offset=64 * 256 * i, storage_bytes=5 * 2**15)
        for i in range(5)
    }
    assert len(validate_chunk(one, 0, BUDGET // 2, CHILD_PID)) == 5


# --- CUDA only: the real thing ------------------------------------------------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
def test_cuda_outputs_reach_the_parent_by_cuda_ipc(tmp_path):
    """A separate process hands three outputs over as the child does (one non-contiguous, one
    empty); the parent's copies are its own: the memory the child freed and wrote afterwards, or
    its exit, leave them unchanged."""
    script = textwrap.dedent(
        f"""
        import torch
        from gpuyantra.verifier.child import OutputSink

        sink = OutputSink({str(tmp_path)!r}, 2**24, chunk_per_group=True, cuda_ipc=True)
        outs = [(0, torch.arange(1000, device="cuda", dtype=torch.float32)),
                (1, torch.full((7, 9), 3.0, device="cuda", dtype=torch.bfloat16).t()),
                (2, torch.ones(0, 5, device="cuda"))]
        sink.add(4, outs)
        sink.end_group()
        sink.close()  # until the parent has copied them; then the clones are freed
        junk = [torch.full_like(o, -1) for _, o in outs]  # the clones' blocks again, overwritten
        torch.cuda.synchronize()
        print("written" if sink.cuda_ipc else "fell back", flush=True)
        """
    )
    got: dict[str, torch.Tensor] = {}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    reader = OutputReader(tmp_path, 2**24, got.update, device="cuda", child_pid=proc.pid)
    reader.start()
    out, _ = proc.communicate(timeout=300)
    reader.finish()
    assert reader.error is None and reader.fallback is None, (reader.error, reader.fallback)
    assert reader.transports == {CUDA_IPC: 1} and out.strip() == "written"
    assert torch.equal(got["4:0"], torch.arange(1000, device="cuda", dtype=torch.float32))
    assert got["4:1"].shape == (9, 7) and got["4:1"].dtype == torch.bfloat16 and bool((got["4:1"] == 3).all())
    assert got["4:2"].shape == (0, 5)


@pytest.mark.gpu
@needs_cuda
def test_a_cuda_verification_hands_its_outputs_over_by_cuda_ipc(state):
    verdict = run_verification(
        candidate_path("honest_rowwise"), device="cuda", seeds=(0,), dtypes=["float16"], benchmark=False
    )
    assert verdict.accepted and rules_of(verdict) == set(), verdict.failures
    assert verdict.timings.get("outputs_transport") == CUDA_IPC, verdict.timings.get("outputs_fallback")
    assert "outputs_fallback" not in verdict.timings
    # A cheat is still caught with outputs handed over this way.
    wrong = run_verification(
        candidate_path("cheat_ignores_weight"), device="cuda", seeds=(0,), dtypes=["float16"], benchmark=False
    )
    assert ("correctness", "wrong-values") in rules_of(wrong)
    assert wrong.timings.get("outputs_transport") == CUDA_IPC, wrong.timings.get("outputs_fallback")
