"""A whole model's forward partitioned into fusable regions (KernelBench level 3).

A region is a library anchor (a convolution, a linear layer or matrix product) and the fusable ops
after it (pointwise, norms, pooling, reductions, residual adds) up to the next anchor, or a chain of
fusable ops with no anchor. Layers a kernel should not rewrite (recurrent layers, attention) are
regions of their own, left to the library. Each region is a sub-module (a `torch.fx.GraphModule`
whose parameters keep the Model's dotted paths, `features.0.weight`) with the live inputs it saw in
one run of the Model, so it becomes an open target exactly as a level-1/2 problem does.

torch.fx traces the forward where it can; a forward it cannot trace (data-dependent control flow)
falls back to the module tree: each child module called once in the forward is one region.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

# Modules and functions that start a region: the library computes them (cuDNN, cuBLAS) and a
# kernel fuses what follows.
ANCHOR_MODULES: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
    nn.Bilinear,
)
ANCHOR_FUNCTIONS: frozenset[Any] = frozenset(
    {
        F.linear,
        F.bilinear,
        F.conv1d,
        F.conv2d,
        F.conv3d,
        F.conv_transpose1d,
        F.conv_transpose2d,
        F.conv_transpose3d,
        torch.matmul,
        torch.mm,
        torch.bmm,
        torch.addmm,
        torch.baddbmm,
        torch.einsum,
        operator.matmul,
    }
)
ANCHOR_METHODS = frozenset({"matmul", "mm", "bmm", "addmm", "baddbmm", "__matmul__"})
# Kept whole in the library: a region of their own that no kernel is written for.
LIBRARY_MODULES: tuple[type[nn.Module], ...] = (
    nn.RNNBase,
    nn.RNNCellBase,
    nn.MultiheadAttention,
    nn.Transformer,
    nn.TransformerEncoder,
    nn.TransformerDecoder,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
)
LIBRARY_FUNCTIONS: frozenset[Any] = frozenset({F.scaled_dot_product_attention, F.multi_head_attention_forward})
# Ops that move no data worth a kernel: a region of these alone is left as it is.
VIEW_OPS = frozenset(
    {
        *("view", "reshape", "flatten", "unflatten", "contiguous", "squeeze", "unsqueeze", "expand"),
        *("permute", "transpose", "t", "movedim", "size", "getattr", "getitem"),
    }
)

# Nominal rates for the CPU estimate of a region's cost (an H100-class GPU in float32): the ranking
# needs the FLOPs and the bytes on one scale, not a prediction of the time.
NOMINAL_FLOPS_PER_US = 50e6  # 50 TFLOP/s
NOMINAL_BYTES_PER_US = 3e6  # 3 TB/s


class PartitionError(Exception):
    """The model cannot be partitioned (nor run on its inputs)."""


@dataclass
class Region:
    """One region of the forward: what it computes, its module and live inputs, what became of it."""

    index: int
    kind: str  # "anchor" (library anchor + fusable ops), "chain" (fusable ops), "library" (kept whole)
    ops: list[str]  # readable: "Conv2d features.0", "relu", "add"
    module: nn.Module
    inputs: list[Any]  # live values from one run of the Model (tensors, or numbers the region takes)
    input_names: list[str]  # the names the Model's code gives them (fx node names, or the child's path)
    output_names: list[str] = field(default_factory=list)
    child: str | None = None  # module-tree regions: the child's dotted path
    cost_us: float = 0.0
    cost_basis: str = "estimate"  # "measured" (CUDA events, warmed) or "estimate" (bytes + FLOPs)
    share: float = 0.0
    status: str = "not_tried"  # verified | rejected | unsupported | library | not_tried | not_faster
    runs_as: str = "unchanged"  # kernel | library | unchanged
    reason: str = ""
    op: str | None = None  # the region's open target
    candidate: str | None = None
    reward: int | None = None
    library_calls: list[str] = field(default_factory=list)
    kernel_us: float | None = None
    input_shapes: list[Any] = field(default_factory=list)  # kept when the inputs are released

    def __post_init__(self) -> None:
        self.input_shapes = [_shapes(x) for x in self.inputs]

    def release(self) -> None:
        """Drop the live inputs and the Model's submodules (device memory the ModelNew check needs);
        what the result and ModelNew's source need stays."""
        self.inputs, self.module = [], nn.Module()

    @property
    def name(self) -> str:
        return f"region_{self.index}"

    @property
    def only_views(self) -> bool:
        return all(op.split(" ")[0] in VIEW_OPS or op.startswith("Dropout") for op in self.ops)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "ops": list(self.ops),
            "inputs": self.input_shapes,
            "share": round(self.share, 4),
            "cost_us": float(f"{self.cost_us:.4g}"),
            "cost_basis": self.cost_basis,
            "status": self.status,
            "runs_as": self.runs_as,
            "reason": self.reason,
            "op": self.op,
            "candidate": self.candidate,
            "reward": self.reward,
            "library_calls": list(self.library_calls),
            "kernel_us": self.kernel_us,
        }


def _shapes(value: Any) -> Any:
    """A region input for the JSON: a tensor's shape, a tuple's shapes, a number as it is."""
    if isinstance(value, torch.Tensor):
        return list(value.shape)
    if isinstance(value, (tuple, list)):
        return [_shapes(v) for v in value]
    return value if isinstance(value, (int, float, bool, str)) or value is None else type(value).__name__


@dataclass
class Partition:
    """The regions of a model's forward, in the order the forward runs them."""

    regions: list[Region]
    traced: bool  # torch.fx traced the forward; False: the module tree's children
    graph: torch.fx.Graph | None = None  # the traced forward (traced partitions)
    nodes: dict[int, list[torch.fx.Node]] = field(default_factory=dict)  # region index -> its nodes
    why_untraced: str = ""


class _Tracer(torch.fx.Tracer):
    """torch.nn's own modules are leaves (as fx's default), and so are the library-kept layers."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, LIBRARY_MODULES) or super().is_leaf_module(m, module_qualified_name)


def partition(model: nn.Module, inputs: Sequence[Any]) -> Partition:
    """The model's forward in regions, each with the live inputs it saw on `inputs`. Raises
    PartitionError when the model does not run on them."""
    state = _attributes(model)
    try:
        graph = _Tracer().trace(model)
    except Exception as exc:  # noqa: BLE001 - fx refuses data-dependent control flow and the like
        _restore(state)
        return _module_tree(model, inputs, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    if _restore(state):  # `self.hidden = ...` in forward: the trace would bake one call's state
        return _module_tree(model, inputs, "the forward assigns the Model's own attributes")
    unknown = [n.target for n in graph.nodes if n.op == "get_attr" and not _has_attr(model, str(n.target))]
    if unknown:  # constants fx made at trace time: ModelNew's forward could not name them
        return _module_tree(model, inputs, f"the trace holds constants the Model does not: {unknown[:3]}")
    try:
        values = _node_values(model, graph, inputs)
    except PartitionError as exc:  # a trace that does not run as the forward does (state set in forward)
        return _module_tree(model, inputs, str(exc).splitlines()[0][:200])
    membership = _assign(model, graph, values)
    found = _traced_partition(model, graph, membership, values)
    # The regions' inputs, live: a second run keeping only those.
    wanted = {node_named(graph, name) for region in found.regions for name in region.input_names}
    live = _node_values(model, graph, inputs, keep=wanted)
    for region in found.regions:
        region.inputs = [live[node_named(graph, name)] for name in region.input_names]
    return found


def node_named(graph: torch.fx.Graph, name: str) -> torch.fx.Node:
    """The graph's node called `name` (regions keep their inputs' names, not the nodes)."""
    return next(n for n in graph.nodes if n.name == name)


_State = list[tuple[nn.Module, dict[str, Any], dict[str, Any], dict[str, Any]]]


def _attributes(model: nn.Module) -> _State:
    """Every submodule's attributes, parameters and buffers, by identity."""
    return [(m, dict(m.__dict__), dict(m._parameters), dict(m._buffers)) for m in model.modules()]


def _restore(state: _State) -> bool:
    """Put back what tracing the forward assigned (fx runs the forward's Python: `self.h = ...`
    stores a proxy); True when anything had changed."""
    changed = False
    for module, attrs, params, buffers in state:
        for now, saved in ((module.__dict__, attrs), (module._parameters, params), (module._buffers, buffers)):
            if now.keys() != saved.keys() or any(now[k] is not saved[k] for k in saved):
                changed = True
                now.clear()
                now.update(saved)
    return changed


def _has_attr(model: nn.Module, dotted: str) -> bool:
    owner: Any = model
    for part in dotted.split("."):
        if not hasattr(owner, part):
            return False
        owner = getattr(owner, part)
    return True


def _node_values(
    model: nn.Module, graph: torch.fx.Graph, inputs: Sequence[Any], keep: set[torch.fx.Node] | None = None
) -> dict[torch.fx.Node, Any]:
    """One run of the traced forward (no grad): the live values of the nodes in `keep`, or without
    `keep` every node's value with each tensor a meta-device stand-in of its shape and dtype. Values
    no later node needs are freed as the forward goes (fx's Interpreter does), so a partition holds
    at most the activations its regions take as inputs, never every intermediate of the forward."""
    values: dict[torch.fx.Node, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            if keep is None:
                values[n] = _stand_in(out)
            elif n in keep:
                values[n] = out
            return out

    try:
        with torch.no_grad():
            Recorder(torch.fx.GraphModule(model, graph)).run(*inputs)
    except Exception as exc:  # noqa: BLE001
        raise PartitionError(f"the traced forward does not run: {type(exc).__name__}: {exc}") from exc
    return values


def _stand_in(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, (tuple, list)):
        return tuple(_stand_in(v) for v in value)
    return value


def node_kind(model: nn.Module, node: torch.fx.Node) -> str:
    """ "anchor", "library", or "fusable" for a node that computes; "" for placeholders and the like."""
    if node.op == "call_module":
        sub = model.get_submodule(str(node.target))
        if isinstance(sub, LIBRARY_MODULES):
            return "library"
        return "anchor" if isinstance(sub, ANCHOR_MODULES) else "fusable"
    if node.op == "call_function":
        if node.target in LIBRARY_FUNCTIONS:
            return "library"
        return "anchor" if node.target in ANCHOR_FUNCTIONS else "fusable"
    if node.op == "call_method":
        return "anchor" if node.target in ANCHOR_METHODS else "fusable"
    return ""


def op_label(model: nn.Module, node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"{type(model.get_submodule(str(node.target))).__name__} {node.target}"
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target)).strip("_")
    return str(node.target)


def _assign(model: nn.Module, graph: torch.fx.Graph, values: dict[torch.fx.Node, Any]) -> dict[torch.fx.Node, int]:
    """Region index of every computing node. An anchor starts a region; a library layer is a region
    of its own; any other op joins the latest region its inputs come from (so regions only ever
    depend on earlier ones; an op on the forward's inputs alone, the latest region), or starts a
    chain when that region is a library layer or there is none."""
    membership: dict[torch.fx.Node, int] = {}
    closed: set[int] = set()  # library regions: nothing joins them
    unpacked: dict[torch.fx.Node, int] = {}  # elements of a tuple a region returns: that region
    count = 0
    for node in graph.nodes:
        kind = node_kind(model, node)
        if not kind:
            continue
        if kind in ("anchor", "library") and isinstance(values.get(node), (torch.Tensor, tuple)):
            membership[node] = count
            if kind == "library":
                closed.add(count)
            count += 1
            continue
        found = (membership.get(a, unpacked.get(a)) for a in node.all_input_nodes)
        sources = [r for r in found if r is not None]
        # An op on the forward's inputs alone joins the latest region (it depends on nothing there).
        latest = max(sources, default=count - 1 if count else None)
        if not isinstance(values.get(node), torch.Tensor):
            if isinstance(values.get(node), tuple) and latest is not None:
                unpacked[node] = latest  # a tuple inside a layer's output: `out, (hn, cn) = self.lstm(x)`
            continue  # sizes and numbers: kept in the forward, copied into each region that uses them
        if node.target is operator.getitem and not isinstance(values.get(node.args[0]), torch.Tensor):
            # Unpacking a layer's tuple (`out, _ = self.lstm(x)`): the element is an input of the
            # regions that use it, and comes from the layer's region.
            if latest is not None:
                unpacked[node] = latest
            continue
        if latest is None or latest in closed:
            membership[node] = count
            count += 1
        else:
            membership[node] = latest
    return membership


def _traced_partition(
    model: nn.Module, graph: torch.fx.Graph, membership: dict[torch.fx.Node, int], values: dict[torch.fx.Node, Any]
) -> Partition:
    by_region: dict[int, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node in membership:
            by_region.setdefault(membership[node], []).append(node)
    regions: list[Region] = []
    nodes: dict[int, list[torch.fx.Node]] = {}
    for index, members in enumerate(by_region.values()):
        sub, external, outputs = region_graph(model, members, values)
        kinds = {node_kind(model, n) for n in members}
        kind = "library" if "library" in kinds else "anchor" if node_kind(model, members[0]) == "anchor" else "chain"
        regions.append(
            Region(
                index=index,
                kind=kind,
                ops=[op_label(model, n) for n in members if isinstance(values.get(n), (torch.Tensor, tuple))],
                module=sub,
                inputs=[values[n] for n in external],  # stand-ins until the live run
                input_names=[n.name for n in external],
                output_names=[n.name for n in outputs],
            )
        )
        nodes[index] = members
    return Partition(regions=regions, traced=True, graph=graph, nodes=nodes)


def _is_structure(node: torch.fx.Node, values: dict[torch.fx.Node, Any]) -> bool:
    """A node of sizes and numbers (`x.size(0)`), copied into each region that uses it."""
    return node.op in ("call_function", "call_method") and not isinstance(values.get(node), torch.Tensor)


def region_graph(
    model: nn.Module, members: Sequence[torch.fx.Node], values: dict[torch.fx.Node, Any]
) -> tuple[torch.fx.GraphModule, list[torch.fx.Node], list[torch.fx.Node]]:
    """(the region's sub-module, the outer nodes its inputs are, the nodes it outputs). Parameters
    (`get_attr`) and size computations it uses are copied in; tensors made outside are inputs."""
    inside = set(members)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    external: list[torch.fx.Node] = []

    def bring(outer: torch.fx.Node) -> torch.fx.Node:
        if outer in env:
            return env[outer]
        if outer.op == "get_attr":
            env[outer] = graph.get_attr(str(outer.target))
        elif outer not in inside and _is_structure(outer, values):
            env[outer] = graph.node_copy(outer, bring)
        elif outer not in inside:
            external.append(outer)
            env[outer] = graph.placeholder(outer.name)
        return env[outer]

    # Placeholders first, in the order the region meets its inputs.
    for node in members:
        for arg in node.all_input_nodes:
            if arg not in inside and arg.op != "get_attr" and not _is_structure(arg, values):
                bring(arg)
    for node in members:
        env[node] = graph.node_copy(node, bring)
    outputs = [
        n for n in members if isinstance(values.get(n), (torch.Tensor, tuple)) and _used_outside(n, inside, values)
    ]
    if outputs:
        graph.output(env[outputs[0]] if len(outputs) == 1 else tuple(env[n] for n in outputs))
    else:
        graph.output(None)
    module = torch.fx.GraphModule(model, graph, class_name="Region")
    module.graph.eliminate_dead_code()
    module.recompile()
    return module, external, outputs


def _used_outside(node: torch.fx.Node, inside: set[torch.fx.Node], values: dict[torch.fx.Node, Any]) -> bool:
    """Whether a node outside the region needs `node`: directly, or through sizes computed from it
    (`x.size(0)` used by the region itself does not make `x` an output)."""
    for user in node.users:
        if user in inside:
            continue
        if not _is_structure(user, values) or _used_outside(user, inside, values):
            return True
    return False


def _module_tree(model: nn.Module, inputs: Sequence[Any], why: str) -> Partition:
    """Each child module called exactly once by the forward, with positional tensors, is a region
    (nn.Sequential and nn.ModuleList are opened into their layers); the forward's own code between
    them stays as it is."""
    calls: dict[str, list[tuple[Any, ...]]] = {}
    order: list[str] = []
    children = list(_children(model))
    hooks = []
    for path, child in children:

        def record(mod: nn.Module, args: tuple[Any, ...], path: str = path) -> None:
            if path not in calls:
                order.append(path)
            calls.setdefault(path, []).append(args)

        hooks.append(child.register_forward_pre_hook(record))
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as exc:  # noqa: BLE001
        raise PartitionError(f"the Model does not run on its inputs: {type(exc).__name__}: {exc}") from exc
    finally:
        for hook in hooks:
            hook.remove()
    modules = dict(children)
    regions: list[Region] = []
    for path in order:
        child = modules[path]
        library = isinstance(child, LIBRARY_MODULES)  # listed whatever its arguments: no kernel replaces it
        if len(calls[path]) != 1 or not library and not all(isinstance(a, torch.Tensor) for a in calls[path][0]):
            continue  # called twice, or with other arguments: one region cannot stand for it
        kind = "library" if library else "anchor" if isinstance(child, ANCHOR_MODULES) else "chain"
        regions.append(
            Region(
                index=len(regions),
                kind=kind,
                ops=[f"{type(child).__name__} {path}"],
                module=child,
                inputs=list(calls[path][0]),
                input_names=[f"input {i}" for i in range(len(calls[path][0]))],
                child=path,
            )
        )
    return Partition(regions=regions, traced=False, why_untraced=why)


def _children(model: nn.Module, prefix: str = "") -> list[tuple[str, nn.Module]]:
    out: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            out += _children(child, f"{path}.")
        else:
            out.append((path, child))
    return out


def rank_by_cost(
    regions: Sequence[Region], device: str, timer: Callable[[Callable[[], Any]], float] | None = None
) -> list[Region]:
    """The regions costliest first, each with its cost and its share of all regions' cost: on CUDA
    its eager time (`timer`, warmed CUDA events), elsewhere an estimate from its FLOPs and bytes."""
    for region in regions:
        if device == "cuda" and timer is not None:
            with torch.no_grad():
                region.cost_us = timer(_caller(region.module, region.inputs))
            region.cost_basis = "measured"
        else:
            region.cost_us, region.cost_basis = estimate_us(region.module, region.inputs), "estimate"
    total = sum(r.cost_us for r in regions) or 1.0
    for region in regions:
        region.share = region.cost_us / total
    return sorted(regions, key=lambda r: -r.cost_us)


def signature(region: Region) -> str:
    """The region's computation up to its parameters' values and paths: the ops in order with their
    modules' configuration (`Conv2d(64, 64, kernel_size=(3, 3), stride=(1, 1), ...)`), how they
    connect, and the inputs' shapes and dtypes. A ResNet's repeated blocks share one, and so one kernel."""
    inputs = "|".join(f"{tuple(x.shape)}:{x.dtype}" if isinstance(x, torch.Tensor) else repr(x) for x in region.inputs)
    module = region.module
    if not isinstance(module, torch.fx.GraphModule):
        return f"{type(module).__module__}.{type(module).__qualname__}|{module!r}|{module.training}|{inputs}"
    index: dict[torch.fx.Node, str] = {}
    parts = [inputs]
    for node in module.graph.nodes:
        index[node] = f"%{len(index)}"
        target: Any = node.target
        if node.op == "call_module":
            sub = module.get_submodule(str(node.target))
            target = f"{type(sub).__qualname__}:{sub!r}:{sub.training}"
        elif node.op == "get_attr":
            value = _tensor_at(module, str(node.target))
            target = f"{tuple(value.shape)}:{value.dtype}" if value is not None else "attr"
        elif node.op == "placeholder":
            target = "input"
        args = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: index[n])
        parts.append(f"{node.op} {getattr(target, '__name__', target)} {args!r}")
    return "\n".join(parts)


def _tensor_at(module: nn.Module, dotted: str) -> torch.Tensor | None:
    owner: Any = module
    for part in dotted.split("."):
        owner = getattr(owner, part, None)
    return owner if isinstance(owner, torch.Tensor) else None


def _caller(module: nn.Module, inputs: Sequence[Any]) -> Callable[[], Any]:
    return lambda: module(*inputs)


def estimate_us(module: nn.Module, inputs: Sequence[Any]) -> float:
    """FLOPs at NOMINAL_FLOPS_PER_US plus bytes (inputs, parameters, outputs once) at
    NOMINAL_BYTES_PER_US: the roofline floor of the region on an H100-class GPU."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    saved = {path: b.clone() for path, b in module.named_buffers()}
    try:
        with torch.no_grad(), counter:
            out = module(*inputs)
    except Exception:  # noqa: BLE001 - an op the counter cannot follow: its bytes alone
        with torch.no_grad():
            out = module(*inputs)
        counter = FlopCounterMode(display=False)
    finally:
        with torch.no_grad():  # a training-mode BatchNorm moved its statistics: put them back
            for path, b in module.named_buffers():
                b.copy_(saved[path])
    outputs = out if isinstance(out, (tuple, list)) else [out]
    tensors = [*inputs, *module.parameters(), *outputs]
    moved = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    return counter.get_total_flops() / NOMINAL_FLOPS_PER_US + moved / NOMINAL_BYTES_PER_US
