"""What a sandbox child does before its job: only what every job needs, unless it has time to spare."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from gpuyantra.verifier import child
from gpuyantra.verifier.bench import float32_as_float32


def test_float32_settings_leave_the_compiler_unimported():
    """A job whose compiled baselines are cached never compiles: setting float32 products must not
    import torch._inductor (seconds on a GPU host) on the way."""
    code = (
        "import sys, torch\n"
        "from gpuyantra.verifier.bench import float32_as_float32\n"
        "before = 'torch._inductor' in sys.modules\n"
        "float32_as_float32()\n"
        "print(before, 'torch._inductor' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "False"]


def test_float32_settings_still_turn_deterministic_algorithms_off():
    torch.use_deterministic_algorithms(True)
    try:
        float32_as_float32()
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.use_deterministic_algorithms(False)


def test_a_job_waiting_on_stdin_is_seen_without_reading_it(monkeypatch):
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd) as reader:
        monkeypatch.setattr(sys, "stdin", reader)
        assert child._job_waiting() is False  # nothing written: a spare, or a parent still checking
        os.write(write_fd, b'{"job": 1}')
        assert child._job_waiting() is True
        assert child._job_waiting() is True  # only looked at: the job is still there to read
        os.close(write_fd)
        assert reader.read() == '{"job": 1}'


def test_a_closed_stdin_counts_as_waiting(monkeypatch):
    """The parent closes stdin when it rejected the candidate before running it: nothing to warm for."""
    read_fd, write_fd = os.pipe()
    os.close(write_fd)
    with os.fdopen(read_fd) as reader:
        monkeypatch.setattr(sys, "stdin", reader)
        assert child._job_waiting() is True
