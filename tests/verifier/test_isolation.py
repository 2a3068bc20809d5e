"""Only the checked bytes run, and a candidate reaches no secret.

Static: files Python would read differently from the checker (`source-encoding`), and paths that
reach the harness's modules. Loader: the module is compiled from the bytes that were read, whatever
the path holds later. Sandbox: real candidate files that attack the verifier from inside its child
(`candidates/cheat_*`), run with the static layer off so the child's own isolation is what stops
them (`isolation.py`): each fails to import on purpose, with what its probe got as the message, which
keeps the runs short (no cases run).
"""

from __future__ import annotations

import inspect
import os
import re
import secrets
import shutil
import signal
import time
from pathlib import Path

import pytest

from gpuyantra.candidate import CandidateError, encoding_problem, load_candidate
from gpuyantra.verifier import compiler_cache, isolation, run_verification, verify
from gpuyantra.verifier.static import check_source
from tests.verifier.conftest import HEADER, HONEST_ENTRY, candidate_path, rules_of

HONEST = candidate_path("honest_rowwise").read_bytes()
FAST = {"seeds": (0,), "dtypes": ["float32"], "skip_static": True, "timeout": 60}


# --------------------------------------------------------------------------------------- static
# Bytes of an otherwise honest candidate that Python reads differently from strict UTF-8.
ENCODING_CHEATS = [
    ("raw-unicode-escape", b"# -*- coding: raw_unicode_escape -*-\n" + HONEST),
    ("latin-1", b"# coding=latin-1\n" + HONEST),
    ("latin-1 alias on line 2", b"#!/usr/bin/env python\n# vim: set fileencoding=iso8859_1 :\n" + HONEST),
    ("unknown encoding", b"# coding: rot13\n" + HONEST),
    ("utf-8 bom", b"\xef\xbb\xbf" + HONEST),
    ("bom and latin-1", b"\xef\xbb\xbf# coding: latin-1\n" + HONEST),
    ("nul byte", HONEST.replace(b"OP = ", b"\x00OP = ", 1)),
    ("form feed", HONEST.replace(b"\ndef entry", b"\n\x0cdef entry", 1)),
    ("lone carriage return", HONEST.replace(b"\nOP = ", b"\rOP = ", 1)),
]


@pytest.mark.parametrize("name,data", ENCODING_CHEATS, ids=[n for n, _ in ENCODING_CHEATS])
def test_file_python_reads_differently_is_rejected(tmp_path, name, data):
    path = tmp_path / "candidate.py"
    path.write_bytes(data)
    verdict = verify(path)
    assert ("static", "source-encoding") in rules_of(verdict), verdict.failures
    assert not verdict.accepted and verdict.attestation is None


@pytest.mark.parametrize(
    "declaration", [b"# -*- coding: utf-8 -*-\n", b"# coding: utf8\n", b"# vim: set fileencoding=UTF-8 :\n"]
)
def test_utf8_declarations_and_crlf_pass(declaration):
    assert encoding_problem(declaration + HONEST) is None
    assert encoding_problem(HONEST.replace(b"\n", b"\r\n")) is None
    assert check_source((declaration + HONEST).decode()).failures == []


def test_hidden_line_exploit_is_rejected_statically_and_by_the_loader():
    """The measured exploit: `\\u000a` in a comment becomes a line feed under raw_unicode_escape and
    a torch fallback runs. Static layer on: `source-encoding`; off: the child's loader refuses it."""
    path = candidate_path("cheat_coding_raw_unicode_escape")
    assert ("static", "source-encoding") in rules_of(verify(path))
    verdict = run_verification(path, **FAST)
    assert ("sandbox", "import-failed") in rules_of(verdict), verdict.failures
    assert "raw_unicode_escape" in _message(verdict, "import-failed")


def test_loader_compiles_the_bytes_it_was_given(tmp_path):
    """The server admits bytes, then imports: the module (and Triton's view of its source) comes from
    those bytes even where the file changed in between."""
    path = tmp_path / "kernel.py"
    admitted = (HEADER + HONEST_ENTRY).encode()
    path.write_bytes(admitted.replace(b"x.reshape(-1, hidden)", b"x.reshape(-1, hidden) * 2"))
    candidate = load_candidate(path, admitted)
    assert "* 2" not in inspect.getsource(candidate.entry)
    assert "* 2" not in inspect.getsource(candidate.module._rms_rows.fn)
    with pytest.raises(CandidateError, match="raw_unicode_escape"):
        load_candidate(path, b"# coding: raw_unicode_escape\n" + admitted)


# Paths through allowed imports that reach the harness (its modules, the interpreter, the environment).
HARNESS_REACHES = [
    ("typing.sys.modules", "import typing\n", "    harness = typing.sys.modules\n"),
    ("tl.core.builtins", "", "    b = tl.core.builtins\n"),
    ("triton.runtime", "", "    d = triton.runtime.driver.active\n"),
    ("triton.runtime.jit.os", "", "    env = triton.runtime.jit.os.environ\n"),
    ("from-import", "from triton import runtime\n", ""),
    ("in a kernel", "", ""),
]


@pytest.mark.parametrize("name,imports,line", HARNESS_REACHES, ids=[n for n, _, _ in HARNESS_REACHES])
def test_paths_to_the_harness_are_introspection(name, imports, line):
    source = imports + HEADER + HONEST_ENTRY.replace("    hidden = x.shape[-1]\n", line + "    hidden = x.shape[-1]\n")
    if name == "in a kernel":
        kernel_line = "    row = tl.program_id(0)\n"
        source = source.replace(kernel_line, kernel_line + "    s = tl.core.builtins\n")
    failures = check_source(source).failures
    assert any(f.rule == "introspection" and "reaches the module" in f.message for f in failures), failures


def test_patching_the_harness_is_rejected():
    verdict = verify(candidate_path("cheat_patches_harness"))
    assert ("static", "introspection") in rules_of(verdict)
    assert "typing.sys.modules" in _message(verdict, "introspection")


# --------------------------------------------------------------------------------------- sandbox
def _message(verdict, rule: str) -> str:
    return " ".join(f.message for f in verdict.failures if f.rule == rule)


def _probe(tmp_path: Path, name: str, target: str | None = None) -> tuple[object, str]:
    """Verify the cheat (static layer off; `target` in place of __TARGET__); its probe's words."""
    path = candidate_path(name)
    if target is not None:
        path = tmp_path / f"{name}.py"
        path.write_text(candidate_path(name).read_text().replace("__TARGET__", target))
    verdict = run_verification(path, **FAST)
    assert ("sandbox", "import-failed") in rules_of(verdict), verdict.failures
    message = _message(verdict, "import-failed")
    assert "PROBE" in message, message
    return verdict, message


def test_parent_environment_and_memory_are_out_of_reach(tmp_path):
    verdict, message = _probe(tmp_path, "cheat_reads_parent_environ")
    assert "environ=blocked" in message and "mem=blocked" in message, message
    assert verdict.isolation and verdict.isolation["parent_non_dumpable"]


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A state folder of this test's, holding the attestation key and the admin token."""
    folder = tmp_path / "state"
    folder.mkdir()
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(folder))
    (folder / "attestation.key").write_bytes(secrets.token_bytes(32))
    (folder / "admin-token").write_text(secrets.token_hex(16))
    return folder


@pytest.mark.parametrize("secret", ["attestation.key", "admin-token"])
def test_state_folder_secrets_are_unreadable(tmp_path, state, secret):
    _, message = _probe(tmp_path, "cheat_reads_secret_file", str(state / secret))
    assert "PROBE blocked" in message, message


# Devices whose bytes hold what path rules protect (a disk's blocks, the kernel's log): Landlock
# opens only harmless device files (and the GPU's), and the dropped capabilities refuse the log too.
DEVICES = [d for d in ("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/xvda", "/dev/kmsg") if Path(d).exists()]


@pytest.mark.parametrize("device", DEVICES)
def test_raw_devices_are_unreadable(tmp_path, device):
    _, message = _probe(tmp_path, "cheat_reads_secret_file", device)
    assert "PROBE blocked" in message, message


def test_only_harmless_devices_are_listed():
    for device in ("cpu", "cuda"):
        listed = isolation.device_files(device)
        assert "/dev" not in listed and not any(Path(d).is_block_device() for d in listed if Path(d).exists())


def test_state_folder_inside_the_repository_is_unreadable(tmp_path, monkeypatch):
    """`make demo` keeps its state folder in the repository: only the package folders are readable."""
    folder = isolation.REPO_ROOT / f".state-isolation-test-{secrets.token_hex(4)}"
    folder.mkdir()
    try:
        monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(folder))
        (folder / "attestation.key").write_bytes(secrets.token_bytes(32))
        _, message = _probe(tmp_path, "cheat_reads_secret_file", str(folder / "attestation.key"))
        assert "PROBE blocked" in message, message
    finally:
        shutil.rmtree(folder)  # the verification kept its caches there too


def test_state_folder_is_not_writable(tmp_path, state):
    _, message = _probe(tmp_path, "cheat_writes_state", str(state))
    assert "PROBE blocked" in message, message
    assert not (state / "planted.py").exists()


def test_shared_compiler_cache_is_readable_not_writable(tmp_path, state):
    """A candidate cannot plant an artefact that a later verification or baseline would load: the
    shared Triton cache is listed for reading only (`compiler_cache`)."""
    shared = compiler_cache.shared_dirs(state)[0]
    _, message = _probe(tmp_path, "cheat_writes_state", str(shared))
    assert "PROBE blocked" in message, message
    assert not (shared / "planted.py").exists()


def test_shared_memory_is_not_writable_on_cpu(tmp_path):
    """On CPU the child writes beneath its own folder only (on CUDA also /dev/shm, for CUDA IPC)."""
    planted = Path("/dev/shm/planted.py")
    _, message = _probe(tmp_path, "cheat_writes_state", "/dev/shm")
    written = planted.exists()
    planted.unlink(missing_ok=True)
    assert "PROBE blocked" in message and not written, message


def test_no_process_outlives_the_verdict(tmp_path):
    """A double fork with setsid in the middle: setsid fails, the grandchild stays in the child's
    session, and it is killed (and reported) before the verdict."""
    verdict, message = _probe(tmp_path, "cheat_double_fork")
    pid, how = re.search(r"grandchild (\d+) (\w+)", message).groups()  # type: ignore[union-attr]
    alive = _alive_after(int(pid), seconds=2.0)
    if alive:
        os.kill(int(pid), signal.SIGKILL)  # the grandchild this test's candidate started
    assert how == "stayed" and not alive
    assert ("sandbox", "forked-process") in rules_of(verdict)


def _alive_after(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
        except OSError:
            return False
        time.sleep(0.05)
    return True


def test_policy_never_lists_the_repository_or_the_state_folder(state):
    policy = isolation.policy("cpu", Path("/tmp/work"), {}, [], [state])
    for folder in policy["read"] + policy["write"]:
        resolved = Path(folder).resolve()
        assert resolved not in (isolation.REPO_ROOT, *isolation.REPO_ROOT.parents)
        assert resolved not in (state, *state.parents)


def test_import_paths_are_readable_around_a_state_folder_inside_them(tmp_path):
    """A project folder on the import path (a module class of the user's) stays readable, split
    around the state folder and hidden entries inside it, which are never listed; an import path
    inside a closed folder (a clone's virtual environment in the temporary folder) stays readable,
    the closed folder itself is never readable."""
    project = tmp_path / "project"
    state = project / "state"
    for folder in (project / "models", state, project / ".git", project / ".venv" / "lib"):
        folder.mkdir(parents=True)
    (project / "models" / "mine.py").write_text("X = 1\n")
    kept = {Path(p) for p in isolation.readable_beneath(project, [state], [])}
    assert kept == {project / "models"}
    assert isolation.readable_beneath(state / "inner", [state], []) == []
    assert isolation.readable_beneath(project / "models", [state], []) == [str(project / "models")]
    assert isolation.readable_beneath(project, [state], [project / ".git"]) == [str(project / "models")]
    venv = project / ".venv"
    assert isolation.readable_beneath(venv, [state], [tmp_path]) == [str(venv)]
    assert isolation.readable_beneath(tmp_path, [state], [tmp_path]) == []


def test_isolation_layers_are_recorded(tmp_path):
    """Which layers held on this machine (they all do on a Linux host with Landlock and seccomp)."""
    verdict, _ = _probe(tmp_path, "cheat_reads_secret_file", "/nonexistent")
    held = verdict.isolation or {}
    assert {"landlock", "seccomp", "capabilities", "no_new_privs", "network", "parent_non_dumpable"} <= set(held)
    if isolation.landlock_abi():
        assert held["landlock"] == isolation.landlock_abi() and held["proc"] == "own"
    if verdict.timings.get("sandbox_child_started_by") == "exec":
        assert held["threads"] == 1  # isolated before torch is imported (and starts threads)
