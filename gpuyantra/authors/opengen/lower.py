"""Lower the traced fx graph (prims and a few aten ops) to the author's IR (ir.py).

The driver here walks the graph's live nodes, refuses what the author cannot write (convolutions
and pooling left undecomposed, attention, ...), handles in-place ops and bound parameters, and dispatches every other op
by name through HANDLERS to its family: lower_pointwise.py (elementwise ops, conversions, fills),
lower_views.py (views and indexing), lower_reduce.py (reductions, statistics, scans) and
lower_matmul.py (matrix products). The families read their arguments through lower_args.py and
build nodes with construct.py.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.construct import SPLITS, cast_to, make_broadcast
from gpuyantra.authors.opengen.lower_args import FxArgs, Handler, schema_name
from gpuyantra.authors.opengen.lower_matmul import MATMUL_OPS
from gpuyantra.authors.opengen.lower_pointwise import BINARY, POINTWISE_OPS, UNARY, pointwise
from gpuyantra.authors.opengen.lower_reduce import REDUCTION_OPS, max_dim
from gpuyantra.authors.opengen.lower_views import VIEW_OPS
from gpuyantra.authors.opengen.spec import OpenSpec, Unsupported
from gpuyantra.authors.opengen.symbolic import as_expr, as_shape
from gpuyantra.authors.opengen.trace import Traced, flat_outputs

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


def lower(traced: Traced, spec: OpenSpec) -> Lowered:
    splits: list[tuple[sympy.Symbol, sympy.Expr]] = []
    token = SPLITS.set(splits)
    try:
        lowered = _Lowering(traced, spec).run()
    finally:
        SPLITS.reset(token)
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


# Op name -> its family's handler.
HANDLERS: dict[str, Handler] = {**VIEW_OPS, **POINTWISE_OPS, **REDUCTION_OPS, **MATMUL_OPS}


class _Lowering(FxArgs):
    """One lowering: the walk over the graph; the ops themselves go to their family's handler."""

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
        follows = tuple(self.traced.follows_input_dtype)
        if self.spec.updated_buffers:
            # The buffers the forward updates: their new values are extra outputs, after the
            # forward's own, in the spec's order (the caller writes them into the module).
            follows = (follows + (True,) * len(outs))[: len(outs)]
            for kp in self.spec.updated_buffers:
                new = self.updates.get(kp)
                if new is None:
                    raise Unsupported(f"the forward updates buffer {kp} outside the traced graph")
                outs.append(new)
                dtypes.append(new.dtype)
                follows += (True,)
            structure = "tuple"
        return Lowered(outs, structure, dtypes, follows, self.inputs, self.symbols)

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

    # --- one node -------------------------------------------------------------------------------
    def _lower(self, node: torch.fx.Node) -> Any:
        if node.op == "get_attr":
            # A buffer read after the forward wrote into it sees the new value.
            written = self.written.get(str(node.target))
            return written if written is not None else self._get_attr(node)
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
            base = self.value(node.args[0])
            return base[node.args[1]]
        target = node.target
        ns = getattr(getattr(target, "_schema", None), "name", "")
        name = ns.split("::")[-1] if ns else getattr(target, "__name__", str(target))
        refusal = _refusal(name)
        if refusal:
            raise Unsupported(refusal)
        if name in ("max", "min") and isinstance(val, (tuple, list)):
            return max_dim(self, node, name)
        if not isinstance(val, torch.Tensor):
            raise Unsupported(f"op {ns or name} is not supported by the open author")
        if val.is_complex():
            raise Unsupported(f"{name} computes complex values")
        shape = as_shape(val.shape)
        kind = _kind(val.dtype)
        if name.endswith("_") and not name.startswith("_"):
            return self._inplace(node, name, shape, kind, val.dtype)
        handler = HANDLERS.get(name)
        if handler is None:
            if name in UNARY or name in BINARY or name == "where":
                return pointwise(self, node, name, shape, kind, val.dtype)
            raise Unsupported(f"op {ns or name} is not supported by the open author")
        return handler(self, node, shape, kind, val.dtype)

    def _inplace(self, node: torch.fx.Node, name: str, shape: Any, kind: str, dtype: torch.dtype) -> ir.Node:
        """`dst.op_(...)`: the functional result, which later readers of dst see as well."""
        dst_fx = node.args[0]
        dst = self.tensor(node, 0, "self")
        update = isinstance(dst, ir.Input) and dst.role == "param" and dst.name in self.spec.updated_buffers
        if isinstance(dst, ir.Input) and not update:
            raise Unsupported(f"the forward writes into its input or a parameter ({name})")
        if not isinstance(dst_fx, torch.fx.Node) or any(isinstance(dst, t) for t in _VIEWS):
            raise Unsupported(f"in-place {name} into a view")
        base = name[:-1]
        if base == "copy":
            src = self.tensor(node, 1, "src")
            result = cast_to(make_broadcast(src, shape, tuple(range(len(shape) - src.rank, len(shape)))), kind, dtype)
        elif base in UNARY or base in BINARY or base == "where":
            result = pointwise(self, node, base, shape, kind, dtype)
        else:
            raise Unsupported(f"in-place op {name} is not supported by the open author")
        self.env[dst_fx] = result
        if update:
            assert isinstance(dst, ir.Input) and isinstance(dst_fx, torch.fx.Node)
            if tuple(result.shape) != tuple(dst.shape):
                raise Unsupported(f"the forward writes a value of another shape into buffer {dst.name}")
            self.updates[dst.name] = cast_to(result, dst.kind, dst.dtype)
            if dst_fx.op == "get_attr":
                self.written[str(dst_fx.target)] = self.updates[dst.name]
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


_VIEWS = (ir.Reshape, ir.Permute, ir.Slice, ir.Broadcast, ir.AsStrided)


def _inplace_name(node: torch.fx.Node) -> bool:
    name = schema_name(node)
    return name.endswith("_") and not name.startswith("_")


def _kind(dtype: torch.dtype) -> str:
    try:
        return ir.kind_of(dtype)
    except ValueError:
        raise Unsupported(f"dtype {dtype} is not supported") from None
