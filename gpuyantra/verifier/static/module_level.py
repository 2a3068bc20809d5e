"""The module's top level: what each name is bound to (module, kernel, function, constant or mutable
state), which statements may run at import, and the contract literals.

OP, ADAPTER and entry's signature are read here as literals, without running anything, for the
contract layer (`StaticReport.op`, `.adapter`, `.entry`).
"""

from __future__ import annotations

import ast

from gpuyantra.verifier.static.base import _CheckerBase
from gpuyantra.verifier.static.report import EntryInfo
from gpuyantra.verifier.static.scopes import _Func
from gpuyantra.verifier.static.tables import TORCH_ALLOC, TORCH_DTYPES


class _ModuleLevel(_CheckerBase):
    """Top-level bindings, import-time statements, and the contract literals."""

    def _module_level(self) -> None:
        for stmt in self.tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for alias in stmt.names:
                    name = (
                        (alias.asname or alias.name).split(".")[0]
                        if isinstance(stmt, ast.Import)
                        else (alias.asname or alias.name)
                    )
                    self._bind(name, "module" if isinstance(stmt, ast.Import) else "ref")
            elif isinstance(stmt, ast.FunctionDef):
                if self._is_jit(stmt):
                    self.kernels[stmt.name] = stmt
                    self._bind(stmt.name, "kernel")
                else:
                    self._bind(stmt.name, "func")
                    self.funcs[stmt.name] = _Func(stmt, stmt.name)
            elif isinstance(stmt, ast.AsyncFunctionDef):
                self._bind(stmt.name, "func")
                self.fail("concurrency", stmt, f"async def {stmt.name}: no async code")
            elif isinstance(stmt, ast.ClassDef):
                self._bind(stmt.name, "mutable")
                self.fail(
                    "mutable-state",
                    stmt,
                    f"class {stmt.name}: classes can carry state between calls; write plain functions",
                )
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                value = stmt.value
                if value is None:
                    continue
                for target in targets:
                    if isinstance(target, ast.Name):
                        if isinstance(value, ast.Lambda):
                            self._bind(target.id, "func")
                            self.funcs[target.id] = _Func(value, target.id)
                        else:
                            self._bind(target.id, "const" if self._is_const(value) else "mutable")
                    elif isinstance(target, (ast.Tuple, ast.List)):
                        for elt in ast.walk(target):
                            if isinstance(elt, ast.Name):
                                self._bind(elt.id, "mutable")
                        self.fail("import-time-code", stmt, "unpacking assignment at module level")
                    # attribute / subscript targets are reported by the general visitor
                if isinstance(value, ast.Call) and self._resolve(value.func) in TORCH_ALLOC:
                    self.fail(
                        "mutable-state",
                        stmt,
                        "module-level tensor: a buffer allocated at import outlives calls (returned twice, or a cache)",
                    )
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # docstring
            elif isinstance(stmt, ast.Try):
                self.fail("import-time-code", stmt, "try at module level runs code at import")
            else:
                self.fail(
                    "import-time-code",
                    stmt,
                    f"{type(stmt).__name__} statement at module level runs "
                    "code at import; the module may hold only imports, definitions and constants",
                )
        # OP, ADAPTER and entry as the contract layer needs them, read without running anything.
        for stmt in self.tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                name = stmt.targets[0].id
                if name == "OP":
                    if isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                        self.report.op = stmt.value.value
                    else:
                        self.report.op_error = "OP must be a string literal"
                elif name == "ADAPTER":
                    try:
                        self.report.adapter = ast.literal_eval(stmt.value)
                    except (ValueError, SyntaxError, TypeError, RecursionError):
                        self.report.adapter_error = "ADAPTER must be a literal list of dicts"
        for name in ("OP", "ADAPTER"):
            if self.module_bindings.get(name, 0) > 1:
                setattr(self.report, f"{name.lower()}_error", f"{name} is bound more than once")
        if self.report.op is None and self.report.op_error is None:
            self.report.op_error = "the file defines no OP"
        if self.report.adapter is None and self.report.adapter_error is None:
            self.report.adapter_error = "the file defines no ADAPTER"
        entry = next(
            (s for s in self.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == "entry"),
            None,
        )
        if entry is not None:
            a = entry.args
            kw_required = [arg.arg for arg, default in zip(a.kwonlyargs, a.kw_defaults) if default is None]
            self.report.entry = EntryInfo(
                lineno=entry.lineno,
                positional=[x.arg for x in a.posonlyargs + a.args],
                kwonly=[x.arg for x in a.kwonlyargs],
                kwonly_required=kw_required,
                vararg=a.vararg is not None,
                kwarg=a.kwarg is not None,
                is_async=isinstance(entry, ast.AsyncFunctionDef),
                definitions=self.module_bindings.get("entry", 0),
            )

    def _bind(self, name: str, kind: str) -> None:
        self.module_bindings[name] = self.module_bindings.get(name, 0) + 1
        if name in self.module_kinds and self.module_kinds[name] != kind:
            kind = "mutable"  # rebound with something else: treat as state
        self.module_kinds[name] = kind

    def _is_const(self, value: ast.AST) -> bool:
        if isinstance(value, ast.Constant):
            return True
        if isinstance(value, ast.Tuple):
            return all(self._is_const(e) for e in value.elts)
        if isinstance(value, ast.UnaryOp):
            return self._is_const(value.operand)
        if isinstance(value, ast.BinOp):
            return self._is_const(value.left) and self._is_const(value.right)
        if isinstance(value, ast.Name):
            return self.module_kinds.get(value.id) == "const"
        if isinstance(value, ast.Attribute):
            path = self._resolve(value)
            return path is not None and (
                path in TORCH_DTYPES or path.startswith("triton.language.") or path.startswith("math.")
            )
        if isinstance(value, ast.Call):
            path = self._resolve(value.func)
            pure = (
                path in ("triton.next_power_of_2", "triton.cdiv", "triton.language.constexpr")
                or (path or "").startswith("math.")
                or (isinstance(value.func, ast.Name) and value.func.id in ("int", "float", "bool", "min", "max", "abs"))
            )
            return pure and all(self._is_const(a) for a in value.args) and not value.keywords
        return False
