"""Open targets by name: in this process, in the state folder, or carried with a profile target."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpuyantra.ops.base import OpFamily
from gpuyantra.ops.open.family import open_family
from gpuyantra.ops.open.spec import OPEN_PREFIX, OpenInput, OpenParam, OpenTargetError, is_open
from gpuyantra.ops.open.target import OpenTarget
from gpuyantra.ops.registry import register, registered


def targets_dir() -> Path:
    from gpuyantra.config import state_dir

    return state_dir() / "targets"


def register_open(target: OpenTarget, save: bool = True) -> OpFamily:
    """Register the target's family in this process (and save it for other processes)."""
    if save:
        target.save(targets_dir() / target.op)
    return register(open_family(target))


def load_open_target(folder: Path) -> OpenTarget:
    meta = json.loads((folder / "target.json").read_text())
    return _from_meta(meta, lambda: torch.load(folder / "module.pt", weights_only=False, map_location="cpu"))


def stage_open_target(name: str, folder: Path) -> Path:
    """A copy of the saved target `name` in `folder` (a sandbox's own), for a process that may read
    nothing of the state folder: its module, the source file its class is imported from (a
    KernelBench problem's), and `target.json` naming that copy. Copies, never links: the sandbox
    writes its own folder, and a link would let it write the saved target."""
    saved = targets_dir() / name
    meta = json.loads((saved / "target.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(saved / "module.pt", folder / "module.pt")
    if meta.get("source_file"):
        source = Path(meta["source_file"])
        (folder / "source").mkdir(exist_ok=True)
        staged = folder / "source" / source.name
        shutil.copyfile(source, staged)
        meta["source_file"] = str(staged)
    (folder / "target.json").write_text(json.dumps(meta, indent=1))
    return folder


def ensure_open_target(target: dict[str, Any]) -> None:
    """Make a profile target's open op known here: saved in this state folder and registered
    (workers receive the target with its payload; a registered family needs nothing)."""
    payload = target.get("open_target")
    op = str(target.get("op") or "")
    if not is_open(op) or not payload:
        return
    if registered(op) is not None:
        return
    folder = targets_dir() / op
    if not (folder / "target.json").is_file():
        blob = base64.b64decode(payload["module_b64"])
        loaded = _from_meta(payload["meta"], lambda: torch.load(io.BytesIO(blob), weights_only=False))
        if loaded.op != op:
            raise OpenTargetError(f"the payload of {op} describes {loaded.op}")
        loaded.save(folder)
    find_open_family(op)


def _from_meta(meta: dict[str, Any], load_module: Callable[[], torch.nn.Module]) -> OpenTarget:
    source_file, source_module = meta.get("source_file"), meta.get("source_module")
    if source_file and source_module and source_module not in sys.modules:
        _import_source(Path(source_file), source_module)
    module = load_module()
    return OpenTarget(
        op=meta["op"],
        module_class=meta["module_class"],
        inputs=tuple(OpenInput(**{**i, "shape": tuple(i["shape"])}) for i in meta["inputs"]),
        params=tuple(OpenParam(**{**p, "shape": tuple(p["shape"])}) for p in meta["params"]),
        links=tuple(tuple((int(a), int(b)) for a, b in pairs) for pairs in meta["links"]),
        module=module,
        source_file=source_file,
        source_module=source_module,
        updated_buffers=tuple(meta.get("updated_buffers") or ()),
        buffer_steps=tuple((str(a), int(b)) for a, b in meta.get("buffer_steps") or ()),
        forward_returns_tuple=bool(meta.get("forward_returns_tuple", False)),
        free=tuple(tuple((int(a), int(b)) for a, b in group) for group in meta.get("free") or ()),
        calls=tuple(tuple(tuple(int(d) for d in shape) for shape in call) for call in meta.get("calls") or ()),
    )


def _import_source(file: Path, name: str) -> None:
    from gpuyantra.candidate import import_file

    import_file(file, name)


def find_open_family(name: str) -> OpFamily | None:
    """The family of a saved open target named `name`, registered on first use; None if unknown."""
    if not name.startswith(OPEN_PREFIX) or not re.fullmatch(r"open\.[a-z0-9_]+", name):
        return None
    folder = targets_dir() / name
    if not (folder / "target.json").is_file():
        return None
    return register_open(load_open_target(folder), save=False)


def open_spec_for(name: str) -> OpenTarget:
    """The open target behind op `name` (what the open author reads)."""
    family = registered(name) or find_open_family(name)
    target = getattr(family, "open_target", None)
    if target is None:
        raise OpenTargetError(f"{name!r} is not an open target")
    return target
