"""Trace the reference module to a graph of prims with symbolic sizes, and find its float params.

- make_fx in symbolic mode: every input dim is a size symbol (duck sizing off, so two dims that
  happen to be equal in the example stay independent), except dims the computation pins (size 1,
  or tied to a parameter's size, which the module's own parameters fix).
- The module's parameters stay real tensors, so their sizes are constants; each is mapped back to
  the kernel parameter that binds it.
- torch's decomposition table lowers everything it can to prims (explicit broadcasts, reductions
  without keepdim), except the ops the author either keeps (cumsum, cumprod, the matrix products
  mm/bmm/addmm/mv/dot...) or refuses by name (convolutions, adaptive pooling, ...), which stay
  visible in the graph. Max and average pooling decompose to gathers (pooling.py).
- Float attributes: the module is traced with each one set to sentinel values; a constant of the
  graph that moves with an attribute (as a * value + b) becomes a run-time kernel argument. An
  attribute that moves the graph's structure, or several constants at once in a non-affine way,
  makes the target unsupported, since baking it would be wrong for other values.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.fx
from torch._decomp import decomposition_table
from torch.fx.experimental import _config as fx_config
from torch.fx.experimental.proxy_tensor import make_fx

from gpuyantra.authors.opengen.convolution import DECOMPOSITIONS as CONVOLUTION_DECOMPOSITIONS
from gpuyantra.authors.opengen.pooling import DECOMPOSITIONS as POOLING_DECOMPOSITIONS
from gpuyantra.authors.opengen.pooling import CompositePooling
from gpuyantra.authors.opengen.spec import OpenSpec, Unsupported
from gpuyantra.ops.open.spec import WithArguments

# Ops left undecomposed: scans and matrix products the author writes natively, and ops it refuses
# with a named reason.
_KEEP = re.compile(
    r"^(cumsum|cumprod|logcumsumexp|mm|bmm|addmm|baddbmm|addbmm|addmm_|_addmm_activation|dot|vdot|mv|addmv|"
    r"matmul|linear|einsum|tensordot|convolution|conv\w*|_convolution|\w*pool\w*|upsample\w*|_upsample\w*|"
    r"_scaled_dot_product\w*|embedding\w*|unfold\w*|im2col|col2im)$"
)
# Sentinel factors: distinctive, close to 1 so that control flow on the value's sign or range keeps.
_SENTINELS = (1.0123456789, 1.0432109876, 1.0765432198)
_ZERO_SENTINELS = (1.23456789e-3, 2.3456789e-3, 3.456789e-3)

Site = tuple[str, tuple[Any, ...]]  # (fx node name, path of the argument inside args/kwargs)


def _op_name(op: Any) -> str:
    return str(op).split(".")[1] if str(op).count(".") >= 1 else str(op)


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {
    op: fn for op, fn in decomposition_table.items() if not _KEEP.match(_op_name(op))
}
DECOMPOSITIONS.update(POOLING_DECOMPOSITIONS)  # max and average pooling as gathers (pooling.py)
DECOMPOSITIONS.update(CONVOLUTION_DECOMPOSITIONS)  # convolutions as gathers and one einsum (convolution.py)


@dataclass(frozen=True)
class FloatSite:
    """The constant is scale * value**power + offset of the float param's run-time value."""

    kernel_param: str
    scale: float
    offset: float
    power: int = 1


@dataclass
class Traced:
    gm: torch.fx.GraphModule
    float_sites: dict[Site, FloatSite] = field(default_factory=dict)
    param_names: dict[str, str] = field(default_factory=dict)  # get_attr target -> kernel param
    unused_floats: tuple[str, ...] = ()  # float params the graph does not depend on
    follows_input_dtype: tuple[bool, ...] = ()  # per flat output: floating outputs in the inputs' dtype
    # The traced copy (float attributes and arguments at their sentinels), called on the tensors alone.
    module: torch.nn.Module | None = None


def trace_spec(spec: OpenSpec) -> Traced:
    """The spec's module traced at its example inputs (see the module docstring)."""
    if len(spec.input_names) != len(spec.example_inputs):
        raise Unsupported("input_names and example_inputs differ in length")
    for t in spec.example_inputs:
        if not isinstance(t, torch.Tensor):
            raise Unsupported("every forward input must be a tensor")
        if t.is_complex():
            raise Unsupported("complex inputs")
    module = copy.deepcopy(spec.module).to("cpu")  # its training flag is the reference's
    call = _with_arguments(module, spec)
    floats = [(kp, *_owner(module, path)) for kp, path in spec.float_params]
    if isinstance(call, WithArguments):  # float arguments are traced at sentinels as float attributes are
        floats += [(kp, call.values, kp) for kp, _, live in spec.arguments if isinstance(live, float)]
    originals = {kp: _float_value(owner, attr, kp) for kp, owner, attr in floats}
    for kp, owner, attr in floats:
        setattr(owner, attr, _sentinel(originals[kp], 0))
    gm = _trace(call, spec.example_inputs)
    traced = Traced(gm=gm, module=call)
    unused = []
    for kp, owner, attr in floats:
        variants = []
        for k in (1, 2):
            setattr(owner, attr, _sentinel(originals[kp], k))
            variants.append(_trace(call, spec.example_inputs))
        setattr(owner, attr, _sentinel(originals[kp], 0))
        sites = _locate(kp, originals[kp], gm, variants)
        if not sites:
            unused.append(kp)
        for site, found in sites.items():
            if site in traced.float_sites:
                raise Unsupported(
                    f"a constant depends on both float params {traced.float_sites[site].kernel_param} and {kp}"
                )
            traced.float_sites[site] = found
    traced.unused_floats = tuple(unused)
    traced.param_names = _param_names(gm, module, spec)
    traced.follows_input_dtype = _dtype_rules(_with_arguments(spec.module, spec), spec.example_inputs, gm)
    return traced


def _with_arguments(module: torch.nn.Module, spec: OpenSpec) -> torch.nn.Module:
    """`module` called on the example tensors alone, its number arguments at their live values."""
    return WithArguments(module, spec.arguments) if spec.arguments else module


def check_size_generic(spec: OpenSpec, traced: Traced) -> None:
    """Refuse a trace that holds only for some input sizes (`if x.shape[1] > 4`): the forward is
    traced again with every size symbol at other values (small, and larger and odd), and each
    trace that runs must hold the same tensor ops in the same order. Guards alone cannot tell a
    branch in the module's code from fake tensors' own layout checks, which change nothing."""
    module = traced.module
    if module is None:
        return
    base = _op_sequence(traced.gm)
    symbols = _input_symbols(traced.gm)
    if not symbols:
        return
    for remap in (lambda v: 3, lambda v: 2 * v + 1):
        values = {sym: remap(v) for sym, v in symbols.items()}
        inputs = _inputs_at(traced.gm, spec.example_inputs, values)
        if inputs is None:
            continue
        try:
            other = _trace(module, tuple(inputs))
        except Unsupported:
            continue  # the module itself refuses those sizes (divisibility, class counts)
        if _op_sequence(other) != base:
            sizes = [list(t.shape) for t in inputs]
            raise Unsupported(f"the traced computation changes with input sizes (other ops at input shapes {sizes})")


def _op_sequence(gm: torch.fx.GraphModule) -> list[str]:
    """The tensor ops of a graph, in order (size arithmetic left out)."""
    ops = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.meta.get("val"), (torch.Tensor, tuple, list)):
            continue
        ops.append(str(node.target))
    return ops


def _input_symbols(gm: torch.fx.GraphModule) -> dict[sympy.Symbol, int]:
    """Free size symbols of the inputs, with their example values."""
    found: dict[sympy.Symbol, int] = {}
    for node in gm.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if not isinstance(val, torch.Tensor):
            continue
        for size in val.shape:
            if isinstance(size, torch.SymInt):
                expr = size.node.shape_env.replace(size.node.expr)
                hint = size.node.hint
                if isinstance(expr, sympy.Symbol) and hint is not None:
                    found.setdefault(expr, int(hint))
    return found


def _inputs_at(
    gm: torch.fx.GraphModule, examples: tuple[torch.Tensor, ...], values: dict[sympy.Symbol, int]
) -> list[torch.Tensor] | None:
    """Example-like inputs with every size symbol at `values` (integer inputs: zeros, which any
    index or class-id input accepts)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = []
    for node, example in zip(placeholders, examples):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return None
        shape = []
        for size in val.shape:
            if isinstance(size, torch.SymInt):
                expr = size.node.shape_env.replace(size.node.expr)
                size_value = expr.subs(values)
                if not size_value.is_Integer:
                    return None
                shape.append(int(size_value))
            else:
                shape.append(int(size))
        if example.is_floating_point():
            out.append(torch.rand(shape, dtype=example.dtype) + 0.5)
        else:
            out.append(torch.zeros(shape, dtype=example.dtype))
    return out


def _shape_env(gm: torch.fx.GraphModule) -> Any:
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        sizes = list(val.shape) if isinstance(val, torch.Tensor) else [val]
        for size in sizes:
            if isinstance(size, (torch.SymInt, torch.SymFloat)):
                return size.node.shape_env
    return None


def _owner(module: torch.nn.Module, path: str) -> tuple[Any, str]:
    *parents, attr = path.split(".")
    owner: Any = module
    for part in parents:
        if not hasattr(owner, part):
            raise Unsupported(f"the module has no attribute {path}")
        owner = getattr(owner, part)
    if not hasattr(owner, attr):
        raise Unsupported(f"the module has no attribute {path}")
    return owner, attr


def _float_value(owner: Any, attr: str, kp: str) -> float:
    value = getattr(owner, attr)
    if isinstance(value, bool) or not isinstance(value, (float, int)):
        raise Unsupported(f"float param {kp} is a {type(value).__name__}, not a float attribute")
    return float(value)


def _sentinel(value: float, k: int) -> float:
    return value * _SENTINELS[k] if value != 0 else _ZERO_SENTINELS[k]


def _trace(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    def run(*args: torch.Tensor) -> Any:
        return module(*args)

    try:
        no_duck = fx_config.patch(use_duck_shape=False)  # type: ignore[attr-defined]
        with torch.no_grad(), no_duck, CompositePooling():
            return make_fx(
                run, tracing_mode="symbolic", decomposition_table=DECOMPOSITIONS, _allow_non_fake_inputs=True
            )(*inputs)
    except Unsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - any tracing failure is a reason to refuse, said in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise Unsupported(f"the forward cannot be traced: {type(exc).__name__}: {first[:200]}") from exc


def _leaves(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    else:
        yield path, value


def node_leaves(node: torch.fx.Node) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, value) of every leaf argument of an fx node."""
    yield from _leaves(list(node.args), ("args",))
    yield from _leaves(dict(node.kwargs), ("kwargs",))


def _locate(
    kp: str, original: float, base: torch.fx.GraphModule, variants: list[torch.fx.GraphModule]
) -> dict[Site, FloatSite]:
    """Constants of `base` that move with the float param across the variant traces."""
    values = [_sentinel(original, k) for k in range(3)]
    nodes = [list(g.graph.nodes) for g in (base, *variants)]
    if any(len(n) != len(nodes[0]) for n in nodes):
        raise Unsupported(f"float param {kp} changes the traced graph's structure")
    sites: dict[Site, FloatSite] = {}
    for row in zip(*nodes):
        if any(n.target != row[0].target or n.op != row[0].op for n in row):
            raise Unsupported(f"float param {kp} changes the traced graph's structure")
        leaves = [list(node_leaves(n)) for n in row]
        if any(len(x) != len(leaves[0]) for x in leaves):
            raise Unsupported(f"float param {kp} changes the traced graph's structure")
        for items in zip(*leaves):
            path = items[0][0]
            consts = [v for _, v in items]
            if all(isinstance(c, torch.fx.Node) for c in consts):
                continue
            if all(_same_const(c, consts[0]) for c in consts):
                continue
            if not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in consts):
                raise Unsupported(f"float param {kp} changes a non-numeric argument of {row[0].target}")
            sites[(row[0].name, path)] = _affine(kp, values, [float(c) for c in consts], row[0])
    return sites


def _same_const(a: Any, b: Any) -> bool:
    if isinstance(a, torch.fx.Node) or isinstance(b, torch.fx.Node):
        return a is b or (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) and a.name == b.name)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _affine(kp: str, xs: list[float], ys: list[float], node: torch.fx.Node) -> FloatSite:
    """ys = scale * xs + offset (or scale / xs + offset: a norm's 1/p), checked on the third point."""
    for power in (1, -1):
        us = [x**power for x in xs]
        scale = (ys[0] - ys[1]) / (us[0] - us[1])
        offset = ys[0] - scale * us[0]
        if math.isclose(scale * us[2] + offset, ys[2], rel_tol=1e-9, abs_tol=1e-12):
            return FloatSite(kp, _tidy(scale), _tidy(offset), power)
    raise Unsupported(f"a constant of {node.target} depends on float param {kp} in a non-affine way")


def _tidy(x: float) -> float:
    """Round away the last bits of float noise (-0.99999999999 is -1)."""
    if x == 0:
        return 0.0
    rounded = float(f"{x:.10g}")
    return rounded if math.isclose(rounded, x, rel_tol=1e-9) else x


def _param_names(gm: torch.fx.GraphModule, module: torch.nn.Module, spec: OpenSpec) -> dict[str, str]:
    """get_attr target -> kernel param, for every module tensor the graph reads."""
    bound = []
    for kp, path in spec.tensor_params:
        owner, attr = _owner(module, path)
        tensor = getattr(owner, attr)
        if isinstance(tensor, torch.Tensor):
            bound.append((kp, tensor))
    names: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target)
        for kp, tensor in bound:
            if value is tensor or (
                value.data_ptr() == tensor.data_ptr()
                and value.shape == tensor.shape
                and value.stride() == tensor.stride()
                and value.dtype == tensor.dtype
            ):
                names[node.target] = kp
                break
    return names


def flat_outputs(gm: torch.fx.GraphModule) -> tuple[list[Any], str]:
    """The graph's outputs and their structure ("single", "tuple" or "list")."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    value = out.args[0]
    if isinstance(value, tuple):
        return list(value), "tuple"
    if isinstance(value, list):
        return list(value), "list"
    return [value], "single"


def _dtype_rules(
    module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], gm: torch.fx.GraphModule
) -> tuple[bool, ...]:
    """Per output: whether a floating output takes the floating inputs' dtype (the module run in
    another dtype on the meta device says so), or keeps its traced dtype (an explicit .float())."""
    outputs, _ = flat_outputs(gm)
    traced = [o.meta.get("val") if isinstance(o, torch.fx.Node) else None for o in outputs]
    floating_in = [t.dtype for t in inputs if t.is_floating_point()]
    probe = torch.bfloat16 if torch.float16 in floating_in else torch.float16
    try:
        copied = copy.deepcopy(module).to(device="meta", dtype=probe)
        args = [torch.empty(t.shape, dtype=probe if t.is_floating_point() else t.dtype, device="meta") for t in inputs]
        with torch.no_grad():
            out = copied(*args)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        return tuple(
            isinstance(t, torch.Tensor) and t.is_floating_point() and isinstance(o, torch.Tensor) and o.dtype == probe
            for t, o in zip(traced, outs)
        )
    except Exception:  # noqa: BLE001 - the meta run is only a hint: fall back to the traced dtypes
        first = floating_in[0] if floating_in else None
        return tuple(isinstance(t, torch.Tensor) and t.dtype == first for t in traced)
