"""Lower the traced fx graph (prims and a few aten ops) to the author's IR (ir.py)."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx
from torch.utils._sympy import functions as sf

from gpuyantra.authors.opengen import ir
from gpuyantra.authors.opengen.spec import OpenSpec, Unsupported
from gpuyantra.authors.opengen.symbolic import (
    as_expr,
    as_shape,
    contiguous_strides,
    literal,
    product,
    same,
    same_shape,
)
from gpuyantra.authors.opengen.trace import Site, Traced, flat_outputs

UNARY = {
    "abs": "abs", "neg": "neg", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log1p": "log1p",
    "log2": "log2", "log10": "log10", "sqrt": "sqrt", "rsqrt": "rsqrt", "reciprocal": "reciprocal", "sin": "sin",
    "cos": "cos", "tan": "tan", "tanh": "tanh", "erf": "erf", "erfc": "erfc", "floor": "floor", "ceil": "ceil",
    "round": "round", "trunc": "trunc", "sign": "sign", "signbit": "signbit", "isfinite": "isfinite",
    "bitwise_not": "not", "logical_not": "not", "sigmoid": "sigmoid", "sinh": "sinh", "cosh": "cosh",
    "atan": "atan", "relu": "relu", "square": "square",
}  # fmt: skip
BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "div": "div", "true_divide": "div", "pow": "pow",
    "maximum": "maximum", "minimum": "minimum", "fmax": "maximum", "fmin": "minimum", "fmod": "fmod",
    "remainder": "remainder", "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
    "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "logical_and": "and", "logical_or": "or",
    "logical_xor": "xor", "atan2": "atan2",
}  # fmt: skip
IDENTITY = ("clone", "view_of", "alias", "detach", "lift_fresh_copy", "contiguous", "copy", "_to_copy_identity")
RESHAPES = ("split_dim", "collapse_view", "collapse", "squeeze", "reshape", "view", "_unsafe_view", "unsqueeze",
            "flatten", "_reshape_alias")  # fmt: skip
# Matrix products the lowering writes (matmul, linear and einsum reach the graph as these), with
# their tensor arguments' schema names.
_MATMUL_ARGS = {
    "mm": ("self", "mat2"), "bmm": ("self", "mat2"), "mv": ("self", "vec"), "dot": ("self", "tensor"),
    "vdot": ("self", "other"), "addmm": ("self", "mat1", "mat2"), "baddbmm": ("self", "batch1", "batch2"),
    "addbmm": ("self", "batch1", "batch2"), "addmv": ("self", "mat", "vec"),
}  # fmt: skip
MATMULS = tuple(_MATMUL_ARGS)
REFUSED = {
    "_addmm_activation": "matmul", "matmul": "matmul", "linear": "matmul", "einsum": "matmul",
    "tensordot": "matmul",
    "convolution": "convolution", "_convolution": "convolution", "conv1d": "convolution",
    "conv2d": "convolution", "conv3d": "convolution", "conv_transpose1d": "convolution",
    "conv_transpose2d": "convolution", "conv_transpose3d": "convolution",
}  # fmt: skip


@dataclass
class Lowered:
    outputs: list[ir.Node]
    structure: str  # "single" | "tuple" | "list"
    out_dtypes: list[torch.dtype]
    follows_input_dtype: tuple[bool, ...]
    inputs: list[ir.Input]  # positional inputs, in forward order
    symbols: dict[sympy.Symbol, tuple[str, int]]  # size symbol -> (input name, dim)
    derived: list[tuple[sympy.Symbol, sympy.Expr]] = field(default_factory=list)  # run-time sizes entry computes


# Full reductions over more than this many elements (when known) are split across programs.
SPLIT_LITERAL_MIN = 1 << 16
SPLIT_PARTS = sympy.Symbol("SPLIT_PARTS", integer=True, positive=True)  # strategy constants of the file
SPLIT_CHUNK = sympy.Symbol("SPLIT_CHUNK", integer=True, positive=True)
_SPLITS: ContextVar[list[tuple[sympy.Symbol, sympy.Expr]] | None] = ContextVar("_SPLITS", default=None)


def lower(traced: Traced, spec: OpenSpec) -> Lowered:
    splits: list[tuple[sympy.Symbol, sympy.Expr]] = []
    token = _SPLITS.set(splits)
    try:
        lowered = _Lowering(traced, spec).run()
    finally:
        _SPLITS.reset(token)
    lowered.derived = splits
    return lowered


def _refusal(name: str) -> str | None:
    kind = REFUSED.get(name)
    if kind == "matmul":
        return f"{name} is a matrix product the trace did not reduce to mm/bmm: not supported by the open author"
    if kind == "convolution" or re.match(r"^(conv\d|conv_transpose|convolution|cudnn_conv|mkldnn_conv)", name):
        return f"{name} is a convolution: not supported by the open author"
    if "pool" in name:
        return f"{name} is a pooling op: not supported by the open author"
    if "upsample" in name:
        return f"{name} is an interpolation op: not supported by the open author"
    if "scaled_dot_product" in name:
        return f"{name} is attention: not supported by the open author"
    return None


class _Lowering:
    def __init__(self, traced: Traced, spec: OpenSpec):
        self.traced = traced
        self.spec = spec
        self.env: dict[torch.fx.Node, Any] = {}
        self.inputs: list[ir.Input] = []
        self.symbols: dict[sympy.Symbol, tuple[str, int]] = {}

    # --- driver ---------------------------------------------------------------------------------
    def run(self) -> Lowered:
        gm = self.traced.gm
        outputs, structure = flat_outputs(gm)
        live = self._live(gm)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.spec.input_names):
            raise Unsupported("the traced graph's inputs do not match the forward's inputs")
        for node, name in zip(placeholders, self.spec.input_names):
            self._placeholder(node, name)
        for node in gm.graph.nodes:
            if node in live and node.op in ("call_function", "get_attr"):
                self.env[node] = self._lower(node)
        outs: list[ir.Node] = []
        dtypes: list[torch.dtype] = []
        for o in outputs:
            if not isinstance(o, torch.fx.Node) or not isinstance(self.env.get(o), ir.Node):
                raise Unsupported("the forward returns something other than tensors")
            outs.append(self.env[o])
            dtypes.append(o.meta["val"].dtype)
        if not outs:
            raise Unsupported("the forward returns no tensor")
        return Lowered(outs, structure, dtypes, self.traced.follows_input_dtype, self.inputs, self.symbols)

    @staticmethod
    def _live(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
        out = next(n for n in gm.graph.nodes if n.op == "output")
        live: set[torch.fx.Node] = set()
        # In-place ops are live too: a later reader of their destination sees the write.
        todo = [out, *(n for n in gm.graph.nodes if n.op == "call_function" and _inplace_name(n))]
        while todo:
            n = todo.pop()
            if n in live:
                continue
            live.add(n)
            todo.extend(n.all_input_nodes)
        return live

    def _placeholder(self, node: torch.fx.Node, name: str) -> None:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise Unsupported(f"input {name} is not a tensor")
        shape = as_shape(val.shape)
        for d, size in enumerate(shape):
            if isinstance(size, sympy.Symbol) and size not in self.symbols:
                self.symbols[size] = (name, d)
        inp = ir.Input(shape, _kind(val.dtype), val.dtype, name, "input")
        self.inputs.append(inp)
        self.env[node] = inp

    # --- argument access --------------------------------------------------------------------------
    def _arg(self, node: torch.fx.Node, i: int, name: str, default: Any = None) -> Any:
        if len(node.args) > i:
            return node.args[i]
        return node.kwargs.get(name, default)

    def _site(self, node: torch.fx.Node, i: int, name: str) -> tuple[Any, ...]:
        return ("args", i) if len(node.args) > i else ("kwargs", name)

    def _value(self, a: Any) -> Any:
        """An fx argument with nodes replaced by their lowered values (sizes as sympy)."""
        if isinstance(a, torch.fx.Node):
            if a not in self.env:
                raise Unsupported(f"{a.name} is used before it is computed")
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self._value(x) for x in a)
        return a

    def _ints(self, a: Any) -> list[int]:
        values = self._value(a)
        if values is None:
            return []
        if isinstance(values, (int, sympy.Integer)):
            return [int(values)]
        return [int(v) for v in values]

    def _tensor(self, node: torch.fx.Node, i: int, name: str, path: tuple[Any, ...] | None = None) -> ir.Node:
        """Argument i as an IR node (python numbers become scalars or bound float params)."""
        a = self._arg(node, i, name)
        site = path or self._site(node, i, name)
        return self._as_node(a, (node.name, site))

    def _as_node(self, a: Any, site: Site) -> ir.Node:
        if isinstance(a, torch.fx.Node):
            v = self._value(a)
            if isinstance(v, ir.Node):
                return v
            if isinstance(v, sympy.Basic):
                is_float = isinstance(a.meta.get("val"), torch.SymFloat)
                return ir.SizeValue((), "f" if is_float else "i", torch.float32 if is_float else torch.int64, v)
            raise Unsupported(f"argument {a.name} is not a tensor")
        found = self.traced.float_sites.get(site)
        if found is not None:
            return ir.FloatParam((), "f", torch.float32, found.kernel_param, found.scale, found.offset, found.power)
        if isinstance(a, bool):
            return ir.Scalar((), "b", torch.bool, a)
        if isinstance(a, int):
            return ir.Scalar((), "i", torch.int64, a)
        if isinstance(a, float):
            return ir.Scalar((), "f", torch.float32, a)
        if isinstance(a, (torch.SymInt, torch.SymFloat)):
            return ir.SizeValue((), "i", torch.int64, as_expr(a))
        raise Unsupported(f"argument {a!r} is not a tensor or a number")

    # --- one node -------------------------------------------------------------------------------
    def _lower(self, node: torch.fx.Node) -> Any:
        if node.op == "get_attr":
            return self._get_attr(node)
        val = node.meta.get("val")
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) or node.target in (
            operator.mul,
            operator.add,
            operator.sub,
            operator.floordiv,
            operator.mod,
            operator.neg,
            torch.sym_float,
        ):
            if isinstance(val, torch.SymBool):
                raise Unsupported("a size condition is computed at run time")
            return as_expr(val)
        if node.target is operator.getitem:
            base = self._value(node.args[0])
            return base[node.args[1]]
        target = node.target
        ns = getattr(getattr(target, "_schema", None), "name", "")
        name = ns.split("::")[-1] if ns else getattr(target, "__name__", str(target))
        refusal = _refusal(name)
        if refusal:
            raise Unsupported(refusal)
        if name in ("max", "min") and isinstance(val, (tuple, list)):
            return self._max_dim(node, name)
        if not isinstance(val, torch.Tensor):
            raise Unsupported(f"op {ns or name} is not supported by the open author")
        if val.is_complex():
            raise Unsupported(f"{name} computes complex values")
        shape = as_shape(val.shape)
        kind = _kind(val.dtype)
        if name.endswith("_") and not name.startswith("_"):
            return self._inplace(node, name, shape, kind, val.dtype)
        handler = self._handlers().get(name)
        if handler is None:
            if name in UNARY or name in BINARY or name == "where":
                return self._pointwise(node, name, shape, kind, val.dtype)
            raise Unsupported(f"op {ns or name} is not supported by the open author")
        return handler(node, shape, kind, val.dtype)

    def _inplace(self, node: torch.fx.Node, name: str, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        """`dst.op_(...)`: the functional result, which later readers of dst see as well."""
        dst_fx = node.args[0]
        dst = self._tensor(node, 0, "self")
        if isinstance(dst, ir.Input):
            raise Unsupported(f"the forward writes into its input or a parameter ({name})")
        if not isinstance(dst_fx, torch.fx.Node) or any(isinstance(dst, t) for t in _VIEWS):
            raise Unsupported(f"in-place {name} into a view")
        base = name[:-1]
        if base == "copy":
            src = self._tensor(node, 1, "src")
            result = _cast_to(make_broadcast(src, shape, tuple(range(len(shape) - src.rank, len(shape)))), kind, dtype)
        elif base in UNARY or base in BINARY or base == "where":
            result = self._pointwise(node, base, shape, kind, dtype)
        else:
            raise Unsupported(f"in-place op {name} is not supported by the open author")
        self.env[dst_fx] = result
        return result

    def _get_attr(self, node: torch.fx.Node) -> ir.Node:
        tensor = getattr(self.traced.gm, str(node.target))
        kp = self.traced.param_names.get(str(node.target))
        if kp is not None:
            shape = tuple(sympy.Integer(int(s)) for s in tensor.shape)
            return ir.Input(shape, _kind(tensor.dtype), tensor.dtype, kp, "param")
        if isinstance(tensor, torch.Tensor) and tensor.numel() == 1:
            # A constant the forward makes (torch.tensor(2.0)): a value, not a module parameter.
            value = tensor.item()
            shape = tuple(sympy.Integer(int(s)) for s in tensor.shape)
            scalar = ir.Scalar((), _kind(tensor.dtype), tensor.dtype, value)
            return ir.Broadcast(shape, scalar.kind, tensor.dtype, scalar, ()) if shape else scalar
        raise Unsupported(
            f"the forward reads a tensor of shape {list(tensor.shape)} that is not a bound parameter "
            "(an unbound buffer or a constant built in forward)"
        )

    def _handlers(self) -> dict[str, Callable[[torch.fx.Node, tuple[sympy.Expr, ...], str, torch.dtype], Any]]:
        return {
            "broadcast_in_dim": self._broadcast_in_dim,
            "expand": self._expand,
            **{n: self._reshape for n in RESHAPES},
            **{n: self._identity for n in IDENTITY},
            "transpose": self._transpose,
            "permute": self._permute,
            "t": self._permute,
            "slice": self._slice,
            "slice_in_dim": self._slice_in_dim,
            "narrow": self._narrow,
            "select": self._select,
            "rev": self._rev,
            "flip": self._rev,
            "cat": self._cat,
            "gather": self._gather,
            "as_strided": self._as_strided,
            "index": self._index,
            "max": self._max_min,
            "min": self._max_min,
            "iota": self._iota,
            "full": self._full,
            "full_like": self._full,
            "scalar_tensor": self._full,
            "zeros_like": self._full,
            "ones_like": self._full,
            "zeros": self._full,
            "ones": self._full,
            "convert_element_type": self._convert,
            "_to_copy": self._convert,
            "to": self._convert,
            "sum": self._reduce,
            "prod": self._reduce,
            "amax": self._reduce,
            "amin": self._reduce,
            "var": self._var,
            "argmax": self._argreduce,
            "argmin": self._argreduce,
            "cumsum": self._scan,
            "cumprod": self._scan,
            "logcumsumexp": self._scan,
            **{n: self._matmul for n in MATMULS},
        }

    # --- pointwise --------------------------------------------------------------------------------
    def _pointwise(self, node: torch.fx.Node, name: str, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        if name == "where":
            args = tuple(self._tensor(node, i, n) for i, n in enumerate(("pred", "a", "b")))
            op = "where"
        elif name in BINARY:
            args = (self._tensor(node, 0, "self"), self._tensor(node, 1, "other"))
            op = BINARY[name]
            if name in ("add", "sub") and self._arg(node, 2, "alpha") not in (None, 1):
                alpha = self._as_node(self._arg(node, 2, "alpha"), (node.name, self._site(node, 2, "alpha")))
                args = (args[0], ir.Pointwise(args[1].shape, args[1].kind, args[1].dtype, "mul", (args[1], alpha)))
        else:
            args = (self._tensor(node, 0, "self"),)
            op = UNARY[name]
        for a in args:
            self._check_broadcastable(a.shape, shape, name)
        return make_pointwise(shape, kind, dtype, op, args)

    @staticmethod
    def _check_broadcastable(src: Sequence[sympy.Expr], dst: Sequence[sympy.Expr], name: str) -> None:
        if len(src) > len(dst):
            raise Unsupported(f"{name}: an operand has more dims than the result")
        for s, d in zip(reversed(src), reversed(dst)):
            if s != 1 and not same(s, d):
                raise Unsupported(f"{name}: operand dims {list(src)} do not broadcast to {list(dst)}")

    def _convert(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "a")
        if src.kind == kind:
            return _retype(src, dtype)
        return make_pointwise(shape, kind, dtype, "cast", (src,))

    def _identity(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        return self._tensor(node, 0, "a")

    # --- views ----------------------------------------------------------------------------------
    def _broadcast_in_dim(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "a")
        bdims = tuple(self._ints(self._arg(node, 2, "broadcast_dimensions")))
        return make_broadcast(src, shape, bdims)

    def _expand(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "self")
        offset = len(shape) - src.rank
        return make_broadcast(src, shape, tuple(range(offset, len(shape))))

    def _reshape(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        return make_reshape(self._tensor(node, 0, "a"), shape)

    def _transpose(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "a")
        args = self._value(node.args[1])
        if isinstance(args, (list, tuple)):  # prims.transpose(a, permutation)
            perm = tuple(int(p) for p in args)
        else:  # aten.transpose(a, dim0, dim1)
            d0, d1 = int(args) % max(src.rank, 1), int(self._value(node.args[2])) % max(src.rank, 1)
            perm_list = list(range(src.rank))
            perm_list[d0], perm_list[d1] = perm_list[d1], perm_list[d0]
            perm = tuple(perm_list)
        return ir.Permute(shape, src.kind, src.dtype, src, perm)

    def _permute(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "self")
        if len(node.args) > 1:
            perm = tuple(int(p) % max(src.rank, 1) for p in self._value(node.args[1]))
        else:
            perm = tuple(reversed(range(src.rank)))
        return ir.Permute(shape, src.kind, src.dtype, src, perm)

    def _slice(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "a")
        second = self._value(self._arg(node, 1, "start_indices"))
        if isinstance(second, (list, tuple)):  # prims.slice(a, start_indices, limit_indices, strides)
            starts = tuple(as_expr(s) for s in second)
            strides = self._value(self._arg(node, 3, "strides"))
            steps = tuple(int(s) for s in strides) if strides else (1,) * src.rank
            return ir.Slice(shape, src.kind, src.dtype, src, starts, steps)
        # aten.slice.Tensor(self, dim, start, end, step)
        dim = int(second or 0) % max(src.rank, 1)
        start = self._value(self._arg(node, 2, "start"))
        step = int(self._value(self._arg(node, 4, "step")) or 1)
        start_e = as_expr(start) if start is not None else sympy.Integer(0)
        if start_e.is_number and int(start_e) < 0:
            start_e = start_e + src.shape[dim]
        return self._slice_dim(src, shape, dim, start_e, step)

    def _slice_dim(self, src: ir.Node, shape: Any, dim: int, start: sympy.Expr, step: int) -> ir.Node:
        starts = tuple(start if d == dim else sympy.Integer(0) for d in range(src.rank))
        steps = tuple(step if d == dim else 1 for d in range(src.rank))
        return ir.Slice(shape, src.kind, src.dtype, src, starts, steps)

    def _slice_in_dim(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "a")
        start = as_expr(self._value(self._arg(node, 1, "start_index")))
        step = int(self._value(self._arg(node, 3, "stride", 1)) or 1)
        dim = int(self._value(self._arg(node, 4, "axis", 0))) % max(src.rank, 1)
        return self._slice_dim(src, shape, dim, start, step)

    def _narrow(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "self")
        dim = int(self._value(node.args[1])) % max(src.rank, 1)
        start = as_expr(self._value(node.args[2]))
        return self._slice_dim(src, shape, dim, start, 1)

    def _select(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "self")
        dim = int(self._value(node.args[1])) % max(src.rank, 1)
        index = as_expr(self._value(node.args[2]))
        if index.is_number and int(index) < 0:
            index = index + src.shape[dim]
        kept = tuple(sympy.Integer(1) if d == dim else s for d, s in enumerate(src.shape))
        sliced = self._slice_dim(src, kept, dim, index, 1)
        return make_reshape(sliced, shape)

    def _rev(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "a")
        dims = tuple(sorted(d % max(src.rank, 1) for d in self._ints(node.args[1])))
        return ir.Rev(shape, src.kind, src.dtype, src, dims)

    def _cat(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        items = self._arg(node, 0, "tensors")
        dim = int(self._value(self._arg(node, 1, "dim", 0)))
        srcs = tuple(self._as_node(a, (node.name, ("args", 0, i))) for i, a in enumerate(items))
        srcs = tuple(s for s in srcs if not (s.rank == 1 and s.shape[0] == 0))  # torch skips empty 1-d inputs
        dim %= max(len(shape), 1)
        srcs = tuple(_cast_to(s, kind, dtype) for s in srcs)
        if len(srcs) == 1:
            return srcs[0]
        return ir.Cat(shape, kind, dtype, srcs, dim)

    def _gather(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "self")
        dim = int(self._value(node.args[1])) % max(src.rank, 1)
        index = self._tensor(node, 2, "index")
        return ir.Gather(shape, kind, dtype, src, dim, index)

    def _as_strided(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "self")
        source_val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if isinstance(source_val, torch.Tensor) and not isinstance(src, ir.AsStrided):
            meta_strides = as_shape(source_val.stride())
            want = contiguous_strides(as_shape(source_val.shape))
            if not all(same(a, b) or s == 1 for a, b, s in zip(meta_strides, want, src.shape)):
                raise Unsupported("as_strided on a non-contiguous value")
        if isinstance(src, ir.AsStrided):
            src = src.src  # as_strided addresses the storage: a chain of them collapses onto its base
        strides = as_shape(self._value(node.args[2]))
        offset_v = self._value(self._arg(node, 3, "storage_offset"))
        offset = as_expr(offset_v) if offset_v is not None else sympy.Integer(0)
        if same(offset, sympy.Integer(0)) and same(product(shape), product(src.shape)):
            if all(same(a, b) or s == 1 for a, b, s in zip(strides, contiguous_strides(shape), shape)):
                return make_reshape(src, shape)
        return ir.AsStrided(shape, src.kind, src.dtype, src, strides, offset)

    def _index(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "self")
        items = self._arg(node, 1, "indices")
        indices: list[ir.Node | None] = []
        for i, a in enumerate(items):
            if a is None:
                indices.append(None)
                continue
            t = self._as_node(a, (node.name, ("args", 1, i)))
            if t.kind != "i":
                raise Unsupported("indexing with a boolean mask (a data-dependent shape)")
            indices.append(t)
        if all(i is None for i in indices):
            return src
        return ir.Index(shape, kind, dtype, src, tuple(indices))

    def _max_min(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        name = _schema_name(node)
        src = self._tensor(node, 0, "self")
        if len(node.args) > 1 and isinstance(node.args[1], torch.fx.Node):  # max(a, b): elementwise
            other = self._tensor(node, 1, "other")
            return make_pointwise(shape, kind, dtype, "maximum" if name == "max" else "minimum", (src, other))
        return make_reduce(name, src, tuple(range(src.rank)), dtype)

    def _iota(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        start = self._value(node.kwargs.get("start", 0))
        step = self._value(node.kwargs.get("step", 1))
        if not (_is_int(start) and _is_int(step)):
            raise Unsupported("iota with a symbolic start or step")
        return ir.Iota(shape, kind, dtype, int(start), int(step))

    def _full(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        name = _schema_name(node)
        if name in ("zeros_like", "zeros"):
            value: ir.Node = ir.Scalar((), kind, dtype, 0)
        elif name in ("ones_like", "ones"):
            value = ir.Scalar((), kind, dtype, 1)
        elif name == "scalar_tensor":
            value = self._tensor(node, 0, "s")
        elif name == "full_like":
            value = self._tensor(node, 1, "fill_value")
        else:  # prims.full / aten.full(shape, value)
            value = self._tensor(node, 1, "fill_value")
        value = _cast_to(value, kind, dtype)
        return make_broadcast(value, shape, ()) if shape else value

    # --- reductions and scans ---------------------------------------------------------------------
    def _dims(self, node: torch.fx.Node, rank: int, i: int = 1, name: str = "dims") -> tuple[int, ...]:
        raw = self._value(self._arg(node, i, name))
        if raw is None or (isinstance(raw, (list, tuple)) and len(raw) == 0 and rank == 0):
            return tuple(range(rank))
        items = raw if isinstance(raw, (list, tuple)) else [raw]
        return tuple(sorted({int(d) % max(rank, 1) for d in items}))

    def _reduce(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "inp")
        dims = self._dims(node, src.rank)
        name = _schema_name(node)
        op = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}[name]
        return make_reduce(op, _cast_to(src, kind, dtype), dims, dtype)

    def _var(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        """var = sum((x - mean)^2) / (n - correction): two passes (never E[x^2] - E[x]^2)."""
        src = self._tensor(node, 0, "inp")
        dims = self._dims(node, src.rank)
        correction = self._value(self._arg(node, 2, "correction", 1.0))
        correction = 1.0 if correction is None else float(correction)
        return make_variance(src, dims, correction)

    def _argreduce(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "self")
        dim = self._value(self._arg(node, 1, "dim"))
        keepdim = bool(self._value(self._arg(node, 2, "keepdim", False)))
        name = _schema_name(node)
        if dim is None:
            flat = make_reshape(src, (product(src.shape),))
            out = make_reduce(name, flat, (0,), dtype)
        else:
            out = make_reduce(name, src, (int(dim) % max(src.rank, 1),), dtype)
        return make_reshape(out, shape) if not same_shape(out.shape, shape) or keepdim else out

    def _max_dim(self, node: torch.fx.Node, name: str) -> tuple[ir.Node, ir.Node]:
        """torch.max(x, dim) / torch.min(x, dim): (values, indices of the first extreme)."""
        src = self._tensor(node, 0, "self")
        dim = int(self._value(self._arg(node, 1, "dim"))) % max(src.rank, 1)
        keepdim = bool(self._value(self._arg(node, 2, "keepdim", False)))
        vals_meta, idx_meta = node.meta["val"]
        values = make_reduce(name, src, (dim,), vals_meta.dtype)
        indices = make_reduce("arg" + name, src, (dim,), idx_meta.dtype)
        if keepdim:
            values = make_reshape(values, as_shape(vals_meta.shape))
            indices = make_reshape(indices, as_shape(idx_meta.shape))
        return values, indices

    def _scan(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        src = self._tensor(node, 0, "self")
        dim = int(self._value(node.args[1])) % max(src.rank, 1)
        name = _schema_name(node)
        if src.rank == 0:
            return _cast_to(src, kind, dtype)
        op = {"cumsum": "sum", "cumprod": "prod", "logcumsumexp": "logsumexp"}[name]
        return ir.Scan(shape, kind, dtype, op, _cast_to(src, kind, dtype), dim)

    # --- matrix products ----------------------------------------------------------------------------
    def _matmul(self, node: torch.fx.Node, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        """mm, bmm, mv, dot and their add* forms (beta * input + alpha * product) as a MatMul."""
        name = _schema_name(node)
        names = _MATMUL_ARGS[name]
        first = len(names) - 2  # the add* forms take the added input first
        a = self._tensor(node, first, names[first])
        b = self._tensor(node, first + 1, names[first + 1])
        if a.kind != "f" or b.kind != "f" or kind != "f":
            raise Unsupported(f"{name} on integer or bool tensors: not supported by the open author")
        if name in ("mv", "addmv"):
            product = make_reshape(make_matmul(a, make_reshape(b, (b.shape[0], sympy.Integer(1))), dtype), shape)
        elif name in ("dot", "vdot"):
            one = sympy.Integer(1)
            product = make_reshape(
                make_matmul(make_reshape(a, (one, a.shape[0])), make_reshape(b, (b.shape[0], one)), dtype), ()
            )
        elif name == "addbmm":  # sum over the batch of a_i @ b_i: one product over (batch, K)
            rows = make_reshape(
                ir.Permute((a.shape[1], a.shape[0], a.shape[2]), a.kind, a.dtype, a, (1, 0, 2)),
                (a.shape[1], a.shape[0] * a.shape[2]),
            )
            product = make_matmul(rows, make_reshape(b, (b.shape[0] * b.shape[1], b.shape[2])), dtype)
        else:
            product = make_matmul(a, b, dtype)
        if not first:
            return product
        return self._add_scaled(node, shape, dtype, product)

    def _add_scaled(self, node: torch.fx.Node, shape: Any, dtype: torch.dtype, product: ir.Node) -> ir.Node:
        """beta * input + alpha * product (addmm's bias; beta 0 ignores the input, NaNs included)."""
        beta = self._arg(node, 3, "beta", 1)
        alpha = self._arg(node, 4, "alpha", 1)
        if alpha != 1:
            scale = self._as_node(alpha, (node.name, self._site(node, 4, "alpha")))
            product = make_pointwise(shape, "f", dtype, "mul", (product, scale))
        if beta == 0 and (node.name, self._site(node, 3, "beta")) not in self.traced.float_sites:
            return product
        bias = self._tensor(node, 0, "self")
        self._check_broadcastable(bias.shape, shape, _schema_name(node))
        bias = make_broadcast(bias, shape, tuple(range(len(shape) - bias.rank, len(shape))))
        if beta != 1:
            weight = self._as_node(beta, (node.name, self._site(node, 3, "beta")))
            bias = make_pointwise(shape, "f", dtype, "mul", (bias, weight))
        return make_pointwise(shape, "f", dtype, "add", (bias, product))


# --- constructors (with light simplification) -------------------------------------------------------


_VIEWS = (ir.Reshape, ir.Permute, ir.Slice, ir.Broadcast, ir.AsStrided)


def _schema_name(node: torch.fx.Node) -> str:
    """The op's schema name without namespace ("sum" for prims.sum.default), "" for non-ops."""
    schema = getattr(node.target, "_schema", None)
    return str(getattr(schema, "name", "")).split("::")[-1]


def _inplace_name(node: torch.fx.Node) -> bool:
    name = _schema_name(node)
    return name.endswith("_") and not name.startswith("_")


def _kind(dtype: torch.dtype) -> str:
    try:
        return ir.kind_of(dtype)
    except ValueError:
        raise Unsupported(f"dtype {dtype} is not supported") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) or (isinstance(v, sympy.Integer))


def _retype(node: ir.Node, dtype: torch.dtype) -> ir.Node:
    """The same value under another dtype of the same kind (float32 math either way)."""
    if node.dtype == dtype:
        return node
    if isinstance(node, ir.Pointwise):
        return ir.Pointwise(node.shape, node.kind, dtype, node.op, node.args)
    return ir.Pointwise(node.shape, node.kind, dtype, "identity", (node,))


def _cast_to(node: ir.Node, kind: str, dtype: torch.dtype) -> ir.Node:
    if node.kind == kind:
        return node
    return make_pointwise(node.shape, kind, dtype, "cast", (node,))


def make_pointwise(shape: Any, kind: str, dtype: torch.dtype, op: str, args: tuple[ir.Node, ...]) -> ir.Node:
    if op == "sub" and len(args) == 2:
        dims = match_mean(args[0], args[1])
        if dims is not None:  # x - mean(x): centered without cancellation
            return _retype(make_centered(args[0], dims), dtype)
    if all(isinstance(a, ir.Scalar) for a in args) and not shape:
        folded = _fold(op, [a.value for a in args if isinstance(a, ir.Scalar)], kind)
        if folded is not None:
            return ir.Scalar((), kind, dtype, folded)
    return ir.Pointwise(tuple(shape), kind, dtype, op, args)


def _fold(op: str, values: list[Any], kind: str) -> Any:
    """Constant-fold pointwise ops on python scalars (the few the graphs need)."""
    try:
        if op == "cast":
            v = values[0]
            return float(v) if kind == "f" else (bool(v) if kind == "b" else int(v))
        if op == "identity":
            return values[0]
        table: dict[str, Callable[..., Any]] = {
            "add": operator.add,
            "sub": operator.sub,
            "mul": operator.mul,
            "neg": operator.neg,
            "sqrt": math.sqrt,
            "exp": math.exp,
            "log": math.log,
            "reciprocal": lambda a: 1.0 / a,
        }
        fn = table.get(op)
        return fn(*values) if fn is not None else None
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def make_broadcast(src: ir.Node, shape: Any, bdims: tuple[int, ...]) -> ir.Node:
    shape = tuple(shape)
    if src.rank == len(shape) and bdims == tuple(range(len(shape))) and same_shape(src.shape, shape):
        return src
    # Only size-1 dims added, nothing expanded: a reshape (unsqueeze).
    if all(
        shape[d] == 1 or (d in bdims and same(src.shape[bdims.index(d)], shape[d])) for d in range(len(shape))
    ) and list(bdims) == sorted(bdims):
        return make_reshape(src, shape)
    return ir.Broadcast(shape, src.kind, src.dtype, src, bdims)


def make_reshape(src: ir.Node, shape: Any) -> ir.Node:
    shape = tuple(shape)
    if same_shape(src.shape, shape):
        return src
    if isinstance(src, ir.Reshape):
        return make_reshape(src.src, shape)
    if isinstance(src, ir.Scalar):
        return ir.Broadcast(shape, src.kind, src.dtype, src, ()) if shape else src
    return ir.Reshape(shape, src.kind, src.dtype, src)


def make_reduce(op: str, src: ir.Node, dims: tuple[int, ...], dtype: torch.dtype) -> ir.Node:
    shape = tuple(s for d, s in enumerate(src.shape) if d not in dims)
    if not dims:
        return src
    kind = "i" if op in ("argmax", "argmin") else src.kind
    if op == "sum" and src.kind == "b":
        src = _cast_to(src, "i", torch.int64)
        kind = "i"
    if len(dims) == src.rank and op in ("sum", "prod", "max", "min") and src.kind != "b":
        split = _split_reduce(op, src, kind, dtype)
        if split is not None:
            return split
    return ir.Reduce(shape, kind, dtype, op, src, dims)


def _split_reduce(op: str, src: ir.Node, kind: str, dtype: torch.dtype) -> ir.Node | None:
    """A full reduction as partials over `parts` programs, then one fold of the partials: one
    program per row would leave a GPU idle on a loss over a billion elements. `parts` is a
    run-time size entry computes from the element count (1 for small inputs)."""
    registry = _SPLITS.get()
    n = product(src.shape)
    known = literal(n)
    if registry is None or (known is not None and known <= SPLIT_LITERAL_MIN):
        return None
    parts = sympy.Symbol(f"_parts{len(registry)}", integer=True, positive=True)
    registry.append((parts, sympy.Max(1, sympy.Min(SPLIT_PARTS, sf_ceildiv(n, SPLIT_CHUNK)))))
    chunk = sf_ceildiv(n, parts)
    pad: float | int = {"sum": 0, "prod": 1, "max": -math.inf, "min": math.inf}[op]
    if kind != "f" and op in ("max", "min"):
        pad = -(2**63) if op == "max" else 2**63 - 1
    view = ir.Split((parts, chunk), src.kind, src.dtype, src, pad)
    partial = ir.Reduce((parts,), kind, dtype, op, view, (1,))
    return ir.Reduce((), kind, dtype, op, partial, (0,))


def make_matmul(a: ir.Node, b: ir.Node, dtype: torch.dtype) -> ir.Node:
    """a @ b for a (*batch, M, K) and b (*batch, K, N); a diagonal matrix (torch.diag's
    where(i == j, v, 0)) on either side becomes a row or column scaling: no product at all."""
    if a.rank != b.rank or a.rank < 2:
        raise Unsupported(f"matmul of ranks {a.rank} and {b.rank}")
    if not same(a.shape[-1], b.shape[-2]) or not same_shape(a.shape[:-2], b.shape[:-2]):
        raise Unsupported(f"matmul of shapes {list(a.shape)} and {list(b.shape)} (sizes differ)")
    shape = (*a.shape[:-1], b.shape[-1])
    rank = len(shape)
    diagonal = _diagonal_values(a)
    if diagonal is not None:  # diag(v) @ b: row m of b times v[m, m]
        scale = make_broadcast(diagonal, shape, (*range(rank - 2), rank - 2))
        return make_pointwise(shape, "f", dtype, "mul", (scale, b))
    diagonal = _diagonal_values(b)
    if diagonal is not None:  # a @ diag(v): column n of a times v[n, n]
        scale = make_broadcast(diagonal, shape, (*range(rank - 2), rank - 1))
        return make_pointwise(shape, "f", dtype, "mul", (a, scale))
    return ir.MatMul(shape, "f", dtype, a, b)


def _diagonal_values(node: ir.Node) -> ir.Node | None:
    """v[..., t, t] when `node` is where(i == j, v, 0) over its last two dims (what torch.diag and
    diag_embed trace to), else None."""
    if not (isinstance(node, ir.Pointwise) and node.op == "where" and node.rank >= 2):
        return None
    cond, values, other = node.args
    if not (isinstance(other, ir.Scalar) and other.value == 0):
        return None
    if not (isinstance(cond, ir.Pointwise) and cond.op == "eq"):
        return None
    axes = {_iota_axis(arg) for arg in cond.args}
    rank = node.rank
    if axes != {rank - 2, rank - 1} or not same(node.shape[-1], node.shape[-2]):
        return None
    values = make_broadcast(values, node.shape, tuple(range(rank - values.rank, rank)))
    # Element t of the diagonal is element t * (n + 1) of the row-major (n, n) trailing block.
    n = node.shape[-1]
    batch = node.shape[:-2]
    strides = (*contiguous_strides(node.shape)[:-2], n + 1)
    return ir.AsStrided((*batch, n), values.kind, values.dtype, values, strides, sympy.Integer(0))


def _iota_axis(node: ir.Node) -> int | None:
    """The dim along which `node` counts 0, 1, 2, ... (an arange broadcast or unsqueezed), else None."""
    if isinstance(node, ir.Iota):
        return 0 if node.start == 0 and node.step == 1 and node.rank == 1 else None
    if isinstance(node, ir.Broadcast):
        inner = _iota_axis(node.src)
        return node.bdims[inner] if inner is not None else None
    if isinstance(node, ir.Reshape):
        inner = _iota_axis(node.src)
        if inner is None:
            return None
        src_big = [d for d, s in enumerate(node.src.shape) if s != 1]
        dst_big = [d for d, s in enumerate(node.shape) if s != 1]
        if inner not in src_big or len(src_big) != len(dst_big):
            return None
        return dst_big[src_big.index(inner)]
    if isinstance(node, ir.Pointwise) and node.op in ("identity", "cast") and node.kind == "i":
        return _iota_axis(node.args[0])
    return None


def sf_ceildiv(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    return sf.CeilDiv(a, b)


def make_variance(src: ir.Node, dims: tuple[int, ...], correction: float) -> ir.Node:
    """sum((x - mean)^2) / (n - correction), the centered values from `centered` (shifted)."""
    n = product([src.shape[d] for d in dims])
    f32 = torch.float32
    centered = make_centered(src, dims)
    squares = make_pointwise(src.shape, "f", f32, "mul", (centered, centered))
    ss = make_reduce("sum", squares, dims, f32)
    c = sympy.Integer(int(correction)) if float(correction).is_integer() else sympy.Float(correction)
    denom = ir.SizeValue((), "f", f32, n - c)
    return make_pointwise(ss.shape, "f", src.dtype, "div", (ss, denom))


def make_centered(src: ir.Node, dims: tuple[int, ...]) -> ir.Node:
    """x - mean(x) over `dims`, computed as (x - k) - mean(x - k) with k the row's first element:
    rows far from zero (mean 2000, spread 1) keep their digits, since the mean itself, rounded to
    float32, is never subtracted from x."""
    f32 = torch.float32
    n = product([src.shape[d] for d in dims])
    kept = tuple(d for d in range(src.rank) if d not in dims)
    kept_shape = tuple(src.shape[d] for d in kept)
    first_shape = tuple(sympy.Integer(1) if d in dims else s for d, s in enumerate(src.shape))
    first = ir.Slice(first_shape, src.kind, src.dtype, src, (sympy.Integer(0),) * src.rank, (1,) * src.rank)
    shift = make_broadcast(make_reshape(first, kept_shape), src.shape, kept)
    shifted = make_pointwise(src.shape, "f", f32, "sub", (src, shift))
    mean = make_pointwise(
        kept_shape, "f", f32, "div", (make_reduce("sum", shifted, dims, f32), ir.SizeValue((), "f", f32, n))
    )
    return ir.Pointwise(src.shape, "f", f32, "sub", (shifted, make_broadcast(mean, src.shape, kept)))


def match_mean(a: ir.Node, b: ir.Node) -> tuple[int, ...] | None:
    """The reduced dims when `b` is mean(a) over them, broadcast back to a's shape (keepdim)."""
    if not same_shape(a.shape, b.shape) or a.kind != "f":
        return None
    labels: list[object] = list(range(b.rank))
    node = b
    div_seen = False
    while True:
        if isinstance(node, ir.Broadcast):
            labels = [0 if node.src.shape[i] == 1 else labels[bd] for i, bd in enumerate(node.bdims)]
            node = node.src
        elif isinstance(node, ir.Reshape):
            moved = _unsqueeze_map(node.src.shape, node.shape, labels)
            if moved is None:
                return None
            labels, node = moved, node.src
        elif isinstance(node, ir.Pointwise) and node.op == "div" and not div_seen:
            count = node.args[1]
            if isinstance(count, ir.SizeValue):
                n_expr = count.expr
            elif isinstance(count, ir.Scalar) and float(count.value).is_integer():
                n_expr = sympy.Integer(int(count.value))  # a reduced extent the trace pinned
            else:
                return None
            div_seen, node = True, node.args[0]
        elif isinstance(node, ir.Reduce) and node.op == "sum" and div_seen and node.src is a:
            kept = [d for d in range(a.rank) if d not in node.dims]
            if labels != kept or not same(n_expr, product([a.shape[d] for d in node.dims])):
                return None
            return node.dims
        else:
            return None


def _unsqueeze_map(src: Sequence[sympy.Expr], dst: Sequence[sympy.Expr], labels: list[object]) -> list[object] | None:
    """Labels of src's dims when the reshape only adds or drops size-1 dims, else None."""
    src_big = [d for d in range(len(src)) if src[d] != 1]
    dst_big = [d for d in range(len(dst)) if dst[d] != 1]
    if len(src_big) != len(dst_big) or not all(same(src[i], dst[j]) for i, j in zip(src_big, dst_big)):
        return None
    out: list[object] = [0] * len(src)
    for i, j in zip(src_big, dst_big):
        out[i] = labels[j]
    return out
