"""ModelNew for a partitioned model: the Model's own forward with each region whose kernel was kept
replaced by a call of that kernel, every other region left as the Model's own code.

A traced forward is written back as Python (torch.fx's code generation) where each replaced region
is one call, `self._gy_region_3(x)`, of a method that passes the region's inputs and the Model's
live parameters to the kernel's `entry`. A module-tree partition keeps the Model's forward and
points each replaced child's `forward` at its kernel. ModelNew subclasses Model either way: same
`__init__`, parameters and state.
"""

from __future__ import annotations

import builtins
import hashlib
import heapq
import inspect
import operator
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx

from gpuyantra.kernelbench.model_new import _forward_with_updates, attribute_code
from gpuyantra.kernelbench.regions import Partition, Region, node_named


class ComposeError(Exception):
    """The Model's forward cannot be written back with the regions replaced."""


@dataclass
class RegionKernel:
    """A region's kept kernel: its candidate file and how ModelNew calls its entry."""

    region: Region
    candidate: Path
    adapter: list[dict[str, str]]
    updated_buffers: Sequence[str] = ()
    buffer_steps: Sequence[tuple[str, int]] = ()
    forward_returns_tuple: bool = False


def composed_forward(partition: Partition, kernels: dict[int, RegionKernel]) -> str:
    """The traced forward's Python with each region of `kernels` one call of its method. Units (a
    replaced region, or one node of the Model's own) run in an order where every input is made
    first, as close to the Model's own order as that allows."""
    graph = partition.graph
    if graph is None:
        raise ComposeError("the forward was not traced")
    order = list(graph.nodes)
    position = {n: i for i, n in enumerate(order)}
    owner: dict[torch.fx.Node, int] = {n: r for r in kernels for n in partition.nodes[r]}
    externals = {r: [node_named(graph, name) for name in kernels[r].region.input_names] for r in kernels}

    def unit(node: torch.fx.Node) -> Any:
        return ("region", owner[node]) if node in owner else ("node", position[node])

    output = next(n for n in order if n.op == "output")
    needed = _needed(output, owner, externals)
    members: dict[Any, list[torch.fx.Node]] = {}
    for node in order:
        if node.op != "output" and (node in needed or node.op == "placeholder"):
            members.setdefault(unit(node), []).append(node)
    deps: dict[Any, set[Any]] = {}
    for key, nodes in members.items():
        sources = externals[key[1]] if key[0] == "region" else nodes[0].all_input_nodes
        deps[key] = {unit(n) for n in sources} - {key}
    ready = [(position[nodes[0]], key) for key, nodes in members.items() if not deps[key]]
    heapq.heapify(ready)
    users: dict[Any, set[Any]] = {}
    for key, needs in deps.items():
        for need in needs:
            users.setdefault(need, set()).add(key)
    new = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    done: set[Any] = set()
    while ready:
        _, key = heapq.heappop(ready)
        done.add(key)
        if key[0] == "region":
            _call_region(new, env, kernels[key[1]], externals[key[1]], partition.nodes[key[1]])
        else:
            node = members[key][0]
            env[node] = new.node_copy(node, lambda a: env[a])
        for user in users.get(key, ()):
            if deps[user] <= done and user not in done:
                heapq.heappush(ready, (position[members[user][0]], user))
    if len(done) != len(members):
        raise ComposeError("the regions depend on each other in a cycle")
    new.node_copy(output, lambda a: env[a])
    _drop_unused(new)
    for node in new.nodes:
        node.type = None  # the forward's annotations (`x: torch.Tensor`) are not needed to run it
    code = new.python_code(root_module="self")
    return _with_imports(code.src, code.globals)


def _needed(
    output: torch.fx.Node, owner: dict[torch.fx.Node, int], externals: dict[int, list[torch.fx.Node]]
) -> set[torch.fx.Node]:
    """The nodes the composed forward still computes: what the output needs, through the Model's own
    nodes and the replaced regions' inputs (a size read inside a replaced region is not needed)."""
    needed: set[torch.fx.Node] = set()
    todo = list(output.all_input_nodes)
    while todo:
        node = todo.pop()
        if node in needed:
            continue
        needed.add(node)
        todo += externals[owner[node]] if node in owner else node.all_input_nodes
    return needed


def _call_region(
    graph: torch.fx.Graph,
    env: dict[torch.fx.Node, torch.fx.Node],
    kernel: RegionKernel,
    externals: list[torch.fx.Node],
    nodes: list[torch.fx.Node],
) -> None:
    call = graph.call_module(f"_gy_{kernel.region.name}", tuple(env[e] for e in externals))
    outputs = [n for n in nodes if n.name in kernel.region.output_names]
    if len(outputs) == 1:
        env[outputs[0]] = call
        return
    for k, node in enumerate(outputs):
        env[node] = graph.call_function(operator.getitem, (call, k))


def _drop_unused(graph: torch.fx.Graph) -> None:
    """Parameters read and sizes computed only for nodes a kernel replaced."""
    for node in reversed(list(graph.nodes)):
        if not node.users and node.op in ("get_attr", "call_method", "call_function"):
            if node.op == "get_attr" or node.target in (getattr, operator.getitem) or node.target == "size":
                graph.erase_node(node)


def _with_imports(src: str, globals_: dict[str, Any]) -> str:
    """The forward's source, preceded by the names it uses (torch.fx's code refers to its globals)."""
    lines: list[str] = []
    # fx frees each value after its last use (`;  x = None`): not needed for a reader.
    body = re.sub(r";  (?:\w+ = )+None$", "", textwrap.dedent(src).strip("\n"), flags=re.M)
    for name, value in sorted(globals_.items()):
        if not re.search(rf"\b{re.escape(name)}\b", body) or name == "torch" or getattr(builtins, name, None) is value:
            continue
        if inspect.ismodule(value):
            lines.append(f"    import {value.__name__} as {name}" if value.__name__ != name else f"    import {name}")
        elif isinstance(value, float) and name in ("inf", "nan"):
            lines.append(f"    {name} = float({name!r})")
        elif getattr(value, "__module__", None) and getattr(value, "__qualname__", "").isidentifier():
            lines.append(f"    from {value.__module__} import {value.__qualname__} as {name}")
        else:
            raise ComposeError(f"the traced forward uses {name} = {value!r}, which ModelNew cannot name")
    head, _, rest = body.partition("\n")
    return "\n".join([head, *lines, rest])


def model_new_source(
    problem_source: str,
    problem_path: Path,
    partition: Partition,
    kernels: dict[int, RegionKernel],
    folder: Path,
) -> str:
    """ModelNew.py: the problem's source verbatim, the regions in a comment table, the kernels'
    loader, then ModelNew(Model) with its forward and one method per replaced region."""
    table = "".join(
        f"#   {r.name:<10} {r.share:6.1%}  {r.runs_as:<9} {', '.join(r.ops)[:90]}\n"
        for r in sorted(partition.regions, key=lambda r: r.index)
    )
    header = (
        f"# ModelNew for the KernelBench problem {problem_path.name}, written by `gpuyantra kernelbench`.\n"
        "# The Model's forward in regions (a library anchor and the ops fused after it, or a chain of\n"
        "# fusable ops); `kernel`: a verified Triton kernel (library calls allowed) runs the region,\n"
        "# `library` / `unchanged`: the Model's own modules run it. Region, share of the forward, runs as, ops:\n"
        f"{table}"
        "# The problem's source follows verbatim (Model, get_inputs, get_init_inputs).\n"
        f"# ---- problem source: {problem_path.name} ----\n"
    )
    body = problem_source if problem_source.endswith("\n") else problem_source + "\n"
    loads = "".join(
        f"_gy_{k.region.name}_kernel = _gy_load_kernel("
        f"{_relative(k.candidate, folder)!r}, {str(k.candidate.resolve())!r}, {_digest(k.candidate)!r})\n"
        for k in _in_order(kernels)
    )
    footer = f'''
# ---- end of problem source ----

import importlib.util as _gy_importlib_util
import os as _gy_os
import sys as _gy_sys
import types as _gy_types

import torch as _gy_torch


def _gy_load_kernel(relative, written, digest):
    """Import a region's kernel file (a real .py file: Triton reads kernel source with inspect),
    next to this file first, else where it was written."""
    here = globals().get("__file__")
    paths = [_gy_os.path.join(_gy_os.path.dirname(_gy_os.path.abspath(here)), relative)] if here else []
    paths.append(written)
    path = next((p for p in paths if _gy_os.path.isfile(p)), None)
    if path is None:
        raise FileNotFoundError(f"kernel file {{relative}} not found in {{paths}}")
    if not _gy_torch.cuda.is_available():
        _gy_os.environ.setdefault("TRITON_INTERPRET", "1")  # no GPU: Triton kernels run in its interpreter
    name = f"gpuyantra_kernelbench_kernel_{{digest}}"
    module = _gy_sys.modules.get(name)
    if module is None:
        spec = _gy_importlib_util.spec_from_file_location(name, path)
        module = _gy_importlib_util.module_from_spec(spec)
        _gy_sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            _gy_sys.modules.pop(name, None)
            raise
    return module


{loads}
'''
    if partition.traced:
        footer += _traced_class(partition, kernels)
    else:
        footer += _tree_class(kernels)
    return header + body + footer


def _traced_class(partition: Partition, kernels: dict[int, RegionKernel]) -> str:
    forward = textwrap.indent(composed_forward(partition, kernels), "    ")
    methods = "".join(
        _region_method(k, f"_gy_{k.region.name}", "self", k.region.input_names) for k in _in_order(kernels)
    )
    return (
        "class ModelNew(Model):\n"
        '    """Model with its costliest regions computed by verified kernels (the regions table above)."""\n\n'
        f"{forward}\n\n{methods}"
    )


def _tree_class(kernels: dict[int, RegionKernel]) -> str:
    """The Model's forward as it is; each replaced child's forward points at its kernel."""
    functions = "".join(
        _region_method(k, f"_gy_{k.region.name}_forward", "self", ["*inputs"], indent="") for k in _in_order(kernels)
    )
    binds = "".join(
        f"        {attribute_code('self', str(k.region.child))}.forward = _gy_types.MethodType(\n"
        f"            _gy_{k.region.name}_forward, {attribute_code('self', str(k.region.child))}\n"
        "        )\n"
        for k in _in_order(kernels)
    )
    return (
        f"{functions}\n"
        "class ModelNew(Model):\n"
        '    """Model whose costliest children run verified kernels (the regions table above)."""\n\n'
        "    def __init__(self, *args, **kwargs):\n"
        "        super().__init__(*args, **kwargs)\n"
        f"{binds}"
    )


def _region_method(kernel: RegionKernel, name: str, owner: str, args: Sequence[str], indent: str = "    ") -> str:
    region = kernel.region
    inputs = ", ".join(args)
    kwargs = "".join(f", {b['kernel_param']}={attribute_code(owner, b['module_attr'])}" for b in kernel.adapter)
    call = f"_gy_{region.name}_kernel.entry({inputs}{kwargs})"
    if kernel.updated_buffers or kernel.buffer_steps:
        body = _forward_with_updates(call, kernel.updated_buffers, kernel.buffer_steps, kernel.forward_returns_tuple)
    else:
        body = f"        return {call}\n"
    library = f"; library calls: {', '.join(region.library_calls)}" if region.library_calls else ""
    text = (
        f"    def {name}(self, {inputs}):\n"
        f'        """{region.name}: {", ".join(region.ops)[:200]}.\n'
        f'        Kernel {kernel.candidate.name} (reward {region.reward:+d}{library})."""\n'
        f"{body}\n"
    )
    return textwrap.indent(textwrap.dedent(text), indent) if indent != "    " else text


def _in_order(kernels: dict[int, RegionKernel]) -> list[RegionKernel]:
    return [kernels[r] for r in sorted(kernels)]


def _relative(path: Path, folder: Path) -> str:
    try:
        return path.resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return path.name


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
