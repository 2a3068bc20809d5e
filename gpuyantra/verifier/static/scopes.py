"""AST helpers that respect function scopes, and `_Func`, the facts the rules keep per host function.

The dataflow rules (taint, launches, returns) look at one function at a time; these walks stop at
nested functions, lambdas and classes, which get their own `_Func`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` never runs when the verifier imports the file under another name."""
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
        and not node.orelse
    )


def _walk_no_nested(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk that does not descend into nested functions, lambdas or classes."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        yield child
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(child))


_FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


def _body_nodes(func: _FunctionNode) -> Iterator[ast.AST]:
    """Nodes of a function's body (and default values, which run at definition)."""
    body = func.body if isinstance(func.body, list) else [func.body]
    for stmt in body:
        yield stmt
        yield from _walk_no_nested(stmt)


def _root_name(expr: ast.AST) -> str | None:
    """The variable a value expression hangs off: `y.view(-1)[0].T` -> `y`."""
    while True:
        if isinstance(expr, ast.Name):
            return expr.id
        if isinstance(expr, (ast.Attribute, ast.Subscript, ast.Starred)):
            expr = expr.value
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
            expr = expr.func.value
        else:
            return None


class _Func:
    """Per host-function facts for the dataflow rules."""

    def __init__(self, node: _FunctionNode, name: str):
        self.node = node
        self.name = name
        args = node.args
        self.params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        if args.vararg:
            self.params.append(args.vararg.arg)
        if args.kwarg:
            self.params.append(args.kwarg.arg)
        self.locals: set[str] = set(self.params)
        # Its body's nodes, walked once: the dataflow rules pass over them again and again (fixpoints).
        self.body: list[ast.AST] = list(_body_nodes(node))
        for sub in self.body:
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                self.locals.add(sub.id)
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.locals.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                for alias in sub.names:
                    self.locals.add((alias.asname or alias.name).split(".")[0])
            elif isinstance(sub, ast.arg):
                self.locals.add(sub.arg)
        self.tainted: set[str] = set()  # names that hold tensors (for operator checks)
        self.must_launch = False  # every path through it launches a kernel
        self.returns_kernel_output = False  # every return is a buffer a launch wrote
        self.returns_fresh = False  # every return is a fresh allocation
        self.enclosing: _Func | None = None  # for nested functions and closures
        self.kernel_aliases: dict[str, set[str]] = {}  # local name -> kernels it may hold
        self.shape_names: set[str] = set()  # locals derived from shapes, dtypes, strides
