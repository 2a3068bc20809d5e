"""The interpreter's reduction with a kernel's own combine runs as an ordered pairwise tree
(gpuyantra/interpreter_reduce.py): the same answers as Triton's per-element loop (exact for
comparisons and for order-sensitive combines, within float rounding for sums), keep_dims and
whole-tensor reductions included."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from gpuyantra import interpreter_reduce


@triton.jit
def _add_pair(a1, a2, b1, b2):
    return a1 + b1, a2 + b2


@triton.jit
def _max_left(v1, i1, v2, i2):
    take = v2 > v1  # a tie keeps the left one: order matters
    return tl.where(take, v2, v1), tl.where(take, i2, i1)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _first_nonzero(a, b):
    return tl.where(a != 0, a, b)  # associative, not commutative


@triton.jit
def _rows(X, S1, S2, M, I, F, H: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, H)
    x = tl.load(X + row * H + cols)
    s1, s2 = tl.reduce((x, x * x), 0, _add_pair)
    tl.store(S1 + row, s1)
    tl.store(S2 + row, s2)
    m, i = tl.reduce((x, cols), 0, _max_left)
    tl.store(M + row, m)
    tl.store(I + row, i)
    tl.store(F + row, tl.reduce(tl.where(x > 1.0, x, 0.0), 0, _first_nonzero))


@triton.jit
def _tile(X, S, K, R: tl.constexpr, H: tl.constexpr):
    rows = tl.arange(0, R)[:, None]
    cols = tl.arange(0, H)[None, :]
    x = tl.load(X + rows * H + cols)
    tl.store(S, tl.reduce(x, None, _add))  # the whole tile to one value
    kept, _ = tl.reduce((x, x), 1, _add_pair, keep_dims=True)  # [R, 1]
    tl.store(K + rows, kept)


def _run_rows(x: torch.Tensor) -> list[torch.Tensor]:
    rows, width = x.shape
    outs = [torch.empty(rows) for _ in range(3)] + [torch.empty(rows, dtype=torch.int32), torch.empty(rows)]
    s1, s2, m, i = outs[0], outs[1], outs[2], outs[3]
    _rows[(rows,)](x, s1, s2, m, i, outs[4], H=width)
    return outs


@pytest.fixture
def stock_loop(monkeypatch):
    """The tree, with no way back to the loop (a fallback would fail the test); calling the
    returned function puts Triton's own loop back."""
    assert interpreter_reduce.install()
    loop = interpreter_reduce._LOOP

    def no_fallback(*_: object) -> None:
        raise AssertionError("the tree fell back to the loop")

    monkeypatch.setattr(interpreter_reduce, "_LOOP", no_fallback)
    return lambda: monkeypatch.setattr(interpreter.ReduceOps, "generic_reduce", loop)


@pytest.mark.parametrize("width", [1, 2, 16, 64])
def test_the_tree_answers_as_the_loop(width, stock_loop):
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(5, width, generator=gen)
    x[0] = 0.5  # all tied: the first index wins
    x[1, width // 2 :] = x[1].max() + 1  # a tie at the maximum, right half
    tree = _run_rows(x)
    stock_loop()
    loop = _run_rows(x)
    torch.testing.assert_close(tree[0], loop[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(tree[1], loop[1], rtol=1e-6, atol=1e-6)
    for got, want in zip(tree[2:], loop[2:]):  # comparisons and order: exact
        assert torch.equal(got, want)
    torch.testing.assert_close(tree[0], x.double().sum(1).float(), rtol=1e-6, atol=1e-5)
    first_max = [x[r].tolist().index(x[r].max().item()) for r in range(5)]
    assert torch.equal(tree[3], torch.tensor(first_max, dtype=torch.int32))


def test_whole_tile_and_keep_dims(stock_loop):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    total, kept = torch.empty(1), torch.empty(4)
    _tile[(1,)](x, total, kept, R=4, H=8)
    torch.testing.assert_close(total, x.sum().reshape(1), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(kept, x.sum(1), rtol=1e-6, atol=1e-5)


def test_nothing_is_replaced_off_the_interpreter(monkeypatch):
    monkeypatch.setattr(interpreter_reduce, "_INSTALLED", False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not interpreter_reduce.install()
