"""Layer 1: static analysis of the candidate's AST, before any of it runs.

The checker reads the source once (the sandbox later runs a copy of exactly that text) and reports
every rule it breaks. It is conservative: every load of a torch attribute anywhere in host code is
checked against a small allowlist (allocation and metadata), so a reference stored in a list, a
default argument or a dict is caught where it is taken, not where it is called. Import aliases and
`getattr(module, "literal")` resolve to dotted paths; any other way to reach a module object
(passing `torch` around as a value, computed getattr names, dunders, frames) is itself a failure.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeGuard, cast

import torch

from gpuyantra.verifier.verdict import Failure

LAYER = "static"

ALLOWED_MODULES = frozenset({"torch", "triton", "triton.language", "math", "typing", "__future__"})
ALLOWED_MODULE_PREFIXES = ("triton.language.",)

# Constants: dtypes, memory formats and layouts (torch.float16, torch.contiguous_format, torch.strided).
TORCH_DTYPES = frozenset(
    f"torch.{name}"
    for name in dir(torch)
    if isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format, torch.layout))
)
# Torch attributes host code may use: allocation and metadata, nothing that computes.
ALLOWED_TORCH = (
    frozenset(
        {
            "torch.empty",
            "torch.empty_like",
            "torch.empty_strided",
            "torch.zeros",
            "torch.zeros_like",
            "torch.promote_types",
            "torch.result_type",
            "torch.is_tensor",
            "torch.is_floating_point",
            "torch.finfo",
            "torch.iinfo",
            "torch.get_default_dtype",
            "torch.device",
            "torch.Size",
            "torch.dtype",
            "torch.no_grad",
            "torch.inference_mode",
            "torch.cuda.is_available",
            "torch.cuda.current_device",
            "torch.cuda.device_count",
            "torch.cuda.get_device_properties",
            "torch.cuda.get_device_capability",
            "torch.cuda.get_device_name",
        }
    )
    | TORCH_DTYPES
)
TORCH_ALLOC = frozenset({"torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like"})

COMPILE_PREFIXES = (
    "torch.compile",
    "torch.compiler",
    "torch._dynamo",
    "torch._inductor",
    "torch.jit",
    "torch.fx",
    "torch.export",
    "torch.cuda.graph",
    "torch.cuda.graphs",
    "torch.cuda.CUDAGraph",
    "torch.cuda.make_graphed_callables",
)
CONCURRENCY_PREFIXES = (
    "torch.cuda.Stream",
    "torch.cuda.stream",
    "torch.cuda.streams",
    "torch.cuda.current_stream",
    "torch.cuda.default_stream",
    "torch.cuda.set_stream",
    "torch.cuda.Event",
    "torch.cuda.ExternalStream",
    "torch.cuda.StreamContext",
    "torch.cuda.synchronize",
    "torch.Stream",
    "torch.Event",
    "torch.accelerator",
    "torch.multiprocessing",
    "torch.distributed",
    "torch.futures",
    "torch.set_num_threads",
    "torch.set_num_interop_threads",
)
NATIVE_PREFIXES = (
    "torch.utils.cpp_extension",
    "torch.library",
    "torch.cuda.jiterator",
    "torch.classes",
    "torch.utils.dlpack",
    "torch.from_dlpack",
    "torch.cuda.nvtx",
)

# Tensor methods host code may call: shape/stride metadata, views, allocation, dtype conversion.
TENSOR_SAFE_METHODS = frozenset(
    {
        "shape",
        "size",
        "stride",
        "dim",
        "ndim",
        "ndimension",
        "numel",
        "nelement",
        "element_size",
        "itemsize",
        "nbytes",
        "dtype",
        "device",
        "layout",
        "is_contiguous",
        "contiguous",
        "data_ptr",
        "const_data_ptr",
        "storage_offset",
        "get_device",
        "dim_order",
        "requires_grad",
        "is_leaf",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "flatten",
        "unflatten",
        "ravel",
        "unsqueeze",
        "squeeze",
        "expand",
        "expand_as",
        "permute",
        "transpose",
        "t",
        "T",
        "mT",
        "movedim",
        "moveaxis",
        "swapaxes",
        "swapdims",
        "narrow",
        "select",
        "unbind",
        "split",
        "split_with_sizes",
        "chunk",
        "tensor_split",
        "unsafe_chunk",
        "unsafe_split",
        "as_strided",
        "detach",
        "clone",
        "copy_",
        "zero_",
        "fill_",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "int",
        "long",
        "short",
        "char",
        "byte",
        "bool",
        "cuda",
        "item",
        "type",
        "data",
        # Names Python containers and strings share with Tensor; too common to forbid by name alone.
        "index",
        "values",
        "indices",
        "name",
    }
) | frozenset(n for n in dir(torch.Tensor) if n.startswith("is_"))
TENSOR_COMPUTE_METHODS = frozenset(n for n in dir(torch.Tensor) if not n.startswith("_")) - TENSOR_SAFE_METHODS
# Methods that return a tensor when called on one (taint propagation for operator checks).
TENSOR_RETURNING = (
    frozenset(
        {
            "view",
            "view_as",
            "reshape",
            "reshape_as",
            "flatten",
            "unflatten",
            "ravel",
            "unsqueeze",
            "squeeze",
            "expand",
            "expand_as",
            "permute",
            "transpose",
            "t",
            "movedim",
            "moveaxis",
            "swapaxes",
            "swapdims",
            "narrow",
            "select",
            "as_strided",
            "detach",
            "clone",
            "copy_",
            "zero_",
            "fill_",
            "new_empty",
            "new_empty_strided",
            "new_zeros",
            "to",
            "float",
            "half",
            "bfloat16",
            "double",
            "int",
            "long",
            "short",
            "char",
            "byte",
            "bool",
            "cuda",
            "contiguous",
            "data",
        }
    )
    | TENSOR_COMPUTE_METHODS
)
TENSOR_SEQUENCE_METHODS = frozenset(
    {"unbind", "split", "split_with_sizes", "chunk", "tensor_split", "unsafe_chunk", "unsafe_split"}
)
TENSOR_ATTRS = frozenset({"T", "mT", "H", "mH", "data", "real", "imag", "grad"})
# Attributes whose value says something about shape, dtype or placement (guards).
SHAPE_ATTRS = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "is_cuda",
        "is_cpu",
        "layout",
        "is_contiguous",
        "stride",
        "size",
        "numel",
        "dim",
        "element_size",
        "nelement",
        "ndimension",
        "is_floating_point",
        "itemsize",
        "nbytes",
        "data_ptr",
        "storage_offset",
        "is_meta",
    }
)
FRAME_ATTRS = frozenset(
    {
        "f_back",
        "f_globals",
        "f_locals",
        "f_code",
        "f_builtins",
        "f_lasti",
        "gi_frame",
        "gi_code",
        "cr_frame",
        "cr_code",
        "ag_frame",
        "tb_frame",
        "tb_next",
        "co_code",
        "co_consts",
        "co_names",
        "func_globals",
        "im_func",
        "im_self",
    }
)
MUTATING_METHODS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "update",
        "setdefault",
        "pop",
        "popitem",
        "clear",
        "add",
        "remove",
        "discard",
        "sort",
        "reverse",
        "copy_",
        "fill_",
        "zero_",
    }
)

DYNAMIC_CODE_BUILTINS = frozenset({"eval", "exec", "compile", "__import__"})
INTROSPECTION_BUILTINS = frozenset({"globals", "locals", "vars", "dir"})
FILE_IO_BUILTINS = frozenset({"open", "input", "breakpoint", "help"})
EXIT_BUILTINS = frozenset({"exit", "quit"})
EXIT_EXCEPTIONS = frozenset({"SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseException"})
TENSOR_BUILTINS = frozenset({"abs", "sum", "max", "min", "pow", "round", "divmod", "sorted", "any", "all"})
JIT_BUILTINS = frozenset(
    {
        "range",
        "min",
        "max",
        "print",
        "int",
        "float",
        "bool",
        "len",
        "abs",
        "isinstance",
        "tuple",
        "enumerate",
        "zip",
        "True",
        "False",
        "None",
    }
)
# Calls allowed while the module is imported (decorators, constants).
IMPORT_TIME_CALLS = frozenset(
    {
        "triton.jit",
        "triton.autotune",
        "triton.heuristics",
        "triton.Config",
        "triton.next_power_of_2",
        "triton.cdiv",
        "triton.language.constexpr",
        "torch.finfo",
        "torch.iinfo",
        "torch.device",
        "torch.Size",
        "torch.promote_types",
        "torch.get_default_dtype",
        "torch.no_grad",
        "torch.inference_mode",
    }
)
IMPORT_TIME_BUILTINS = frozenset(
    {
        "int",
        "float",
        "bool",
        "str",
        "min",
        "max",
        "abs",
        "round",
        "len",
        "tuple",
        "range",
        "dict",
        "list",
        "set",
        "frozenset",
        "sorted",
        "zip",
        "enumerate",
        "isinstance",
    }
)
KERNEL_ATTRS = frozenset({"run", "warmup", "best_config", "configs"})
HOST_DECORATORS = frozenset({"torch.no_grad", "torch.inference_mode"})
BUILTIN_NAMES = frozenset(dir(builtins))


@dataclass
class EntryInfo:
    lineno: int
    positional: list[str]
    kwonly: list[str]
    kwonly_required: list[str]
    vararg: bool
    kwarg: bool
    is_async: bool
    definitions: int


@dataclass
class StaticReport:
    failures: list[Failure] = field(default_factory=list)
    op: str | None = None
    op_error: str | None = None
    adapter: Any = None
    adapter_error: str | None = None
    entry: EntryInfo | None = None
    kernels: list[str] = field(default_factory=list)
    parsed: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures


def check_source(source: str, filename: str = "<candidate>", family: Any = None) -> StaticReport:
    """Run every static rule on `source`; `family` (an OpFamily) types entry's parameters when known."""
    report = StaticReport()
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        report.failures.append(Failure(LAYER, "syntax-error", f"line {exc.lineno}: {exc.msg}"))
        return report
    except (ValueError, RecursionError) as exc:  # null bytes, absurd nesting
        report.failures.append(Failure(LAYER, "syntax-error", str(exc)))
        return report
    report.parsed = True
    try:
        _Checker(tree, report, family).run()
    except RecursionError:
        report.failures.append(Failure(LAYER, "syntax-error", "the file nests too deeply to analyse"))
    return report


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


def _path_match(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p + ".") for p in prefixes)


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
        for sub in _body_nodes(node):
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


class _Checker:
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

    # -- driver ------------------------------------------------------------------------------------
    def run(self) -> None:
        self.tree.body = [stmt for stmt in self.tree.body if not _is_main_guard(stmt)]
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[id(child)] = node
        self._collect_imports()
        self._module_level()
        self._visit(self.tree, "module", None, annotation=False)
        self._host_dataflow()
        self._launch_rules()
        self.report.kernels = sorted(self.kernels)

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

    # -- module level ------------------------------------------------------------------------------
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

    def _is_jit(self, func: ast.FunctionDef) -> bool:
        return any(self._decorator_path(d) == "triton.jit" for d in func.decorator_list)

    def _decorator_path(self, dec: ast.AST) -> str | None:
        return self._resolve(dec.func if isinstance(dec, ast.Call) else dec)

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

    def _outermost(self, node: ast.AST) -> bool:
        """True unless `node` is the base of a longer resolvable chain (checked there instead)."""
        parent = self.parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return False
        if self._is_const_getattr(parent) and parent.args[0] is node:
            return False
        return True

    def _check_path(self, path: str, node: ast.AST, bare: bool, context: str) -> None:
        root = path.split(".")[0]
        parts = path.split(".")
        if root == "torch":
            if path in ALLOWED_TORCH:
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
        elif root == "triton":
            if any(p.startswith("_") for p in parts[1:]):
                self.fail("private-api", node, f"{path}: private triton internals")

    # -- the general visitor -----------------------------------------------------------------------
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

    # -- tensor taint (operators on tensors) -------------------------------------------------------
    def _is_tensor(self, expr: ast.AST, func: _Func) -> bool:
        if isinstance(expr, ast.Name):
            return expr.id in func.tainted
        if isinstance(expr, ast.Call):
            path = self._resolve(expr.func)
            if path in TORCH_ALLOC:
                return True
            if isinstance(expr.func, ast.Attribute) and path is None:
                return expr.func.attr in TENSOR_RETURNING and self._is_tensor(expr.func.value, func)
            if isinstance(expr.func, ast.Name) and expr.func.id in self.funcs:
                return self.funcs[expr.func.id].returns_fresh or self.funcs[expr.func.id].returns_kernel_output
            return False
        if isinstance(expr, ast.Subscript):
            return self._is_tensor(expr.value, func)
        if isinstance(expr, ast.Attribute):
            return expr.attr in TENSOR_ATTRS and self._is_tensor(expr.value, func)
        if isinstance(expr, ast.IfExp):
            return self._is_tensor(expr.body, func) or self._is_tensor(expr.orelse, func)
        if isinstance(expr, ast.BinOp):
            return self._is_tensor(expr.left, func) or self._is_tensor(expr.right, func)
        if isinstance(expr, ast.UnaryOp):
            return self._is_tensor(expr.operand, func)
        if isinstance(expr, ast.NamedExpr):
            return self._is_tensor(expr.value, func)
        return False

    def _seed_taint(self) -> None:
        entry = self.funcs.get("entry")
        if entry is None or isinstance(entry.node, ast.Lambda):
            return
        args = entry.node.args
        entry.tainted.update(a.arg for a in args.posonlyargs + args.args)
        if args.vararg:
            entry.tainted.add(args.vararg.arg)
        kinds = {}
        if self.family is not None:
            kinds = {p.name: p.kind for p in self.family.params}
        for a in args.kwonlyargs:
            if kinds.get(a.arg, "tensor") == "tensor":
                entry.tainted.add(a.arg)

    def _propagate_taint(self) -> None:
        changed = True
        rounds = 0
        while changed and rounds < 20:
            changed = False
            rounds += 1
            for f in self.all_host_funcs:
                for sub in _body_nodes(f.node):
                    names: list[str] = []
                    if isinstance(sub, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and sub.value is not None:
                        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                        for target in targets:
                            if isinstance(target, ast.Name) and self._is_tensor(sub.value, f):
                                names.append(target.id)
                            elif isinstance(target, (ast.Tuple, ast.List)):
                                seq = (
                                    isinstance(sub.value, ast.Call)
                                    and isinstance(sub.value.func, ast.Attribute)
                                    and sub.value.func.attr in TENSOR_SEQUENCE_METHODS
                                    and self._is_tensor(sub.value.func.value, f)
                                )
                                for i, elt in enumerate(target.elts):
                                    if not isinstance(elt, ast.Name):
                                        continue
                                    if seq or (
                                        isinstance(sub.value, (ast.Tuple, ast.List))
                                        and i < len(sub.value.elts)
                                        and self._is_tensor(sub.value.elts[i], f)
                                    ):
                                        names.append(elt.id)
                    elif isinstance(sub, ast.For) and isinstance(sub.target, ast.Name) and self._is_tensor(sub.iter, f):
                        names.append(sub.target.id)
                    elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in self.funcs:
                        callee = self.funcs[sub.func.id]
                        cargs = callee.node.args
                        positional = [a.arg for a in cargs.posonlyargs + cargs.args]
                        for i, arg in enumerate(sub.args):
                            if i < len(positional) and self._is_tensor(arg, f) and positional[i] not in callee.tainted:
                                callee.tainted.add(positional[i])
                                changed = True
                        for kw in sub.keywords:
                            if kw.arg and self._is_tensor(kw.value, f) and kw.arg not in callee.tainted:
                                callee.tainted.add(kw.arg)
                                changed = True
                    for name in names:
                        if name not in f.tainted:
                            f.tainted.add(name)
                            changed = True

    def _host_dataflow(self) -> None:
        self._seed_taint()
        self._launch_fixpoint()
        self._propagate_taint()
        for f in self.all_host_funcs:
            for sub in _body_nodes(f.node):
                if (
                    isinstance(sub, ast.BinOp)
                    and not isinstance(sub.op, ast.MatMult)
                    and (self._is_tensor(sub.left, f) or self._is_tensor(sub.right, f))
                ):
                    self.fail(
                        "torch-compute",
                        sub,
                        f"operator {type(sub.op).__name__} on a tensor "
                        f"({ast.unparse(sub)}) computes in torch on the host",
                    )
                elif (
                    isinstance(sub, ast.UnaryOp)
                    and isinstance(sub.op, (ast.USub, ast.UAdd, ast.Invert))
                    and self._is_tensor(sub.operand, f)
                ):
                    self.fail("torch-compute", sub, f"unary {type(sub.op).__name__} on a tensor computes in torch")
                elif (
                    isinstance(sub, ast.Compare)
                    and any(not isinstance(op, (ast.Is, ast.IsNot)) for op in sub.ops)
                    and any(self._is_tensor(e, f) for e in [sub.left, *sub.comparators])
                ):
                    self.fail("torch-compute", sub, f"comparison on a tensor ({ast.unparse(sub)}) computes in torch")
                elif isinstance(sub, ast.AugAssign) and (
                    self._is_tensor(sub.target, f) or self._is_tensor(sub.value, f)
                ):
                    self.fail(
                        "torch-compute",
                        sub,
                        f"augmented assignment {type(sub.op).__name__} on a tensor "
                        f"({ast.unparse(sub.target)}) computes in torch",
                    )
                elif (
                    isinstance(sub, ast.Call)
                    and isinstance(sub.func, ast.Name)
                    and sub.func.id in TENSOR_BUILTINS
                    and sub.func.id not in self.module_kinds
                    and any(self._is_tensor(a, f) for a in sub.args)
                ):
                    self.fail("torch-compute", sub, f"{sub.func.id}() on a tensor computes in torch")

    # -- launches, returns, guards -----------------------------------------------------------------
    def _kernel_alias_targets(self, f: _Func) -> dict[str, set[str]]:
        """Local names bound to kernels: `k = _a` or `k = _a if cond else _b`."""
        result: dict[str, set[str]] = {}
        for sub in _body_nodes(f.node):
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
            for sub in _body_nodes(f.node):
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

        for sub in _body_nodes(f.node):
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
        for sub in _body_nodes(f.node):
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
        for sub in _body_nodes(f.node):
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
            for sub in _body_nodes(f.node):
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
            for sub in _body_nodes(f.node):
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
