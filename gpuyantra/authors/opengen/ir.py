"""The author's view of a traced computation: a DAG of tensor values, each a function of its index.

Nodes are lazy: a node says how to compute its value at any index from its inputs' values at
derived indices (views remap indices, pointwise ops combine values, reductions and scans fold a
row, matrix products sum over K). The planner decides which nodes become buffers (outputs, and
reductions or products read at other indices than the ones a kernel computes); every other node is
recomputed inline where it is read.

Kinds: "f" (floating: computed in float32 in the kernels), "i" (integer), "b" (bool).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import sympy
import torch

from gpuyantra.authors.opengen.symbolic import Shape


@dataclass(eq=False)
class Node:
    shape: Shape
    kind: str
    dtype: torch.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(eq=False)
class Input(Node):
    """A tensor entry receives: a forward input (role "input") or a bound module tensor ("param")."""

    name: str
    role: str


@dataclass(eq=False)
class Scalar(Node):
    value: float | int | bool


@dataclass(eq=False)
class FloatParam(Node):
    """A bound float attribute, read at run time: scale * value**power + offset (power 1 or -1)."""

    name: str
    scale: float = 1.0
    offset: float = 0.0
    power: int = 1


@dataclass(eq=False)
class SizeValue(Node):
    """A size-derived scalar (numel of a mean, a dim size)."""

    expr: sympy.Expr


@dataclass(eq=False)
class Pointwise(Node):
    op: str
    args: tuple[Node, ...]


@dataclass(eq=False)
class Broadcast(Node):
    """prims.broadcast_in_dim: source dim i is output dim bdims[i]; other output dims broadcast."""

    src: Node
    bdims: tuple[int, ...]


@dataclass(eq=False)
class Reshape(Node):
    """Same elements in the same (row-major) order, another shape."""

    src: Node


@dataclass(eq=False)
class Permute(Node):
    src: Node
    perm: tuple[int, ...]  # output dim i is source dim perm[i]


@dataclass(eq=False)
class Slice(Node):
    src: Node
    starts: Shape
    steps: tuple[int, ...]


@dataclass(eq=False)
class Rev(Node):
    src: Node
    dims: tuple[int, ...]


@dataclass(eq=False)
class Cat(Node):
    srcs: tuple[Node, ...]
    dim: int


@dataclass(eq=False)
class Gather(Node):
    src: Node
    dim: int
    index: Node


@dataclass(eq=False)
class Index(Node):
    """Advanced indexing src[..., i, ...] with integer index tensors (None: a full slice)."""

    src: Node
    indices: tuple[Node | None, ...]


@dataclass(eq=False)
class AsStrided(Node):
    """as_strided on a value laid out row-major: element i of the output is element
    offset + sum(i_d * strides_d) of the source's row-major order."""

    src: Node
    strides: Shape
    offset: sympy.Expr


@dataclass(eq=False)
class Split(Node):
    """src's elements in row-major order as `parts` rows of `chunk` (shape (parts, chunk)): a
    full reduction spread over many programs. Positions past src's end hold `pad`. With `dims`,
    only those dims of src are split, per index of the others (shape (*kept, parts, chunk)): a
    reduction of a few very long rows spread over many programs."""

    src: Node
    pad: float | int
    dims: tuple[int, ...] = ()


@dataclass(eq=False)
class Iota(Node):
    start: int
    step: int


@dataclass(eq=False)
class Reduce(Node):
    """A fold over `dims` of src (no keepdim: the result drops them). op: sum, prod, max, min,
    argmax, argmin (first index of the extreme)."""

    op: str
    src: Node
    dims: tuple[int, ...]


@dataclass(eq=False)
class MatMul(Node):
    """A batched matrix product: out[*b, m, n] = sum over k of a[*b, m, k] * b[*b, k, n] (a of shape
    (*batch, M, K), b of shape (*batch, K, N), batch dims equal). Its kernel tiles (m, n), sums
    float32 products over K, and fuses the elementwise work before it (operands) and after it."""

    a: Node
    b: Node


@dataclass(eq=False)
class Scan(Node):
    """An inclusive scan along `dim`. op: sum, prod, logsumexp. `reverse`: from the last element
    to the first (flip, scan, flip in one pass)."""

    op: str
    src: Node
    dim: int
    reverse: bool = False


def children(node: Node) -> tuple[Node, ...]:
    """The nodes `node` reads."""
    if isinstance(node, Pointwise):
        return node.args
    if isinstance(node, Cat):
        return node.srcs
    if isinstance(node, Gather):
        return (node.src, node.index)
    if isinstance(node, Index):
        return (node.src, *(i for i in node.indices if i is not None))
    if isinstance(node, MatMul):
        return (node.a, node.b)
    src = getattr(node, "src", None)
    return (src,) if isinstance(src, Node) else ()


def nodes_from(*roots: Node) -> Iterator[Node]:
    """Each distinct node the roots are computed from, the roots included (depth first)."""
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        todo.extend(children(n))


def reaches(node: Node, target: Node) -> bool:
    """Whether `target` is among the values `node` is computed from (or is `node`)."""
    return any(n is target for n in nodes_from(node))


def kind_of(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "b"
    if dtype.is_floating_point:
        return "f"
    if dtype.is_complex:
        raise ValueError("complex")
    return "i"
