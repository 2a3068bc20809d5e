"""What one kernel of the plan computes and what its emitter produces, shared by every emitter
module and by the planner: the buffers kernels write and read, a kernel's domain and stores, and
the emitter's values (Triton expressions with an index category, see emit.py), code regions and
runtime arguments.

A leaf of the code generator (it imports only ir.py and symbolic.py), so the planner (plan.py) and
the host-side writer (source.py) can use these types without the emitters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy
import torch

import gpuyantra.authors.opengen.ir as ir
from gpuyantra.authors.opengen.symbolic import product


@dataclass
class Buffer:
    """A tensor a kernel writes (an output or an intermediate) and later kernels may read."""

    name: str
    shape: tuple[sympy.Expr, ...]  # allocation shape (row-major, contiguous)
    kind: str
    node: ir.Node | None = None  # the value it holds (None: a graph output computed via a reshape)


@dataclass(frozen=True)
class Domain:
    shape: tuple[sympy.Expr, ...]
    rdims: tuple[int, ...]  # reduced (column) dims; () for flat kernels
    mm: ir.MatMul | None = None  # matmul kernels: the product whose (m, n) tiles the kernel computes

    @property
    def flat(self) -> bool:
        return not self.rdims and self.mm is None

    @property
    def kept(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d not in self.rdims)

    @property
    def trailing(self) -> bool:
        """Reduced dims are the last ones: a row is one contiguous run of a row-major tensor."""
        n = len(self.shape)
        return self.rdims == tuple(range(n - len(self.rdims), n))

    @property
    def inner_tiled(self) -> bool:
        """Reduced dims before the last kept dim (a sum over dim 1 of [B, D1, D2]): a program's
        rows are consecutive indices of that last kept dim, contiguous in memory, so its loads
        coalesce; the other kept dims are one index per program."""
        kept = self.kept
        return bool(self.rdims and kept and kept[-1] > max(self.rdims) and self.shape[kept[-1]] != 1)

    def inner(self) -> sympy.Expr:
        return self.shape[self.kept[-1]]

    def outer(self) -> sympy.Expr:
        return product([self.shape[d] for d in self.kept[:-1]])

    def rows(self) -> sympy.Expr:
        return product([self.shape[d] for d in self.kept])

    def cols(self) -> sympy.Expr:
        return product([self.shape[d] for d in self.rdims]) if self.rdims else product(self.shape)


@dataclass(frozen=True)
class Store:
    node: ir.Node
    buffer: Buffer
    mode: str  # "full": at every domain index; "row": one value per row
    keepdim: bool = False  # row stores: the node's index has the reduced dims as size 1


@dataclass
class Val:
    code: str
    cat: str  # "s" | "r" | "c" | "f"
    kind: str  # "f" | "i" | "b"
    region: Region | None = None  # None: a literal or a kernel argument (valid everywhere)

    @property
    def tensor(self) -> bool:
        return self.region is not None


ZERO = Val("0", "s", "i")


class Region:
    """A run of straight-line code; in the chunked variant, a loop over column slices or the code
    between two loops."""

    def __init__(self, kind: str, ident: int):
        self.kind = kind  # "main" | "loop" | "post"
        self.ident = ident
        self.pre: list[str] = []  # loop accumulators, before the loop
        self.lines: list[str] = []
        self.closed = False
        self.final = False  # the loop that stores full-tile outputs (scans run there)
        self.reverse: bool | None = None  # that loop's direction, once a scan inside sets it


def join_cats(*cats: str) -> str:
    has_r = any(c in ("r", "f") for c in cats)
    has_c = any(c in ("c", "f") for c in cats)
    return "f" if has_r and has_c else "r" if has_r else "c" if has_c else "s"


@dataclass
class KernelParams:
    """The kernel's runtime arguments, in first-use order, with their host expressions."""

    pointers: dict[str, str] = field(default_factory=dict)  # param -> host tensor variable
    scalars: dict[str, str] = field(default_factory=dict)  # param -> host expression
    flags: dict[str, str] = field(default_factory=dict)  # constexpr param -> host expression


def dtype_code(dtype: torch.dtype) -> str:
    return f"torch.{str(dtype).replace('torch.', '')}"
