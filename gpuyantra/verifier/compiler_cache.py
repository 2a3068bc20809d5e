"""The compiler caches a sandbox child uses: its own to write, a shared one to read.

A compiled artefact on disk is code that a later process loads without checking it: Triton's cache
(a kernel's cubin, its launcher's shared object) and TorchInductor's (generated Python modules, the
FX graph cache). A candidate that could write a shared cache could plant an artefact that a later
verification, the torch.compile baseline or anything else reading that cache then runs. So:

- every sandbox child writes only beneath its own folder: `TRITON_CACHE_DIR` and
  `TORCHINDUCTOR_CACHE_DIR` name folders there;
- it reads the shared caches (`<state>/verifier/triton-cache`, `.../inductor-cache`) read-only
  (Landlock lists them for reading, never for writing: `isolation.policy`): Triton through
  `ReadThroughCacheManager` (`TRITON_CACHE_MANAGER`), which looks in the child's own cache first,
  then in the shared one, and always writes to its own; Inductor through links to the shared
  entries made in the child's own folder (`link_shared_inductor`) before it compiles;
- only trusted processes write the shared caches: the verifying process copies (`promote`) a
  child's own caches into them when that child ran no candidate code (the baselines' compiling
  child beside a verification) or ran a repository template byte for byte. Template and baseline
  kernels so stay warm for every later verdict; a candidate's artefacts never leave its folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from triton.runtime.cache import FileCacheManager

# Where the child's Triton finds the shared (read-only) cache beside its own.
SHARED_TRITON_ENV = "GPUYANTRA_SHARED_TRITON_CACHE_DIR"
SHARED_INDUCTOR_ENV = "GPUYANTRA_SHARED_INDUCTOR_CACHE_DIR"
MANAGER = "gpuyantra.verifier.compiler_cache:ReadThroughCacheManager"
GROUP_PREFIX = "__grp__"  # Triton's group files: JSON naming each member's absolute path
PRIVATE_TRITON = "triton-cache"
PRIVATE_INDUCTOR = "inductor-cache"


class ReadThroughCacheManager(FileCacheManager):
    """Triton's file cache in the child's own folder (`TRITON_CACHE_DIR`), falling back to the shared
    cache (`GPUYANTRA_SHARED_TRITON_CACHE_DIR`) for reads only. Dumps and overrides are Triton's own."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override, dump)
        shared = os.environ.get(SHARED_TRITON_ENV, "")
        self.shared_dir = os.path.join(shared, key) if shared and not (override or dump) else ""

    def get_file(self, filename: str) -> str | None:
        own = super().get_file(filename)
        if own is not None or not self.shared_dir:
            return own
        path = os.path.join(self.shared_dir, filename)
        return path if os.path.exists(path) else None

    def get_group(self, filename: str) -> dict[str, str] | None:
        own = super().get_group(filename)
        if own is not None or not self.shared_dir:
            return own
        return _read_group(os.path.join(self.shared_dir, GROUP_PREFIX + filename))


def _read_group(path: str) -> dict[str, str] | None:
    """A shared group file's members, where every one exists (Triton's own rule for a hit)."""
    try:
        with open(path) as fh:
            members = json.load(fh).get("child_paths")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(members, dict) or not all(os.path.exists(str(p)) for p in members.values()):
        return None
    return {str(k): str(v) for k, v in members.items()}


TEMPLATES = Path(__file__).resolve().parent.parent / "kernels"  # the repository's template kernels


def is_template(source: str) -> bool:
    """Whether `source` is, byte for byte, one of the repository's template kernels (trusted code)."""
    data = source.encode()
    for path in TEMPLATES.glob("*.py"):
        with contextlib.suppress(OSError):
            if path.stat().st_size == len(data) and path.read_bytes() == data:
                return True
    return False


def shared_dirs(state: Path) -> tuple[Path, Path]:
    """(Triton, Inductor) shared caches of the state folder `state`."""
    return state / "verifier" / PRIVATE_TRITON, state / "verifier" / PRIVATE_INDUCTOR


def child_env(workdir: Path, state: Path) -> dict[str, str]:
    """The cache variables of a sandbox child working in `workdir`: its own caches there, the shared
    ones (created here, by the trusted parent, so Landlock can name them) to read."""
    triton_shared, inductor_shared = shared_dirs(state)
    for folder in (triton_shared, inductor_shared):
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
    return {
        "TRITON_CACHE_DIR": str(workdir / PRIVATE_TRITON),
        "TRITON_CACHE_MANAGER": MANAGER,
        SHARED_TRITON_ENV: str(triton_shared),
        "TORCHINDUCTOR_CACHE_DIR": str(workdir / PRIVATE_INDUCTOR),
        SHARED_INDUCTOR_ENV: str(inductor_shared),
    }


def shared_read_dirs(env: dict[str, str]) -> list[str]:
    """The shared caches a child with environment `env` reads (never writes)."""
    return [env[key] for key in (SHARED_TRITON_ENV, SHARED_INDUCTOR_ENV) if env.get(key)]


def link_shared_inductor() -> int:
    """In the child, before it compiles: a link in its own Inductor cache to every shared entry it
    lacks (folders made real, so what Inductor writes lands in the child's folder; writing through a
    link into the shared folder is refused by Landlock). Returns the links made."""
    shared, own = os.environ.get(SHARED_INDUCTOR_ENV, ""), os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    if not shared or not own or not os.path.isdir(shared):
        return 0
    made = 0
    for root, folders, files in os.walk(shared):
        relative = os.path.relpath(root, shared)
        target = os.path.normpath(os.path.join(own, relative))
        os.makedirs(target, exist_ok=True)
        folders[:] = [f for f in folders if not f.startswith("tmp")]
        for name in files:
            link = os.path.join(target, name)
            if not os.path.lexists(link):
                with contextlib.suppress(OSError):
                    os.symlink(os.path.join(root, name), link)
                    made += 1
    return made


def promote(workdir: Path, state: Path) -> int:
    """Copy what a trusted child (no candidate code ran in it) compiled into the shared caches: each
    Triton key folder and Inductor file the shared caches lack, group files rewritten to the shared
    paths, each entry written whole before it is named. Never overwrites. Returns entries copied."""
    triton_shared, inductor_shared = shared_dirs(state)
    return _promote_triton(workdir / PRIVATE_TRITON, triton_shared) + _promote_files(
        workdir / PRIVATE_INDUCTOR, inductor_shared
    )


def _promote_triton(own: Path, shared: Path) -> int:
    if not own.is_dir():
        return 0
    copied = 0
    for entry in sorted(own.iterdir()):
        destination = shared / entry.name
        if not entry.is_dir() or entry.is_symlink() or destination.exists():
            continue
        shared.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"tmp.{entry.name}.", dir=shared))
        try:
            for item in entry.iterdir():
                if not item.is_file() or item.is_symlink() or item.name == "lock":
                    continue
                data = item.read_bytes()
                if item.name.startswith(GROUP_PREFIX):  # members named by the child's paths: the shared ones
                    data = data.replace(str(entry).encode(), str(destination).encode())
                (staging / item.name).write_bytes(data)
            os.rename(staging, destination)
            copied += 1
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return copied


def _promote_files(own: Path, shared: Path) -> int:
    """Inductor's entries: regular files only (a link points into the shared cache already)."""
    if not own.is_dir():
        return 0
    copied = 0
    for root, _, files in os.walk(own):
        for name in files:
            source = Path(root) / name
            destination = shared / source.relative_to(own)
            if source.is_symlink() or not source.is_file() or destination.exists():
                continue
            with contextlib.suppress(OSError):
                destination.parent.mkdir(parents=True, exist_ok=True)
                staging = destination.with_name(f".tmp.{os.getpid()}.{name}")
                shutil.copyfile(source, staging)
                os.replace(staging, destination)
                copied += 1
    return copied
