"""Finding and loading KernelBench problem files, and building a problem's model and inputs (with a
fixed seed; on CPU possibly at the reduced sizes `sizes.py` plans)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from gpuyantra.candidate import import_file

SEED = 42


class KernelBenchError(Exception):
    """PATH cannot be read or holds no problem files."""


@dataclass
class Problem:
    """A loaded problem file: its module, model, inputs (on the run's device)."""

    module: ModuleType
    model: torch.nn.Module
    inputs: list[Any]


def natural_key(path: Path) -> list[tuple[int, int | str]]:
    """Sort key that puts `2_relu.py` before `10_gelu.py`: digit runs compare as numbers."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", path.as_posix()) if part]


def find_problems(path: str | Path) -> list[tuple[str, Path]]:
    """(name, file) for PATH: one `.py` file, or every `.py` file under a folder (in natural order:
    problem 2 before problem 10)."""
    path = Path(path)
    if not path.exists():
        raise KernelBenchError(f"{path} does not exist")
    if path.is_file():
        if path.suffix != ".py":
            raise KernelBenchError(f"{path} is not a .py file")
        return [(path.stem, path)]
    if not path.is_dir():
        raise KernelBenchError(f"{path} is neither a file nor a folder")
    try:
        files = sorted(
            (
                p
                for p in path.rglob("*.py")
                if p.is_file()
                and p.name != "__init__.py"
                and not any(part.startswith((".", "__pycache__")) for part in p.relative_to(path).parts)
            ),
            key=lambda p: natural_key(p.relative_to(path)),
        )
    except OSError as exc:
        raise KernelBenchError(f"cannot read {path}: {exc}") from exc
    if not files:
        raise KernelBenchError(f"{path} holds no .py problem files")
    return [(p.relative_to(path).with_suffix("").as_posix(), p) for p in files]


def safe_name(name: str) -> str:
    """A folder path for a problem name: path parts kept, odd characters replaced."""
    parts = [re.sub(r"[^A-Za-z0-9_.-]", "_", part).lstrip(".") or "_" for part in name.split("/")]
    return "/".join(parts)


def load_module(file: Path) -> ModuleType:
    """Import the problem file under a private name (registered in sys.modules while it runs)."""
    source = file.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    module_name = f"gpuyantra_kernelbench_{re.sub(r'[^A-Za-z0-9_]', '_', file.stem)}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    return import_file(file, module_name)


def check_problem_module(module: ModuleType) -> str | None:
    """Why the module is not a KernelBench problem, or None when it is one."""
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
    if missing:
        return f"not a KernelBench problem: defines no {', '.join(missing)}"
    if not (inspect.isclass(module.Model) and issubclass(module.Model, torch.nn.Module)):
        return "not a KernelBench problem: Model is not an nn.Module subclass"
    return None


def input_elements(module: ModuleType) -> int | None:
    """Elements of get_inputs()'s tensors, from a call on the meta device (nothing allocated);
    None when get_inputs cannot run there."""
    try:
        with torch.device("meta"):
            inputs = list(module.get_inputs())
    except Exception:  # noqa: BLE001 - e.g. numpy-made inputs: the caller measures the real ones
        return None
    return sum(t.numel() for t in inputs if isinstance(t, torch.Tensor))


def output_elements(module: ModuleType) -> int | None:
    """Elements of the Model's outputs on get_inputs(), from a forward on the meta device (a
    matmul's output can be far larger than its inputs); None when the forward cannot run there."""
    try:
        with torch.device("meta"), torch.no_grad():
            outputs = module.Model(*module.get_init_inputs())(*module.get_inputs())
    except Exception:  # noqa: BLE001 - data-dependent ops and the like: the inputs' count stands alone
        return None
    items = outputs if isinstance(outputs, (tuple, list)) else [outputs]
    return sum(t.numel() for t in items if isinstance(t, torch.Tensor))


def parameter_elements(module: ModuleType) -> int | None:
    """Elements of Model's parameters and buffers, built on the meta device; None when it cannot be."""
    try:
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs())
    except Exception:  # noqa: BLE001 - the caller measures the real model
        return None
    return sum(t.numel() for t in [*model.parameters(), *model.buffers()])


def to_device(value: Any, device: str) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def make_inputs(
    module: ModuleType, device: str, seed: int, sizes: dict[tuple[int, ...], tuple[int, ...]] | None = None
) -> list[Any]:
    """The problem's own get_inputs(); with `sizes`, its factories draw the reduced shapes.

    On CUDA the factories draw on the GPU itself (`torch.device` as the default): a KernelBench
    input of a billion elements takes seconds to draw on the host and copy over, and the problem is
    drawn several times (inputs, ModelNew checks, timing)."""
    torch.manual_seed(seed)
    where = torch.device(device) if device != "cpu" else contextlib.nullcontext()
    if not sizes:
        with where:
            return [to_device(v, device) for v in module.get_inputs()]
    from gpuyantra.ops.open import ShrinkFactories

    with ShrinkFactories(sizes), where:
        return [to_device(v, device) for v in module.get_inputs()]


def build_model(
    module: ModuleType, cls: type, device: str, seed: int = SEED, init: Sequence[Any] | None = None
) -> torch.nn.Module:
    """`cls(*get_init_inputs())` with a fixed seed, or from `init` (the reduced init inputs on CPU)."""
    torch.manual_seed(seed)
    args = list(module.get_init_inputs()) if init is None else copy.deepcopy(list(init))
    return cls(*args).to(device)
