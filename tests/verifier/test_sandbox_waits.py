"""The sandbox's waits block instead of polling: the exit watch on a pidfd, the output reader on the
pipe the child writes a byte to per chunk (`sandbox._ExitWatch`, `OutputReader._await_chunk`)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from gpuyantra.verifier import sandbox as sandbox_module
from gpuyantra.verifier.child import OutputSink, chunk_name
from gpuyantra.verifier.sandbox import OutputReader, _ExitWatch

BUDGET = 2**20


def _sleeper(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


@pytest.mark.parametrize("pidfd", [True, False])
def test_the_exit_watch_says_when_the_child_is_gone(monkeypatch, pidfd):
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)  # where there is none: Popen.wait
    proc = _sleeper(30)
    watch = _ExitWatch(proc)
    assert (watch.pidfd is not None) == (pidfd and hasattr(os, "pidfd_open") and sys.platform == "linux")
    try:
        assert not watch.exited(0.05)
        proc.kill()
        assert watch.exited(60)
    finally:
        watch.close()
        proc.wait()
    assert watch.pidfd is None and proc.returncode is not None


class _CountingEvent(threading.Event):
    """The reader's stop event, counting the timed waits it makes (its polls)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def _reader(tmp_path, notify_fd: int | None) -> tuple[OutputReader, list[dict], _CountingEvent]:
    got: list[dict] = []
    reader = OutputReader(tmp_path, BUDGET, got.append, notify_fd=notify_fd)
    reader._done = _CountingEvent()
    return reader, got, reader._done


def test_the_reader_sleeps_until_the_child_writes_a_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_module, "READ_IDLE_SECONDS", 60.0)  # only a notification wakes it
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    reader, got, done = _reader(tmp_path, read_end)
    sink = OutputSink(str(tmp_path), BUDGET, notify_fd=write_end)
    reader.start()
    try:
        sink.add(0, [(0, torch.ones(3))])
        sink.flush()  # writes chunk 0 and a byte into the pipe
        sink._wait(lambda count, unread: count == 0)  # read and deleted by the reader
        assert [list(chunk) for chunk in got] == [["0:0"]]
        polls = done.waits
        os.close(write_end)  # the child gone: the end of the pipe wakes the reader, which polls from then on
        sink._wait(lambda count, unread: reader.notify_fd is None)
    finally:
        reader.finish()
        os.close(read_end)
    assert polls <= 2  # no poll every READ_POLL_SECONDS while it waited for the chunk


def test_reading_ends_at_once_when_the_child_is_still_there(tmp_path, monkeypatch):
    # A finished child is not waited for (its exit is reaped later): its pipe is still open, and the
    # reader, asleep on it, is woken by `finish` instead of its end.
    monkeypatch.setattr(sandbox_module, "READ_IDLE_SECONDS", 60.0)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    reader, _, _ = _reader(tmp_path, read_end)
    reader.start()
    try:
        reader._woken_at = 0.0
        finisher = threading.Thread(target=reader.finish)
        finisher.start()
        finisher.join(30)  # far below the reader's 60 s sleep
        assert not finisher.is_alive() and not reader.is_alive()
    finally:
        os.close(write_end)
        os.close(read_end)


def test_a_stream_of_bytes_in_the_pipe_wakes_the_reader_no_more_often_than_polling(tmp_path, monkeypatch):
    # The candidate runs in the child and may write to the pipe as fast as it can: each wake after the
    # first waits out the rest of READ_POLL_SECONDS since the previous one.
    monkeypatch.setattr(sandbox_module, "READ_POLL_SECONDS", 0.5)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    reader, _, done = _reader(tmp_path, read_end)
    try:
        for _ in range(4):  # the pipe refilled before each wake
            os.write(write_end, b"x" * 4096)
            reader._await_chunk()
    finally:
        os.close(write_end)
        os.close(read_end)
    assert done.waits == 3


def _pipe_fds(inode_of: int) -> list[int]:
    """This process's descriptors on the pipe that `inode_of` is an end of."""
    target = os.readlink(f"/proc/self/fd/{inode_of}")
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == target:
                fds.append(int(name))
        except OSError:
            continue
    return fds


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
def test_a_sandbox_hands_its_child_the_write_end_only(tmp_path):
    box = sandbox_module.Sandbox("cpu")
    try:
        box.start(fork=False)  # a new interpreter: its argv is the Popen's
        assert box.notify_fd is not None and box.proc is not None
        assert "--notify-fd" in box.proc.args
        assert _pipe_fds(box.notify_fd) == [box.notify_fd]  # the child holds the only write end
    finally:
        box.close()
    assert box.notify_fd is None


def test_the_child_notifies_after_each_chunk_and_never_blocks_on_a_full_pipe(tmp_path):
    read_end, write_end = os.pipe()
    sink = OutputSink(str(tmp_path), BUDGET, notify_fd=write_end)
    sink.add(0, [(0, torch.ones(2))])
    sink.flush()
    assert os.read(read_end, 100) == b"\n"  # one byte per chunk
    while True:  # fill the pipe: the sink's writes must not block (it made its end non-blocking)
        try:
            os.write(write_end, b"x" * 4096)
        except BlockingIOError:
            break
    for k in range(1, 3):
        sink.add(k, [(0, torch.ones(2))])
        sink.flush()
    assert sorted(os.listdir(tmp_path)) == [chunk_name(k) for k in range(3)]
    os.close(write_end)
    os.close(read_end)
