"""The checker's shared state, how it reports, and how it names things.

`_CheckerBase` holds what every rule reads (import aliases, module-level bindings, kernels, host
functions, parent links) and `fail`, which drops repeats. Imports are checked and recorded here, and
expressions resolve to dotted module paths (`tl.sum` -> `triton.language.sum`, `getattr(torch,
"rsqrt")` -> `torch.rsqrt`); `_check_path` judges such a path against the torch and triton rules.
The rule mixins (module_level, nodes, taint, launches) subclass it.
"""

from __future__ import annotations

import ast
import importlib
import types
from collections.abc import Iterable
from typing import Any, TypeGuard, cast

from gpuyantra.ops.open.library import permitted_kinds
from gpuyantra.verifier.static.report import LAYER, StaticReport
from gpuyantra.verifier.static.scopes import _Func
from gpuyantra.verifier.static.tables import (
    ALLOWED_MODULE_PREFIXES,
    ALLOWED_MODULES,
    ALLOWED_TORCH,
    COMPILE_PREFIXES,
    CONCURRENCY_PREFIXES,
    LIBRARY_CALLS,
    NATIVE_PREFIXES,
    TENSOR_SAFE_METHODS,
)
from gpuyantra.verifier.verdict import Failure

REACH_ROOTS = ("triton", "typing", "math")  # allowed imports whose attributes the checker walks
# Functions of those modules that evaluate text as code.
EVALUATING = frozenset({"typing.get_type_hints", "typing.ForwardRef"})


def foreign_module(path: str) -> str | None:
    """The first module outside the allowed imports that a dotted path through typing, math or triton
    reaches (`typing.sys`, `triton.runtime.jit.os`, `tl.core.builtins`: the interpreter, the harness's
    modules, the environment), else None. Walked on the real modules: the verifier's own trusted
    imports, so the answer is what the candidate would get."""
    parts = path.split(".")
    if parts[0] not in REACH_ROOTS:
        return None
    try:
        current: Any = importlib.import_module(parts[0])
    except ImportError:
        return None
    for name in parts[1:]:
        try:
            current = getattr(current, name)
        except Exception:  # noqa: BLE001 - no such attribute: nothing is reached (it fails when run)
            return None
        if isinstance(current, types.ModuleType) and not _CheckerBase._module_allowed(current.__name__):
            return current.__name__
    return None


def _path_match(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p + ".") for p in prefixes)


class _CheckerBase:
    """State every rule reads, `fail`, imports, and resolution to dotted paths."""

    def __init__(self, tree: ast.Module, report: StaticReport, family: Any):
        self.tree = tree
        self.report = report
        self.family = family
        self.seen: set[tuple[str, int, str]] = set()
        self.aliases: dict[str, str] = {}  # local name -> dotted module path, from every import
        self.module_kinds: dict[str, str] = {}  # module-level name -> module|ref|kernel|func|const|mutable
        self.module_bindings: dict[str, int] = {}
        self.kernels: dict[str, ast.FunctionDef] = {}
        self.funcs: dict[str, _Func] = {}  # module-level host functions (and module-level lambdas)
        self.all_host_funcs: list[_Func] = []
        self.parents: dict[int, ast.AST] = {}

    # -- reporting ---------------------------------------------------------------------------------
    def fail(self, rule: str, node: ast.AST | None, message: str) -> None:
        line = getattr(node, "lineno", 0) if node is not None else 0
        key = (rule, line, message)
        if key in self.seen:
            return
        self.seen.add(key)
        where = f"line {line}: " if line else ""
        self.report.failures.append(Failure(LAYER, rule, where + message))

    # -- imports -----------------------------------------------------------------------------------
    def _collect_imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if not self._module_allowed(alias.name):
                        self.fail(
                            "import-not-allowed",
                            node,
                            f"import {alias.name}: candidates may import only "
                            "torch, triton, triton.language, math and typing",
                        )
                        continue
                    if alias.asname:
                        self.aliases[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        self.aliases[root] = root
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level or not self._module_allowed(module):
                    self.fail(
                        "import-not-allowed",
                        node,
                        f"from {'.' * node.level}{module} import ...: "
                        "candidates may import only torch, triton, triton.language, math and typing",
                    )
                    continue
                if module == "__future__":
                    continue
                for alias in node.names:
                    if alias.name == "*":
                        self.fail(
                            "import-not-allowed", node, f"from {module} import *: star imports hide what the file uses"
                        )
                        continue
                    path = f"{module}.{alias.name}"
                    self.aliases[alias.asname or alias.name] = path
                    self._check_path(path, node, bare=True, context="import")

    @staticmethod
    def _module_allowed(name: str) -> bool:
        return name in ALLOWED_MODULES or name.startswith(ALLOWED_MODULE_PREFIXES)

    # -- resolution --------------------------------------------------------------------------------
    def _resolve(self, node: ast.AST) -> str | None:
        """Dotted module path an expression names (`tl.sum` -> `triton.language.sum`), else None."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if self._is_const_getattr(node):
            base = self._resolve(node.args[0])
            attr = cast(str, cast(ast.Constant, node.args[1]).value)  # _is_const_getattr checked both
            return f"{base}.{attr}" if base else None
        return None

    @staticmethod
    def _is_const_getattr(node: ast.AST | None) -> TypeGuard[ast.Call]:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) in (2, 3)
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and not node.keywords
        )

    def _is_jit(self, func: ast.FunctionDef) -> bool:
        return any(self._decorator_path(d) == "triton.jit" for d in func.decorator_list)

    def _decorator_path(self, dec: ast.AST) -> str | None:
        return self._resolve(dec.func if isinstance(dec, ast.Call) else dec)

    def _outermost(self, node: ast.AST) -> bool:
        """True unless `node` is the base of a longer resolvable chain (checked there instead)."""
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return False
        if self._is_const_getattr(parent) and parent.args[0] is node:
            return False
        return True

    # -- the path rule: torch and triton attributes outside kernels --------------------------------
    def _check_path(self, path: str, node: ast.AST, bare: bool, context: str) -> None:
        root = path.split(".")[0]
        parts = path.split(".")
        if root == "torch":
            if path in ALLOWED_TORCH:
                return
            if path in LIBRARY_CALLS:
                self._check_library(path, node)
                return
            if path == "torch.Tensor":
                if context in ("annotation", "isinstance", "import"):
                    return
                self.fail(
                    "torch-compute", node, "torch.Tensor used as a value (allowed only in isinstance and annotations)"
                )
                return
            if path.startswith("torch.Tensor."):
                method = parts[2]
                if method in TENSOR_SAFE_METHODS and not method.startswith("_"):
                    return
                self.fail(
                    "torch-compute",
                    node,
                    f"{path}: host-side torch computation; the op must run in the candidate's Triton kernel",
                )
                return
            if path == "torch":
                self.fail(
                    "torch-compute",
                    node,
                    "the torch module used as a value (only torch.<attr> references can be checked)",
                )
                return
            if _path_match(path, COMPILE_PREFIXES):
                self.fail("torch-compile", node, f"{path}: compiling or capturing the op is not writing a kernel")
            elif _path_match(path, CONCURRENCY_PREFIXES):
                self.fail(
                    "concurrency",
                    node,
                    f"{path}: streams, events, threads and processes are not allowed (work outside the timed stream)",
                )
            elif _path_match(path, NATIVE_PREFIXES):
                self.fail("native-code", node, f"{path}: native extensions and custom ops are not Triton")
            elif any(p.startswith("_") for p in parts[1:]):
                self.fail("private-api", node, f"{path}: private torch internals")
            else:
                self.fail(
                    "torch-compute",
                    node,
                    f"{path}: host-side torch computation; only allocation "
                    "(torch.empty*, torch.zeros*) and metadata are allowed outside the kernel",
                )
        elif root == "triton" and any(p.startswith("_") for p in parts[1:]):
            self.fail("private-api", node, f"{path}: private triton internals")
        else:
            self._check_reach(path, node)

    def _check_library(self, path: str, node: ast.AST) -> None:
        """A library primitive: accepted (and named in the report) where the family's computation has
        that kind, else a cheat like any other torch compute."""
        kind = LIBRARY_CALLS[path]
        if kind in permitted_kinds(self.family):
            if path not in self.report.library_calls:
                self.report.library_calls.append(path)
            return
        self.fail(
            "torch-compute",
            node,
            f"{path}: a {kind} library call, permitted only for open targets whose forward computes a {kind}; "
            "the op must run in the candidate's Triton kernel",
        )

    def _check_reach(self, path: str, node: ast.AST) -> None:
        """No path through an allowed module may reach a module the candidate may not import (its
        attributes are the harness's: `typing.sys.modules` holds the recorder and the launch counter)."""
        if path in EVALUATING:
            self.fail("dynamic-code", node, f"{path}: evaluates text as code the checker cannot see")
            return
        reached = foreign_module(path)
        if reached is not None:
            self.fail(
                "introspection",
                node,
                f"{path}: reaches the module {reached}, which candidates may not use "
                "(the interpreter's and the harness's state lie behind it)",
            )

    # -- names and scopes --------------------------------------------------------------------------
    def _is_local(self, name: str, func: _Func | None) -> bool:
        return func is not None and name in func.locals

    def _is_nonlocal_var(self, name: str, func: _Func | None) -> bool:
        """A variable of an enclosing function or the module (not an import alias)."""
        if func is None or name in func.locals:
            return False
        enclosing = func.enclosing
        while enclosing is not None:
            if name in enclosing.locals:
                return True
            enclosing = enclosing.enclosing
        return name in self.module_kinds and self.module_kinds[name] not in ("module", "ref")
