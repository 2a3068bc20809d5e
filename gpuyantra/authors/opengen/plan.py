"""Which kernels to launch: outputs and the intermediates other kernels must read, grouped by domain.

1. Each output is a *target*; reshapes on top of it are free (same row-major order), so the kernel
   computes the value under them and stores it into the output's memory.
2. A target's domain comes from the nearest fold below it: a value of the fold's source shape is
   a full-tile target of that row kernel (softmax, norms), a value of its reduced shape a per-row
   target (sum, mean, norm); a value of a matrix product's shape (or a reshape of it), with no row
   fold nearer, is an epilogue of that product's matmul kernel; with no fold, a flat elementwise
   kernel. A product read anywhere else (under a row fold, as another product's operand) is written
   to a float32 buffer by its own matmul kernel first.
3. Emitting a target may need a fold read at other rows than the kernel's own (a loss averaging
   per-row norms, GroupNorm's per-group stats read per channel): that fold becomes a target too,
   written to a float32 buffer by an earlier kernel.
4. Targets with the same domain and dependency level share one kernel.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import sympy

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.kernel import Buffer, Domain, Store
from gpuyantra.authors.opengen.lower import Lowered
from gpuyantra.authors.opengen.matmul import make_emitter
from gpuyantra.authors.opengen.spec import Unsupported
from gpuyantra.authors.opengen.symbolic import product, same, same_shape


@dataclass
class Target:
    node: ir.Node
    buffer: Buffer
    domain: Domain
    mode: str
    keepdim: bool
    deps: set[int] = field(default_factory=set)  # indices of targets whose buffers it reads
    level: int = 0


WINDOW_GATHERS = 4  # gathers per element from which an elementwise kernel counts as a window
# Windows of this many gathers and more (an 11x11 average pooling: 121) take a quarter of
# GATHER_BLOCK: measured on an H200, 64 elements per program ran 11x faster than 256 there.
LARGE_WINDOW = 64


@dataclass
class KernelPlan:
    name: str
    domain: Domain
    stores: list[Store]

    def _count(self, kind: type | tuple[type, ...]) -> int:
        """Distinct nodes of `kind` the kernel's stores compute from."""
        return sum(isinstance(n, kind) for n in ir.nodes_from(*(s.node for s in self.stores)))

    @property
    def gathers(self) -> int:
        return self._count((ir.Gather, ir.Index))

    @property
    def window_gathers(self) -> bool:
        """Several gathers per element (a pooling window): loads that mostly hit the cache, index
        arithmetic per load, so smaller programs keep more of them in flight (GATHER_BLOCK)."""
        return self.gathers >= WINDOW_GATHERS

    @property
    def scans(self) -> bool:
        return self._count(ir.Scan) > 0


@dataclass
class Plan:
    kernels: list[KernelPlan]
    outputs: list[Buffer]  # per graph output (the same buffer twice for a repeated output)
    temps: list[Buffer]


def choose_domain(node: ir.Node) -> tuple[Domain, str, bool]:
    """(domain, store mode, keepdim) for computing `node` (see the module docstring)."""
    if isinstance(node, ir.Reduce):
        return Domain(node.src.shape, node.dims), "row", False
    if isinstance(node, ir.Scan):
        return Domain(node.src.shape, (node.dim,)), "full", False
    if isinstance(node, ir.MatMul):
        return Domain(node.shape, (), node), "full", False
    folds = _nearest_folds(node)
    for fold in folds:
        if isinstance(fold, ir.MatMul):
            continue  # a row fold first: its kernel reads the product from the buffer a matmul kernel wrote
        shape = fold.src.shape
        rdims = fold.dims if isinstance(fold, ir.Reduce) else (fold.dim,)
        if same_shape(node.shape, shape):
            return Domain(shape, rdims), "full", False
        if isinstance(fold, ir.Reduce):
            kept = tuple(s for d, s in enumerate(shape) if d not in rdims)
            ones = tuple(sympy.Integer(1) if d in rdims else s for d, s in enumerate(shape))
            if same_shape(node.shape, kept):
                return Domain(shape, rdims), "row", False
            if same_shape(node.shape, ones):
                return Domain(shape, rdims), "row", True
    for fold in folds:
        # An epilogue of the product (its elements in the same row-major order): the matmul kernel's,
        # unless a reduction it also reads folds the product (GroupNorm's statistics): that product
        # is written to a buffer anyway, and reading it back costs less than a second K loop.
        if not isinstance(fold, ir.MatMul) or not same(product(node.shape), product(fold.shape)):
            continue
        if not any(other is not fold and ir.reaches(other, fold) for other in folds):
            return Domain(fold.shape, (), fold), "full", False
    return Domain(node.shape, ()), "full", False


def _nearest_folds(node: ir.Node) -> list[ir.Reduce | ir.Scan | ir.MatMul]:
    """Reductions, scans and products reachable from `node` without passing through another one,
    nearest first."""
    found: list[ir.Reduce | ir.Scan | ir.MatMul] = []
    seen: set[int] = set()
    todo: deque[ir.Node] = deque([node])
    while todo:
        n = todo.popleft()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, (ir.Reduce, ir.Scan, ir.MatMul)):
            found.append(n)
            continue
        todo.extend(ir.children(n))
    return found


def _reverse(target: Target) -> bool:
    """Whether the nearest scan the target computes runs from the last element to the first."""
    scans = [f for f in _nearest_folds(target.node) if isinstance(f, ir.Scan)]
    return bool(scans) and scans[0].reverse


def peel(node: ir.Node) -> ir.Node:
    """The value under reshapes (same elements, same order)."""
    while isinstance(node, ir.Reshape):
        node = node.src
    return node


class Planner:
    def __init__(self, lowered: Lowered, size_code: Callable[[sympy.Expr], str]):
        self.lowered = lowered
        self.size_code = size_code
        self.targets: list[Target] = []
        self.by_node: dict[int, int] = {}  # id(node) -> target index (materialized values)
        self.temps: list[Buffer] = []

    def plan(self) -> Plan:
        outputs: list[Buffer] = []
        seen: dict[int, Buffer] = {}
        for k, out in enumerate(self.lowered.outputs):
            if id(out) in seen:
                outputs.append(seen[id(out)])
                continue
            buf = Buffer(f"_out{k}", out.shape, out.kind, out)
            seen[id(out)] = buf
            outputs.append(buf)
            self._add_target(peel(out), buf)
        i = 0
        while i < len(self.targets):  # targets added while dry-running earlier ones are run too
            self._dry_run(i)
            i += 1
        self._levels()
        return Plan(self._group(), outputs, self.temps)

    def _add_target(self, node: ir.Node, buf: Buffer) -> int:
        domain, mode, keepdim = choose_domain(node)
        self.targets.append(Target(node, buf, domain, mode, keepdim))
        return len(self.targets) - 1

    def _materialize(self, node: ir.Node) -> int:
        if id(node) not in self.by_node:
            kind = node.kind
            buf = Buffer(f"_tmp{len(self.temps)}", node.shape, kind, node)
            self.temps.append(buf)
            self.by_node[id(node)] = self._add_target(node, buf)
        return self.by_node[id(node)]

    def _dry_run(self, i: int) -> None:
        target = self.targets[i]

        def buffer_of(node: ir.Node) -> Buffer:
            j = self._materialize(node)
            if j == i:
                raise Unsupported("internal: a kernel reads the buffer it writes")
            target.deps.add(j)
            return self.targets[j].buffer

        store = Store(target.node, target.buffer, target.mode, target.keepdim)
        domain = target.domain
        variants = ("matmul",) if domain.mm is not None else ("flat",) if domain.flat else ("single", "chunked")
        for variant in variants:
            make_emitter("_dry", domain, [store], variant, buffer_of, self.size_code).build()

    def _levels(self) -> None:
        order: list[int] = []
        state: dict[int, int] = {}

        def visit(i: int) -> None:
            if state.get(i) == 2:
                return
            if state.get(i) == 1:
                raise Unsupported("internal: intermediate buffers depend on each other in a cycle")
            state[i] = 1
            for j in self.targets[i].deps:
                visit(j)
            state[i] = 2
            order.append(i)

        for i in range(len(self.targets)):
            visit(i)
        for i in order:
            deps = self.targets[i].deps
            self.targets[i].level = 1 + max(self.targets[j].level for j in deps) if deps else 0

    def _group(self) -> list[KernelPlan]:
        groups: dict[tuple[object, ...], list[Target]] = {}
        for t in sorted(self.targets, key=lambda t: t.level):
            product_id = id(t.domain.mm) if t.domain.mm is not None else 0  # one product per matmul kernel
            # Scans of both directions over long rows cannot share one chunked loop.
            shape = tuple(str(sympy.expand(s)) for s in t.domain.shape)
            key = (t.level, shape, t.domain.rdims, product_id, _reverse(t))
            groups.setdefault(key, []).append(t)
        kernels = []
        for k, members in enumerate(groups.values()):
            stores = [Store(t.node, t.buffer, t.mode, t.keepdim) for t in members]
            kernels.append(KernelPlan(f"_k{k}", members[0].domain, stores))
        return kernels

    def buffer_of(self, node: ir.Node) -> Buffer:
        """The buffer holding a materialized node (after planning)."""
        j = self.by_node.get(id(node))
        if j is None:
            raise Unsupported("internal: a kernel reads a value no earlier kernel writes")
        return self.targets[j].buffer
