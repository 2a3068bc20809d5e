"""Compiler caches are no channel between a candidate and trusted processes: the sandbox child
writes its own Triton and Inductor caches, reads the shared ones, and only a trusted process copies
into the shared ones (`compiler_cache`). The Landlock side (a candidate writing the shared cache is
blocked) is in test_isolation.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuyantra.verifier import compiler_cache, isolation
from gpuyantra.verifier.sandbox import scrubbed_env

KEY = "K3Y"


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """A state folder of this test's and a child's work folder, with the child's cache variables set."""
    state, workdir = tmp_path / "state", tmp_path / "work"
    workdir.mkdir()
    monkeypatch.setenv("GPUYANTRA_STATE_DIR", str(state))
    for name, value in compiler_cache.child_env(workdir, state).items():
        monkeypatch.setenv(name, value)
    return state, workdir


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_child_writes_its_own_caches_and_reads_the_shared_ones(caches, device):
    state, workdir = caches
    env = scrubbed_env(device, workdir, 1)
    assert Path(env["TRITON_CACHE_DIR"]).parent == workdir
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent == workdir
    assert env["TRITON_CACHE_MANAGER"] == compiler_cache.MANAGER
    shared = [Path(p) for p in compiler_cache.shared_read_dirs(env)]
    assert shared == list(compiler_cache.shared_dirs(state)) and all(p.is_dir() for p in shared)
    policy = isolation.policy(device, workdir, env, [], [state])
    assert {str(p) for p in shared} <= set(policy["read"])
    for folder in policy["write"]:  # nothing of the state folder is writable, the shared caches least
        assert not Path(folder).resolve().is_relative_to(state.resolve()), folder


def _shared_entry(state: Path, filename: str, data: bytes) -> Path:
    folder = compiler_cache.shared_dirs(state)[0] / KEY
    folder.mkdir(parents=True, exist_ok=True)
    (folder / filename).write_bytes(data)
    return folder / filename


def test_manager_reads_the_shared_cache_and_writes_its_own(caches):
    state, workdir = caches
    shared_file = _shared_entry(state, "kernel.cubin", b"trusted")
    group = {"kernel.cubin": str(shared_file)}
    (shared_file.parent / "__grp__kernel.json").write_text(json.dumps({"child_paths": group}))
    manager = compiler_cache.ReadThroughCacheManager(KEY)
    assert manager.get_file("kernel.cubin") == str(shared_file)
    assert manager.get_group("kernel.json") == group
    written = manager.put(b"candidate's", "kernel.cubin")
    assert Path(written).parent == workdir / compiler_cache.PRIVATE_TRITON / KEY
    assert shared_file.read_bytes() == b"trusted"  # never overwritten
    assert manager.get_file("kernel.cubin") == written  # its own copy first
    assert manager.get_file("absent") is None


def test_promote_copies_a_trusted_childs_entries_once(caches):
    state, workdir = caches
    manager = compiler_cache.ReadThroughCacheManager(KEY)
    cubin = manager.put(b"compiled", "kernel.cubin")
    manager.put_group("kernel.json", {"kernel.cubin": cubin})
    inductor = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "ab" / "graph.py"
    inductor.parent.mkdir(parents=True)
    inductor.write_text("generated")
    assert compiler_cache.promote(workdir, state) == 2
    triton_shared, inductor_shared = compiler_cache.shared_dirs(state)
    members = json.loads((triton_shared / KEY / "__grp__kernel.json").read_text())["child_paths"]
    assert members == {"kernel.cubin": str(triton_shared / KEY / "kernel.cubin")}  # the shared paths
    assert (inductor_shared / "ab" / "graph.py").read_text() == "generated"
    Path(cubin).write_bytes(b"changed later")
    assert compiler_cache.promote(workdir, state) == 0  # never overwrites
    assert (triton_shared / KEY / "kernel.cubin").read_bytes() == b"compiled"


def test_inductor_links_to_the_shared_cache_and_writes_its_own(caches):
    state, _ = caches
    shared = compiler_cache.shared_dirs(state)[1] / "ab" / "graph.py"
    shared.parent.mkdir(parents=True)
    shared.write_text("trusted")
    assert compiler_cache.link_shared_inductor() == 1
    own = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "ab" / "graph.py"
    assert own.is_symlink() and own.read_text() == "trusted"
    assert compiler_cache.link_shared_inductor() == 0


def test_only_template_bytes_are_trusted():
    template = (compiler_cache.TEMPLATES / "rms_norm.py").read_text()
    assert compiler_cache.is_template(template)
    assert not compiler_cache.is_template(template + "\n# changed\n")
