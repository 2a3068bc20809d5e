"""Sandbox children forked by the fork server: the same sandbox as a new interpreter's (environment,
folder, session, descriptors, limits), every runtime cheat rejected the same way, and a server that
fails or goes leaves the job to a new interpreter."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from pathlib import Path

import pytest
import torch

from gpuyantra.verifier import fork_server, isolation, run_verification
from gpuyantra.verifier import sandbox as sandbox_module
from tests.verifier.conftest import HEADER, HONEST_ENTRY, candidate_path, rules_of

QUICK = {"seeds": (0,), "dtypes": ["float32"]}

pytestmark = pytest.mark.skipif(not fork_server.enabled(), reason="no pidfd_open or send_fds here")


@pytest.fixture
def forking(state):
    """A running fork server for CPU children; stopped afterwards."""
    sandbox_module.start_fork_server("cpu")
    yield fork_server.running("cpu")
    fork_server.close_all()


# Written at import in the child: what its sandbox looks like from inside.
PROBE = """
import json as _json
import os as _os
import resource as _resource
import tempfile as _tempfile

from triton import knobs as _knobs

_home = _os.environ.get("HOME", "")
_workdir = _os.path.dirname(_home)


def _rel(path):
    return str(path).replace(_workdir, "<workdir>")


with open({out!r}, "w") as _fh:
    _json.dump(
        {{
            "cwd": _rel(_os.getcwd()),
            "env": {{k: _rel(v) for k, v in sorted(_os.environ.items()) if k != "PYTHONPATH"}},
            "tempdir": _rel(_tempfile.gettempdir()),
            "triton_cache": _rel(_knobs.cache.dir),
            "own_session": _os.getsid(0) == _os.getpid(),
            "descriptors": sorted(int(fd) for fd in _os.listdir("/proc/self/fd")),
            "niceness": _os.getpriority(_os.PRIO_PROCESS, 0),
            "cpu_limit": _resource.getrlimit(_resource.RLIMIT_CPU)[0],
            "threads": torch.get_num_threads(),
        }},
        _fh,
    )
"""


def _probe(tmp_path: Path, name: str) -> tuple[dict, dict]:
    out = tmp_path / f"{name}.json"
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER + PROBE.format(out=str(out)) + HONEST_ENTRY)
    verdict = run_verification(path, device="cpu", skip_static=True, **QUICK)
    assert verdict.failures == [], verdict.failures
    return json.loads(out.read_text()), verdict.timings


@pytest.fixture
def probe_folder_writable(tmp_path, monkeypatch):
    """The child writes only beneath its own folder (its isolation): here also the probe's."""
    policy = isolation.policy

    def with_probe_folder(*args, **kwargs):
        chosen = policy(*args, **kwargs)
        return {**chosen, "write": [*chosen.get("write", []), str(tmp_path)]}

    monkeypatch.setattr(isolation, "policy", with_probe_folder)


def test_a_forked_child_sees_the_sandbox_a_new_interpreter_sees(
    state, tmp_path, monkeypatch, probe_folder_writable, no_fork_server
):
    monkeypatch.setenv("GPUYANTRA_TEST_SECRET_TOKEN", "do-not-leak")
    execed, exec_timings = _probe(tmp_path, "exec")
    sandbox_module.start_fork_server("cpu")
    try:
        forked, fork_timings = _probe(tmp_path, "fork")
    finally:
        fork_server.close_all()
    assert (exec_timings["sandbox_child_started_by"], fork_timings["sandbox_child_started_by"]) == ("exec", "fork")
    # Descriptor numbers differ (an interpreter's start left holes the fork's harness fills): counts do not.
    assert len(forked.pop("descriptors")) == len(execed.pop("descriptors"))
    assert forked == execed
    assert forked["cwd"] == "<workdir>" and forked["tempdir"] == "<workdir>" and forked["own_session"]
    assert forked["triton_cache"] == "<workdir>/triton-cache"
    assert not any("SECRET" in key for key in forked["env"])


FORKED_CHEATS = [
    ("cheat_fork", {"skip_static": True}, ("sandbox", "forked-process")),
    ("cheat_exit_fake_reward", {"skip_static": True}, ("sandbox", "early-exit")),
    ("cheat_wild_pointer", {}, ("sandbox", "crash")),
    ("cheat_hang", {"timeout": 6}, ("sandbox", "timeout")),
    ("cheat_hang", {"timeout": 120, "cpu_seconds": 6}, ("sandbox", "cpu-limit")),
    ("cheat_memory_hog", {"memory_limit": 2**30}, ("sandbox", "memory-limit")),
    ("cheat_import_error", {}, ("sandbox", "import-failed")),
]


@pytest.mark.parametrize("name,knobs,expected", FORKED_CHEATS, ids=[f"{n}-{e[1]}" for n, _, e in FORKED_CHEATS])
def test_a_forked_child_rejects_runtime_cheats_alike(forking, name, knobs, expected):
    verdict = run_verification(candidate_path(name), device="cpu", **{**QUICK, **knobs})
    assert expected in rules_of(verdict), verdict.failures
    assert verdict.timings["sandbox_child_started_by"] == "fork"
    assert not verdict.accepted and verdict.reward == -1


def test_spares_are_forked_and_ready_for_the_next_verification(forking):
    sandbox_module.keep_spare("cpu")
    ((spare,),) = sandbox_module._SPARES.values()
    assert spare.forked and spare.proc.started()
    verdict = run_verification(candidate_path("honest_rowwise"), device="cpu", keep_warm=True, **QUICK)
    assert verdict.accepted and verdict.timings["sandbox_child_started_by"] == "fork"
    # It ran that verification and exits: the verdict is taken once its results are written, and its
    # exit is seen by a reaper thread (a moment later on a loaded machine), so wait for it, bounded.
    assert spare.proc.wait(timeout=60) == 0


def test_a_spare_closed_before_its_fork_exits_by_itself(forking):
    box = sandbox_module.Sandbox("cpu")
    box.start()
    proc = box.proc
    box.close()  # the server may still be importing: its stdin ends, nothing waits for the fork
    assert proc.started()
    proc.wait(timeout=120)  # an empty job, or its folder gone: either way it exits
    assert sandbox_module._session_members(proc.pid) == []


def test_a_fork_that_fails_falls_back_to_a_new_interpreter(forking, monkeypatch):
    def refuse(self, argv, env, cwd, stdout, stderr, notify):
        child = fork_server.ForkedChild(open(os.devnull, "wb"))
        child._on_failure("refused for the test", -signal.SIGKILL)
        return child

    monkeypatch.setattr(fork_server.ForkServer, "spawn", refuse)
    verdict = run_verification(candidate_path("honest_rowwise"), device="cpu", **QUICK)
    assert verdict.accepted and verdict.timings["sandbox_child_started_by"] == "exec"


def test_a_server_gone_leaves_children_to_new_interpreters(forking):
    forking.proc.send_signal(signal.SIGKILL)
    forking.proc.wait()
    assert fork_server.running("cpu") is None
    verdict = run_verification(candidate_path("cheat_ignores_weight"), device="cpu", **QUICK)
    assert ("correctness", "wrong-values") in rules_of(verdict)
    assert verdict.timings["sandbox_child_started_by"] == "exec"


def test_a_server_answers_a_bad_request_with_an_error_not_a_fork(forking):
    message = json.dumps({"token": 999, "argv": [], "env": {}, "cwd": "/"}).encode()
    child = fork_server.ForkedChild(None)
    with forking._lock:
        forking._children[999] = child
    with open(os.devnull, "rb") as one:
        socket.send_fds(forking._sock, [message], [one.fileno()])  # one descriptor, not four
    assert not child.started(timeout=120)
    assert "4 descriptors" in (child.error or "")
    assert forking.alive()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_forked_cuda_spares_verify_with_their_own_context(state):
    """The server never initializes CUDA; each forked spare creates its context, outputs come by CUDA
    IPC, and a second verification takes the next spare."""
    sandbox_module.set_spare_count(2)
    try:
        sandbox_module.keep_spare("cuda")
        for _ in range(2):
            verdict = run_verification(
                candidate_path("honest_rowwise"), device="cuda", keep_warm=True, seeds=(0,), dtypes=["float16"]
            )
            assert verdict.accepted and rules_of(verdict) == set(), verdict.failures
            assert verdict.timings["sandbox_child_started_by"] == "fork"
            assert verdict.timings.get("outputs_transport") == "cuda_ipc"
    finally:
        sandbox_module.set_spare_count(1)


def test_the_server_forks_no_child_once_the_cuda_driver_is_started(monkeypatch):
    monkeypatch.setattr(fork_server, "_driver_initialized", lambda: True)
    parent, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    worker = threading.Thread(target=fork_server.serve, args=(server_end, "cuda"), daemon=True)
    worker.start()
    with open(os.devnull, "rb") as null:
        fds = [null.fileno()] * 4
        message = json.dumps({"token": 1, "argv": [], "env": {}, "cwd": "/"}).encode()
        socket.send_fds(parent, [message], fds)
        answer = json.loads(parent.recv(fork_server.MAX_MESSAGE))
    assert answer["token"] == 1 and "CUDA driver" in answer["error"] and "pid" not in answer
    parent.close()  # the server leaves when its parent's end closes
    worker.join(30)
    assert not worker.is_alive()


def test_a_spare_whose_server_died_still_gives_its_verdict(forking):
    sandbox_module.keep_spare("cpu")
    ((spare,),) = sandbox_module._SPARES.values()
    assert spare.proc.started()
    forking.proc.send_signal(signal.SIGKILL)  # the spare lives on in its own session
    forking.proc.wait()
    verdict = run_verification(candidate_path("honest_rowwise"), device="cpu", keep_warm=False, **QUICK)
    assert verdict.accepted and verdict.timings["sandbox_child_started_by"] == "fork", verdict.failures
    assert spare.proc.wait(timeout=60) == fork_server.STATUS_LOST  # its exit seen, its status nobody's
