"""Launches, returns and guards: entry must launch the file's kernels on every path and return
buffers those kernels wrote.

Paths through each host function are followed statement by statement; a fixpoint finds the helpers
that always launch and those that return fresh or kernel-written buffers. `_launch_rules` then
reports kernels never launched from entry (decoys), paths that return or finish without a launch,
returns that are not kernel outputs, and fallbacks taken under a shape or dtype guard.
"""

from __future__ import annotations

import ast

from gpuyantra.verifier.static.base import _CheckerBase
from gpuyantra.verifier.static.scopes import _Func, _walk_no_nested
from gpuyantra.verifier.static.tables import SHAPE_ATTRS, TORCH_ALLOC


class _LaunchRules(_CheckerBase):
    """Path analysis of host functions, and the rules on what entry launches and returns."""

    def _kernel_alias_targets(self, f: _Func) -> dict[str, set[str]]:
        """Local names bound to kernels: `k = _a` or `k = _a if cond else _b`."""
        result: dict[str, set[str]] = {}
        for sub in f.body:
            if isinstance(sub, ast.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):
                found = {n.id for n in ast.walk(sub.value) if isinstance(n, ast.Name) and n.id in self.kernels}
                if found and isinstance(sub.value, (ast.Name, ast.IfExp)):
                    result.setdefault(sub.targets[0].id, set()).update(found)
        return result

    def _launch_of(self, call: ast.AST, f: _Func) -> set[str] | None:
        """Kernels a call launches (empty set: launches something not statically known), or None."""
        if not isinstance(call, ast.Call):
            return None
        fn = call.func
        if isinstance(fn, ast.Subscript):
            base = fn.value
        elif isinstance(fn, ast.Attribute) and fn.attr == "run":
            base = fn.value
        else:
            return None
        if isinstance(base, ast.Name):
            if base.id in self.kernels and not self._is_local(base.id, f):
                return {base.id}
            if base.id in f.kernel_aliases:
                return set(f.kernel_aliases[base.id])
            if self._is_local(base.id, f):
                return set()
        return None

    def _contains_launch(self, node: ast.AST, f: _Func) -> bool:
        nodes = [node] + list(_walk_no_nested(node)) if not isinstance(node, list) else []
        for sub in nodes:
            if self._launch_of(sub, f) is not None:
                return True
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Name)
                and sub.func.id in self.funcs
                and not self._is_local(sub.func.id, f)
                and self.funcs[sub.func.id].must_launch
            ):
                return True
        return False

    def _guarded(self, test: ast.AST, f: _Func) -> bool:
        shape_names = f.shape_names
        for sub in ast.walk(test):
            if isinstance(sub, ast.Attribute) and sub.attr in SHAPE_ATTRS:
                return True
            if isinstance(sub, ast.Name) and sub.id in shape_names:
                return True
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in ("len", "isinstance"):
                return True
        return False

    def _shape_names(self, f: _Func) -> set[str]:
        names: set[str] = set()
        for _ in range(10):
            before = len(names)
            for sub in f.body:
                if isinstance(sub, ast.Assign):
                    value_shapey = any(
                        (isinstance(n, ast.Attribute) and n.attr in SHAPE_ATTRS)
                        or (isinstance(n, ast.Name) and n.id in names)
                        for n in ast.walk(sub.value)
                    )
                    if value_shapey:
                        for target in sub.targets:
                            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if len(names) == before:
                break
        return names

    def _walk_paths(
        self, stmts: list[ast.stmt], launched: bool, guards: list[ast.AST], f: _Func, violations: list, returns: list
    ) -> bool | None:
        """Follows paths through `stmts`; returns whether a launch happened, None when all paths ended."""
        for stmt in stmts:
            if isinstance(stmt, ast.Return):
                returns.append((stmt, stmt.value, list(guards)))
                if not (launched or (stmt.value is not None and self._contains_launch(stmt.value, f))):
                    violations.append((stmt, list(guards), "return"))
                return None
            if isinstance(stmt, ast.Raise):
                return None
            if isinstance(stmt, ast.If):
                inner = guards + [stmt] if self._guarded(stmt.test, f) else guards
                a = self._walk_paths(
                    stmt.body, launched or self._contains_launch(stmt.test, f), inner, f, violations, returns
                )
                b = self._walk_paths(
                    stmt.orelse, launched or self._contains_launch(stmt.test, f), inner, f, violations, returns
                )
                if a is None and b is None:
                    return None
                after_a = True if a is None else a
                after_b = True if b is None else b
                if not launched and a is not None and b is not None and after_a != after_b and inner is not guards:
                    violations.append((stmt, inner, "skip"))
                launched = after_a and after_b
                continue
            if isinstance(stmt, (ast.For, ast.While)):
                test = stmt.test if isinstance(stmt, ast.While) else stmt.iter
                inner = guards + [stmt] if isinstance(stmt, ast.While) and self._guarded(test, f) else guards
                a = self._walk_paths(stmt.body, launched, inner, f, violations, returns)
                launched = launched or bool(a) or self._contains_launch(test, f)
                continue
            if isinstance(stmt, (ast.With, ast.Try, ast.TryStar)):
                for item in getattr(stmt, "items", []):
                    launched = launched or self._contains_launch(item.context_expr, f)
                a = self._walk_paths(stmt.body, launched, guards, f, violations, returns)
                if a is None:
                    return None
                launched = a
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            launched = launched or self._contains_launch(stmt, f)
        return launched

    def _analyse_paths(self, f: _Func) -> tuple[bool, list, list]:
        f.kernel_aliases = self._kernel_alias_targets(f)
        f.shape_names = self._shape_names(f)
        violations: list = []
        returns: list = []
        if isinstance(f.node, ast.Lambda):
            launched = self._contains_launch(f.node.body, f)
            returns.append((f.node.body, f.node.body, []))
            if not launched:
                violations.append((f.node.body, [], "return"))
            return launched, violations, returns
        end = self._walk_paths(f.node.body, False, [], f, violations, returns)
        if end is False:
            violations.append((f.node, [], "end"))
        return not violations, violations, returns

    def _launch_fixpoint(self) -> None:
        for _ in range(len(self.funcs) + 2):
            changed = False
            for f in self.funcs.values():
                ok, _, _ = self._analyse_paths(f)
                if ok and not f.must_launch:
                    f.must_launch = True
                    changed = True
                fresh = self._returns_fresh(f)
                kernel_out = self._returns_kernel_output(f)
                if fresh != f.returns_fresh or kernel_out != f.returns_kernel_output:
                    f.returns_fresh, f.returns_kernel_output = fresh, kernel_out
                    changed = True
            if not changed:
                break

    def _groups(self, f: _Func) -> dict[str, str]:
        """Union-find over local names linked by views/aliases (`y2 = y.reshape(...)`)."""
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            while parent.setdefault(x, x) != x:
                x = parent[x]
            return x

        for sub in f.body:
            if isinstance(sub, (ast.Assign, ast.AnnAssign)) and sub.value is not None:
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                root = self._value_root(sub.value)
                if root is None:
                    continue
                for target in targets:
                    for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                        parent[find(name)] = find(root)
        return {name: find(name) for name in list(parent)}

    def _base(self, expr: ast.AST) -> ast.AST:
        """Strip views and indexing, stopping at calls of module functions (`torch.empty_like(x)`)."""
        while True:
            if isinstance(expr, (ast.Attribute, ast.Subscript, ast.Starred)) and self._resolve(expr) is None:
                expr = expr.value
            elif (
                isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and self._resolve(expr.func) is None
            ):
                expr = expr.func.value
            else:
                return expr

    def _value_root(self, expr: ast.AST) -> str | None:
        """Like _root_name, but `torch.empty(...)` or `triton.cdiv(...)` hang off no variable."""
        base = self._base(expr)
        if isinstance(base, ast.Name) and base.id not in self.aliases:
            return base.id
        return None

    def _fresh_names(self, f: _Func) -> tuple[set[str], set[str]]:
        """(names bound to fresh allocations, names bound to kernel outputs of helpers)."""
        fresh, outputs = set(), set()
        for sub in f.body:
            if isinstance(sub, (ast.Assign, ast.AnnAssign)) and isinstance(sub.value, ast.Call):
                call = sub.value
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                path = self._resolve(call.func)
                helper = (
                    self.funcs.get(call.func.id)
                    if isinstance(call.func, ast.Name) and not self._is_local(call.func.id, f)
                    else None
                )
                if path in TORCH_ALLOC or (
                    isinstance(call.func, ast.Attribute)
                    and path is None
                    and call.func.attr in ("new_empty", "new_zeros", "new_empty_strided", "clone")
                ):
                    fresh.update(names)
                elif helper is not None and helper.returns_kernel_output:
                    outputs.update(names)
                elif helper is not None and helper.returns_fresh:
                    fresh.update(names)
        return fresh, outputs

    def _launched_names(self, f: _Func) -> set[str]:
        names: set[str] = set()
        for sub in f.body:
            if isinstance(sub, ast.Call) and self._launch_of(sub, f) is not None:
                for arg in list(sub.args) + [k.value for k in sub.keywords]:
                    names.update(n.id for n in ast.walk(arg) if isinstance(n, ast.Name))
            elif (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Name)
                and sub.func.id in self.funcs
                and self.funcs[sub.func.id].must_launch
            ):
                for arg in list(sub.args) + [k.value for k in sub.keywords]:
                    names.update(n.id for n in ast.walk(arg) if isinstance(n, ast.Name))
        return names

    def _return_elements(
        self, value: ast.AST | None, f: _Func | None = None, guard: ast.AST | None = None
    ) -> list[tuple[ast.AST | None, ast.AST | None]]:
        """(element, shape/dtype test it depends on or None) for each returned value."""
        if isinstance(value, (ast.Tuple, ast.List)):
            return [e for v in value.elts for e in self._return_elements(v, f, guard)]
        if isinstance(value, ast.IfExp):
            inner = value.test if guard is None and f is not None and self._guarded(value.test, f) else guard
            return self._return_elements(value.body, f, inner) + self._return_elements(value.orelse, f, inner)
        return [(value, guard)]

    def _element_ok(self, element: ast.AST | None, f: _Func, want: str) -> bool:
        """want: 'kernel' (a buffer a launch wrote) or 'fresh' (a new allocation)."""
        if element is None:
            return False
        element = self._base(element)
        if (
            isinstance(element, ast.Call)
            and isinstance(element.func, ast.Name)
            and element.func.id in self.funcs
            and not self._is_local(element.func.id, f)
        ):
            helper = self.funcs[element.func.id]
            return (
                helper.returns_kernel_output
                if want == "kernel"
                else (helper.returns_fresh or helper.returns_kernel_output)
            )
        if isinstance(element, ast.Call) and want == "fresh" and self._resolve(element.func) in TORCH_ALLOC:
            return True
        root = element.id if isinstance(element, ast.Name) and element.id not in self.aliases else None
        if root is None:
            return False
        groups = self._groups(f)
        fresh, outputs = self._fresh_names(f)
        group = groups.get(root, root)
        members = {n for n, g in groups.items() if g == group} | {root}
        if members & outputs:
            return True
        if want == "fresh":
            return bool(members & fresh)
        return bool(members & fresh) and bool(members & self._launched_names(f))

    def _returns_kernel_output(self, f: _Func) -> bool:
        _, _, returns = self._analyse_paths(f)
        elements = [e for _, value, _ in returns for e, _ in self._return_elements(value)]
        return bool(elements) and all(self._element_ok(e, f, "kernel") for e in elements)

    def _returns_fresh(self, f: _Func) -> bool:
        _, _, returns = self._analyse_paths(f)
        elements = [e for _, value, _ in returns for e, _ in self._return_elements(value)]
        return bool(elements) and all(self._element_ok(e, f, "fresh") for e in elements)

    def _launch_rules(self) -> None:
        entry = self.funcs.get("entry")
        if entry is None:
            return  # the contract layer reports a missing entry
        # Reachable host functions: everything entry references, transitively.
        reachable: list[_Func] = []
        todo = [entry]
        while todo:
            f = todo.pop()
            if f in reachable:
                continue
            reachable.append(f)
            for sub in f.body:
                if isinstance(sub, ast.Name) and sub.id in self.funcs and not self._is_local(sub.id, f):
                    todo.append(self.funcs[sub.id])
        reachable_nodes = {id(f.node) for f in reachable}
        nested = [
            f
            for f in self.all_host_funcs
            if id(f.node) not in reachable_nodes and any(f.enclosing is r for r in reachable)
        ]
        launched: set[str] = set()
        indirect = False
        referenced: set[str] = set()
        for f in reachable + nested:
            f.kernel_aliases = self._kernel_alias_targets(f)
            for sub in f.body:
                kernels = self._launch_of(sub, f)
                if kernels is not None:
                    launched |= kernels
                    indirect = indirect or not kernels
                if isinstance(sub, ast.Name) and sub.id in self.kernels:
                    referenced.add(sub.id)
        if indirect:
            launched |= referenced
        # Device functions called from launched kernels are used too.
        used = set(launched)
        todo_k = list(launched)
        while todo_k:
            name = todo_k.pop()
            for sub in ast.walk(self.kernels[name]):
                if isinstance(sub, ast.Name) and sub.id in self.kernels and sub.id not in used:
                    used.add(sub.id)
                    todo_k.append(sub.id)
        if not self.kernels:
            self.fail("kernel-not-launched", None, "the file defines no @triton.jit kernel")
        elif not launched:
            self.fail("kernel-not-launched", entry.node, "entry launches none of the file's @triton.jit kernels")
        for name in sorted(set(self.kernels) - used):
            self.fail(
                "kernel-not-launched",
                self.kernels[name],
                f"kernel {name} is defined but never launched from entry (a decoy)",
            )
        if not self.kernels or not launched:
            return
        ok, violations, returns = self._analyse_paths(entry)
        flagged_lines: set[int] = set()
        for node, guards, kind in violations:
            line = getattr(node, "lineno", 0)
            if guards:
                g = guards[-1]
                flagged_lines.add(line)
                what = "returns without launching a kernel" if kind == "return" else "skips the kernel launch"
                self.fail(
                    "guarded-fallback",
                    node,
                    f"entry {what} under the guard "
                    f"`{ast.unparse(getattr(g, 'test', g))}` (line {g.lineno}): shape/dtype-specific fallback",
                )
            elif kind == "end":
                self.fail("kernel-not-launched", node, "entry can finish without launching a kernel")
            else:
                flagged_lines.add(line)
                self.fail("kernel-not-launched", node, "entry can return without launching a kernel")
        for node, value, guards in returns:
            line = getattr(node, "lineno", 0)
            if line in flagged_lines:
                continue
            for element, guard in self._return_elements(value, entry):
                if not self._element_ok(element, entry, "kernel"):
                    text = ast.unparse(element) if element is not None else "None"
                    test = guard if guard is not None else (getattr(guards[-1], "test", guards[-1]) if guards else None)
                    if test is not None:
                        self.fail(
                            "guarded-fallback",
                            node,
                            f"entry returns {text} under the guard "
                            f"`{ast.unparse(test)}`: not a buffer its kernel wrote",
                        )
                    else:
                        self.fail(
                            "return-not-from-kernel",
                            node,
                            f"entry returns {text}, which is not a fresh buffer passed to a kernel launch",
                        )
                    break
