"""The general visitor: every node once, with the context it runs in (module, host or kernel).

The per-node rules live here: names and attributes resolved to paths and judged against the
allowlists, builtins that reach code, frames or the process, calls allowed at import time, stores
that patch modules or keep state, decorators and defaults, and what may appear inside a kernel.
"""

from __future__ import annotations

import ast

from gpuyantra.verifier.static.base import _CheckerBase
from gpuyantra.verifier.static.scopes import _Func, _FunctionNode, _root_name
from gpuyantra.verifier.static.tables import (
    BUILTIN_NAMES,
    DYNAMIC_CODE_BUILTINS,
    EXIT_BUILTINS,
    EXIT_EXCEPTIONS,
    FILE_IO_BUILTINS,
    FRAME_ATTRS,
    HOST_DECORATORS,
    IMPORT_TIME_BUILTINS,
    IMPORT_TIME_CALLS,
    INTROSPECTION_BUILTINS,
    JIT_BUILTINS,
    KERNEL_ATTRS,
    MUTATING_METHODS,
    TENSOR_COMPUTE_METHODS,
    TORCH_DTYPES,
)


class _NodeRules(_CheckerBase):
    """Per-node rules, in one walk that knows where code runs: at import, on the host or in a kernel."""

    def _visit(self, node: ast.AST, ctx: str, func: _Func | None, annotation: bool) -> None:
        """ctx: module | host | jit. Walks every node once, with the context it runs in."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            self._visit_function(node, ctx, func)
            return
        if isinstance(node, ast.ClassDef):
            if ctx != "module":
                self.fail("mutable-state", node, f"class {node.name}: classes can carry state between calls")
            for child in ast.iter_child_nodes(node):
                self._visit(child, "module", None, annotation)
            return
        self._check_node(node, ctx, func, annotation)
        for name, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            for child in children:
                if isinstance(child, ast.AST):
                    child_annotation = annotation or (isinstance(node, ast.AnnAssign) and name == "annotation")
                    self._visit(child, ctx, func, child_annotation)

    def _visit_function(self, node: _FunctionNode, ctx: str, func: _Func | None) -> None:
        is_lambda = isinstance(node, ast.Lambda)
        name = getattr(node, "name", "<lambda>")
        is_jit = not is_lambda and isinstance(node, ast.FunctionDef) and self._is_jit(node)
        if isinstance(node, ast.AsyncFunctionDef) and ctx != "module":
            self.fail("concurrency", node, f"async def {node.name}: no async code")
        # Decorators and defaults run in the enclosing context.
        for dec in getattr(node, "decorator_list", []):
            path = self._decorator_path(dec)
            if is_jit:
                if path not in ("triton.jit", "triton.autotune", "triton.heuristics"):
                    self.fail(
                        "import-time-code",
                        dec,
                        f"decorator {ast.unparse(dec)} on a kernel: only "
                        "triton.jit, triton.autotune and triton.heuristics",
                    )
            elif path not in HOST_DECORATORS:
                self.fail(
                    "import-time-code",
                    dec,
                    f"decorator {ast.unparse(dec)} on {name}: decorators can wrap or replace the function",
                )
            self._visit(dec, ctx, func, False)
        args = node.args
        for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
            if not isinstance(default, ast.Constant) and not (
                isinstance(default, ast.Tuple) and all(isinstance(e, ast.Constant) for e in default.elts)
            ):
                if isinstance(
                    default, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp, ast.Call)
                ):
                    self.fail("mutable-state", default, "mutable default argument: it persists between calls")
            self._visit(default, ctx, func, False)
        for arg in args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]:
            if arg.annotation is not None:
                self._visit(arg.annotation, ctx, func, True)
        if not isinstance(node, ast.Lambda) and node.returns is not None:
            self._visit(node.returns, ctx, func, True)
        inner: _Func | None
        if is_jit:
            if ctx != "module":
                self.fail(
                    "kernel-host-code",
                    node,
                    f"kernel {name} is defined inside a function; define kernels at module level",
                )
            inner_ctx, inner = "jit", _Func(node, name)
        else:
            inner = self.funcs.get(name) if ctx == "module" and not is_lambda else None
            if inner is None or inner.node is not node:
                inner = next((f for f in self.funcs.values() if f.node is node), None) or _Func(node, name)
            inner_ctx = "host"
            inner.enclosing = func
            self.all_host_funcs.append(inner)
        body = node.body if isinstance(node.body, list) else [node.body]
        for stmt in body:
            self._visit(stmt, inner_ctx, inner, False)

    def _check_node(self, node: ast.AST, ctx: str, func: _Func | None, annotation: bool) -> None:
        parent = self.parents.get(id(node))
        if isinstance(node, (ast.Try,)) or type(node).__name__ == "TryStar":
            self.fail("try-except", node, "try/except: a fallback path hides failures (and may run the reference)")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            self.fail(
                "mutable-state",
                node,
                f"{type(node).__name__.lower()} {', '.join(node.names)}: state shared between calls",
            )
        elif isinstance(node, (ast.Await, ast.AsyncFor, ast.AsyncWith)):
            self.fail("concurrency", node, "async code")
        elif isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in EXIT_EXCEPTIONS:
                self.fail("process-exit", node, f"raise {exc.id}: leaving the process before the verdict")
        elif isinstance(node, ast.Name):
            self._check_name(node, ctx, func, annotation, parent)
        elif isinstance(node, ast.Attribute):
            self._check_attribute(node, ctx, func, annotation, parent)
        elif isinstance(node, ast.Call):
            self._check_call(node, ctx, func, annotation)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                self._check_store(target, ctx, func, node)
        elif isinstance(node, (ast.For, ast.comprehension, ast.withitem, ast.NamedExpr)):
            bound = getattr(node, "target", None) or getattr(node, "optional_vars", None)
            if bound is not None:
                self._check_store(bound, ctx, func, node)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and ctx != "jit":
            self.fail("torch-compute", node, "the @ operator computes a matmul in torch")

    def _check_name(
        self, node: ast.Name, ctx: str, func: _Func | None, annotation: bool, parent: ast.AST | None
    ) -> None:
        name = node.id
        if name.startswith("__") and name.endswith("__") and name not in DYNAMIC_CODE_BUILTINS:
            self.fail("introspection", node, f"{name}: dunder names reach interpreter internals")
            return
        if not isinstance(node.ctx, ast.Load):
            if ctx == "module" and name in self.aliases:
                self.fail("monkeypatch", node, f"rebinding the imported name {name}")
            return
        shadowed = self._is_local(name, func) or name in self.module_kinds
        if not shadowed and name in BUILTIN_NAMES:
            if name in DYNAMIC_CODE_BUILTINS:
                self.fail("dynamic-code", node, f"{name}(): code the checker cannot see")
            elif name in INTROSPECTION_BUILTINS:
                self.fail("introspection", node, f"{name}(): reads namespaces of the harness")
            elif name in FILE_IO_BUILTINS:
                self.fail("file-io", node, f"{name}(): no file or terminal access")
            elif name in EXIT_BUILTINS or name in EXIT_EXCEPTIONS:
                self.fail("process-exit", node, f"{name}: leaving the process before the verdict")
            elif name in ("setattr", "delattr") and not (isinstance(parent, ast.Call) and parent.func is node):
                self.fail("mutable-state", node, f"{name} used as a value")
        if name in self.aliases and not self._is_local(name, func):
            path = self.aliases[name]
            if ctx == "jit":
                if path.split(".")[0] == "torch":
                    self.fail(
                        "torch-compute",
                        node,
                        f"{path} inside a @triton.jit kernel: under the interpreter it would run as host torch code",
                    )
                elif self._outermost(node):
                    self._check_reach(path, node)  # under the interpreter a kernel body is Python
                return
            if self._outermost(node):
                self._check_path(path, node, bare=True, context=self._path_context(node, annotation))
            return
        kind = self.module_kinds.get(name)
        if ctx == "jit":
            if self._is_local(name, func) or kind in ("kernel", "const") or (not shadowed and name in JIT_BUILTINS):
                return
            if kind is None and not shadowed and name in BUILTIN_NAMES:
                self.fail("kernel-host-code", node, f"builtin {name} inside a @triton.jit kernel")
            elif kind is not None:
                self.fail(
                    "kernel-host-code",
                    node,
                    f"{name} ({kind} at module level) used inside a @triton.jit "
                    "kernel: kernels may use only triton, constants and other kernels",
                )
            return
        if ctx == "host" and not self._is_local(name, func):
            if kind == "mutable" and not self._read_only_use(node, parent):
                self.fail(
                    "mutable-state",
                    node,
                    f"module-level object {name} used inside a function other than "
                    "by indexing: a cache or shared buffer",
                )
            elif kind == "kernel":
                if isinstance(parent, ast.Call) and parent.func is node:
                    self.fail(
                        "kernel-host-code",
                        node,
                        f"{name}(...) calls a kernel as a Python function; launch it as {name}[grid](...)",
                    )
            elif func is not None and func.enclosing is not None and self._is_nonlocal_var(name, func):
                if isinstance(parent, ast.Attribute) and parent.value is node and parent.attr in MUTATING_METHODS:
                    self.fail("mutable-state", node, f"{name}.{parent.attr}(): mutating a closure variable")

    def _read_only_use(self, node: ast.Name, parent: ast.AST | None) -> bool:
        if isinstance(parent, ast.Subscript) and parent.value is node and isinstance(parent.ctx, ast.Load):
            return True
        if isinstance(parent, ast.Compare) and node in parent.comparators:
            return all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops)
        if isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is node:
            return True
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "len":
            return True
        return False

    def _path_context(self, node: ast.AST, annotation: bool) -> str:
        if annotation:
            return "annotation"
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Tuple):
            parent = self.parents.get(id(parent))
        if (
            isinstance(parent, ast.Call)
            and isinstance(parent.func, ast.Name)
            and parent.func.id in ("isinstance", "issubclass")
            and len(parent.args) == 2
        ):
            return "isinstance"
        return "value"

    def _check_attribute(
        self, node: ast.Attribute, ctx: str, func: _Func | None, annotation: bool, parent: ast.AST | None
    ) -> None:
        attr = node.attr
        if attr.startswith("__") and attr.endswith("__"):
            self.fail("introspection", node, f".{attr}: dunder attributes reach interpreter internals")
            return
        if attr in FRAME_ATTRS:
            self.fail("introspection", node, f".{attr}: frame and code objects reach the harness")
            return
        if not isinstance(node.ctx, ast.Load):
            return  # stores are checked by _check_store
        path = self._resolve(node)
        if path is not None:
            if ctx == "jit":
                if path.split(".")[0] == "torch" and self._outermost(node):
                    self.fail("torch-compute", node, f"{path} inside a @triton.jit kernel")
                elif self._outermost(node):
                    self._check_reach(path, node)
                return
            if self._outermost(node):
                self._check_path(path, node, bare=True, context=self._path_context(node, annotation))
            return
        if ctx == "jit":
            return
        base = node.value
        if (
            isinstance(base, ast.Name)
            and self.module_kinds.get(base.id) == "kernel"
            and not self._is_local(base.id, func)
        ):
            if attr not in KERNEL_ATTRS:
                self.fail("introspection", node, f"{base.id}.{attr}: reads kernel internals")
            return
        if attr.startswith("_"):
            self.fail("private-api", node, f".{attr}: private attributes")
        elif attr in TENSOR_COMPUTE_METHODS:
            self.fail(
                "torch-compute",
                node,
                f".{attr}(): tensor method computes in torch on the host; the op "
                "must run in the candidate's Triton kernel",
            )

    def _check_call(self, node: ast.Call, ctx: str, func: _Func | None, annotation: bool) -> None:
        fn = node.func
        if annotation:
            self.fail("import-time-code", node, "call inside an annotation runs at import")
        if self._is_const_getattr(node) and self._outermost(node):
            path = self._resolve(node)
            if path is not None:
                if ctx == "jit":
                    if path.split(".")[0] == "torch":
                        self.fail("torch-compute", node, f"{path} inside a @triton.jit kernel")
                    else:
                        self._check_reach(path, node)
                else:
                    self._check_path(path, node, bare=True, context="value")
        if isinstance(fn, ast.Name) and not self._is_local(fn.id, func) and fn.id not in self.module_kinds:
            if fn.id in ("getattr", "hasattr") and not (
                len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            ):
                self.fail("introspection", node, f"{fn.id} with a computed attribute name")
            elif fn.id == "getattr" and isinstance(node.args[1], ast.Constant):
                attr = node.args[1].value
                if isinstance(attr, str) and self._resolve(node.args[0]) is None:  # a str: see the branch above
                    if attr.startswith("__") or attr in FRAME_ATTRS:
                        self.fail("introspection", node, f"getattr(..., {attr!r})")
                    elif ctx != "jit" and attr in TENSOR_COMPUTE_METHODS:
                        self.fail("torch-compute", node, f"getattr(..., {attr!r}): tensor method computes in torch")
                    elif attr.startswith("_"):
                        self.fail("private-api", node, f"getattr(..., {attr!r}): private attributes")
            elif fn.id in ("setattr", "delattr"):
                target = node.args[0] if node.args else None
                if target is not None and self._resolve(target) is not None:
                    self.fail("monkeypatch", node, f"{fn.id} on {self._resolve(target)}")
                else:
                    self.fail("mutable-state", node, f"{fn.id}(): storing state on objects")
            elif fn.id == "type" and len(node.args) == 3:
                self.fail("dynamic-code", node, "type(name, bases, dict) builds a class at runtime")
        if ctx == "module" and not annotation:
            path = self._resolve(fn)
            ok = (
                path in IMPORT_TIME_CALLS
                or (path or "").startswith(("math.", "typing.", "triton.language."))
                or path in TORCH_DTYPES
                or (isinstance(fn, ast.Name) and fn.id in IMPORT_TIME_BUILTINS and fn.id not in self.module_kinds)
            )
            if not ok:
                self.fail("import-time-code", node, f"{ast.unparse(fn)}(...) is called at import time")
        if ctx == "host" and isinstance(fn, ast.Attribute) and fn.attr in MUTATING_METHODS:
            root = _root_name(fn.value)
            if (
                root is not None
                and self._is_nonlocal_var(root, func)
                and self.module_kinds.get(root) not in ("kernel", "func")
            ):
                self.fail("mutable-state", node, f"{root}...{fn.attr}(): mutating an object that outlives the call")

    def _check_store(self, target: ast.AST, ctx: str, func: _Func | None, stmt: ast.AST) -> None:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Starred):
                continue
            if isinstance(sub, (ast.Attribute, ast.Subscript)) and not isinstance(sub.ctx, ast.Load):
                root = _root_name(sub)
                path = self._resolve(sub.value)
                if root == "__builtins__":
                    self.fail("monkeypatch", stmt, "assigning into __builtins__")
                elif path is not None or (root in self.aliases and not self._is_local(root, func)):
                    self.fail("monkeypatch", stmt, f"assigning into {path or root}: patching imported modules")
                elif isinstance(sub, ast.Attribute):
                    self.fail("mutable-state", stmt, f"attribute store .{sub.attr}: state on objects outlives the call")
                elif (
                    ctx == "module"
                    or (root is not None and self._is_nonlocal_var(root, func))
                    or (root is not None and ctx == "jit" and not self._is_local(root, func))
                ):
                    self.fail(
                        "mutable-state",
                        stmt,
                        f"item store into {root}: a module-level or closure object outlives the call",
                    )
            elif (
                isinstance(sub, ast.Name)
                and not isinstance(sub.ctx, ast.Load)
                and ctx == "module"
                and sub.id in BUILTIN_NAMES
                and not sub.id.startswith("_")
            ):
                self.fail("monkeypatch", stmt, f"rebinding the builtin {sub.id} at module level")
