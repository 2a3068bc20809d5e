"""The target `gpuyantra verify --problem` / `--module` names, built on the spot as an open target
(docs/open-targets.md), and the verification of a candidate against it.

A KernelBench problem travels as its file's name and text, never as a path: whoever builds the
target (this process, or the GPU worker the command sends it to) keeps the text in its own state
folder, under `problems/<digest>/<stem>.py`, named by its bytes, and imports it from there. A module
class is imported by its dotted path. Either is built on the CPU with a fixed seed (`Model(*get_init_inputs())`
called on `get_inputs()`), so the target's name (`open.<stem or class>_<digest>`) is the same
wherever it is built from the same text or class. The target is saved under the state folder's
`targets/` (the sandbox child loads it from there) and registered in this process.

A candidate whose OP is not that name is rejected at the contract layer, the name given, so a user
learns it from the first run.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuyantra.ops.open import OpenTarget
    from gpuyantra.verifier import Verdict

PROBLEM_NAMES = ("Model", "get_inputs", "get_init_inputs")


class TargetUnusable(ValueError):
    """The problem or module class named cannot give a target: a usage error, one line."""


@dataclass(frozen=True)
class NamedTarget:
    """What a verify request names besides the candidate: a KernelBench problem (its file's name
    and text) or a module class (its dotted path); none of them: the candidate's OP alone."""

    problem_name: str | None = None
    problem_source: str | None = None
    module_class: str | None = None


def problem_file_error(source: str) -> str | None:
    """Why a problem file's text is not a KernelBench problem, read without running it; None when
    it defines Model, get_inputs and get_init_inputs at module level."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as exc:
        return f"does not parse: {exc}"
    defined = _module_level_names(tree)
    missing = [name for name in PROBLEM_NAMES if name not in defined]
    return f"not a KernelBench problem: defines no {', '.join(missing)}" if missing else None


def _module_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in statement.names)
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names.update(node.id for target in targets for node in ast.walk(target) if isinstance(node, ast.Name))
    return names


def names_a_family(op: str | None) -> bool:
    """Whether OP names a registered op family (not an open target)."""
    from gpuyantra.ops import UnknownOpError, get_op
    from gpuyantra.ops.open import is_open

    if not op or is_open(op):
        return False
    try:
        get_op(op)
    except UnknownOpError:
        return False
    return True


def wants_open_target(named: NamedTarget, source: str | None) -> bool:
    """A problem always names an open target; a module class does unless the candidate's OP names a
    registered family (then `--module` is the class that family's ADAPTER is checked against)."""
    from gpuyantra.candidate import read_op

    if named.problem_source is not None:
        return True
    return named.module_class is not None and not names_a_family(read_op(source) if source else None)


def build_target(named: NamedTarget) -> OpenTarget:
    """The open target `named` describes, saved and registered; TargetUnusable says why not."""
    from gpuyantra.ops.open import OpenTargetError

    try:
        if named.problem_source is not None:
            return problem_target(named.problem_name or "problem.py", named.problem_source)
        if named.module_class is not None:
            return module_class_target(named.module_class)
    except OpenTargetError as exc:
        raise TargetUnusable(f"cannot make an open target of it: {exc}") from None
    raise TargetUnusable("neither a problem nor a module class was named")


# --- KernelBench problems ---------------------------------------------------------------------


def problem_target(file_name: str, source: str) -> OpenTarget:
    """The open target of the KernelBench problem whose file is called `file_name` and holds `source`."""
    from gpuyantra.kernelbench.problems import SEED, build_model, check_problem_module, load_module, make_inputs
    from gpuyantra.ops.base import MODEL_CODE_IMPORT

    why = problem_file_error(source)
    if why:
        raise TargetUnusable(why)
    file = keep_problem(file_name, source)
    try:
        with MODEL_CODE_IMPORT, contextlib.redirect_stdout(sys.stderr):  # its prints stay out of the JSON
            module = load_module(file)
    except Exception as exc:  # noqa: BLE001 - whatever the problem's own code raises
        raise TargetUnusable(f"cannot import it: {type(exc).__name__}: {exc}") from None
    why = check_problem_module(module)
    if why:
        raise TargetUnusable(why)
    model, inputs = _run_user_code(
        "the problem", lambda: (build_model(module, module.Model, "cpu", SEED), make_inputs(module, "cpu", SEED))
    )
    target = _build(model, inputs, file.stem)
    target.source_file, target.source_module = str(file), module.__name__
    return save_and_register(target)


def keep_problem(file_name: str, source: str) -> Path:
    """The problem's text kept under the state folder, named by its bytes: `problems/<sha>/<stem>.py`.
    Only a sanitized stem of `file_name` is used; no directory part of it."""
    from gpuyantra.config import state_dir
    from gpuyantra.files import write_whole

    stem = re.sub(r"[^A-Za-z0-9_]", "_", Path(file_name.replace("\\", "/")).name.removesuffix(".py"))[:60]
    folder = state_dir() / "problems" / hashlib.sha256(source.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / f"{stem.strip('_') or 'problem'}.py"
    if not file.is_file() or file.read_text() != source:
        write_whole(file, source)
    return file


# --- module classes ---------------------------------------------------------------------------


def module_class_target(dotted: str) -> OpenTarget:
    """The open target of the module class at `dotted`: built as `cls(*get_init_inputs())` (none when
    not defined) and called on `get_inputs()`, found on the class itself or in its module. The class
    is taken from a copy of its file kept like a problem's (the sandbox child reads nothing of the
    current folder or the repository), unless that copy does not import alone (relative imports):
    then from its module, which the child must import from PYTHONPATH."""
    from gpuyantra.kernelbench.problems import SEED
    from gpuyantra.ops.base import import_class

    try:
        with contextlib.redirect_stdout(sys.stderr):
            cls = _kept_copy(import_class(dotted))
    except Exception as exc:  # noqa: BLE001 - import_class's ValueError, or the module's own errors
        raise TargetUnusable(str(exc) if isinstance(exc, ValueError) else f"cannot import it: {exc}") from None
    import torch

    if not (inspect.isclass(cls) and issubclass(cls, torch.nn.Module)):
        raise TargetUnusable("not a torch.nn.Module class")
    module = sys.modules[cls.__module__]
    get_inputs = _factory(cls, module, "get_inputs")
    if get_inputs is None:
        raise TargetUnusable(
            "defines no get_inputs() (on the class or in its module): the inputs to build the target from"
        )
    get_init_inputs = _factory(cls, module, "get_init_inputs") or list

    def build() -> tuple[torch.nn.Module, list[Any]]:
        torch.manual_seed(SEED)
        model = cls(*get_init_inputs())
        torch.manual_seed(SEED)
        return model, list(get_inputs())

    model, inputs = _run_user_code("the module class", build)
    target = _build(model, inputs, cls.__name__)
    if module.__file__ and module.__name__.startswith(KEPT_MODULE_PREFIX):
        target.source_file, target.source_module = module.__file__, module.__name__
    return save_and_register(target)


KEPT_MODULE_PREFIX = "gpuyantra_module_"


def _kept_copy(cls: Any) -> Any:
    """The same class from a copy of its file kept under the state folder, imported under a private
    name; the class itself where there is no such file or the copy does not import alone."""
    from gpuyantra.candidate import import_file
    from gpuyantra.ops.base import MODEL_CODE_IMPORT

    try:
        file = Path(inspect.getfile(cls))
        source = file.read_text()
    except (TypeError, OSError, UnicodeDecodeError):
        return cls
    kept = keep_problem(file.name, source)
    name = f"{KEPT_MODULE_PREFIX}{kept.stem}_{kept.parent.name[:12]}"
    try:
        with MODEL_CODE_IMPORT:
            module = sys.modules.get(name) or import_file(kept, name)
        return getattr(module, cls.__name__)
    except Exception:  # noqa: BLE001 - relative imports and the like: the class as its package has it
        return cls


def _factory(cls: type, module: ModuleType, name: str) -> Callable[[], Sequence[Any]] | None:
    found = getattr(cls, name, None) or getattr(module, name, None)
    return found if callable(found) else None


# --- building and saving ----------------------------------------------------------------------


def _run_user_code(what: str, work: Callable[[], Any]) -> Any:
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return work()
    except Exception as exc:  # noqa: BLE001 - the user's constructor or get_inputs
        raise TargetUnusable(f"{what} cannot build its model and inputs: {type(exc).__name__}: {exc}") from None


def _build(model: Any, inputs: Sequence[Any], name_hint: str) -> OpenTarget:
    """The target, named without any path (its source file is set afterwards by the caller)."""
    import torch

    from gpuyantra.ops.open import OpenTargetError, build_open_target

    try:
        with torch.no_grad(), contextlib.redirect_stdout(sys.stderr):
            model(*inputs)
    except Exception as exc:  # noqa: BLE001 - the forward refuses its own inputs
        raise TargetUnusable(f"its model does not run on its inputs: {type(exc).__name__}: {exc}") from None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return build_open_target(model, inputs, name_hint=name_hint)
    except OpenTargetError:
        raise
    except Exception as exc:  # noqa: BLE001 - a probe the module refuses: not a target this way
        raise OpenTargetError(f"{type(exc).__name__}: {exc}") from None


def save_and_register(target: OpenTarget) -> OpenTarget:
    """Save the target under the state folder's `targets/<name>/` unless a process saved it there
    already (whole folders renamed into place: a reader never sees one half written), then register
    it in this process."""
    from gpuyantra.ops.open import register_open, targets_dir

    folder = targets_dir() / target.op
    if not (folder / "target.json").is_file():
        partial = folder.with_name(f".{target.op}.{uuid.uuid4().hex}.partial")
        target.save(partial)
        try:
            os.rename(partial, folder)
        except OSError:  # saved meanwhile by another process, or a leftover folder without target.json
            shutil.rmtree(partial, ignore_errors=True)
            if not (folder / "target.json").is_file():
                target.save(folder)
    register_open(target, save=False)
    return target


# --- verifying --------------------------------------------------------------------------------


def verify_against(path: str | Path, target: OpenTarget, **options: Any) -> Verdict:
    """`run_verification` of the candidate at `path` against `target`; a candidate whose OP names
    another op is rejected at the contract layer with the target's name, without running it."""
    from gpuyantra.candidate import CandidateError, read_op, read_source
    from gpuyantra.verifier import Failure, Verdict, run_verification

    try:
        source = read_source(path)
    except CandidateError:
        source = None  # the verifier rejects it as unreadable
    op = read_op(source) if source is not None else None
    if source is None or op == target.op:
        return run_verification(path, module_class=target.module_class, **options)
    from gpuyantra import attestation
    from gpuyantra.verifier.cases import DEFAULT_DTYPES

    device = options.get("device") or "cpu"
    verdict = Verdict(op=op, accepted=False, reward=-1, device=device)
    verdict.dtypes = list(options.get("dtypes") or DEFAULT_DTYPES[device])
    verdict.module_class = target.module_class
    verdict.source_sha256 = attestation.source_sha256(source)
    claimed = f"OP is {op!r}" if op else "the file sets no OP"
    verdict.failures.append(
        Failure("contract", "unknown-op", f'{claimed}, but the target named is {target.op}: set OP = "{target.op}"')
    )
    return verdict


def verify_named(path: str | Path, named: NamedTarget, source: str | None, **options: Any) -> Verdict:
    """The verification a `verify` request asks for: against the open target it names (built here,
    TargetUnusable when it cannot be), else the candidate's OP alone as always."""
    if wants_open_target(named, source):
        return verify_against(path, build_target(named), **options)
    from gpuyantra.verifier import run_verification

    return run_verification(path, module_class=named.module_class, **options)
