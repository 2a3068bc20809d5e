"""Triton's interpreter (CPU) runs a `tl.reduce` with a kernel's own combine function one element
at a time: a Python call of the combine per element, about a millisecond each. A LayerNorm whose
mean and variance come from one paired reduction (`tl.reduce((d, d * d), 1, _add_pair)`) spent
nine tenths of its verification there (130 ms a row).

`install()` replaces that loop with an ordered pairwise tree: adjacent pairs combined as whole
arrays, log2(n) calls of the combine. Triton asks combine functions to be associative, so every
bracketing is a valid reduction (the GPU's is a tree too, and `tl.sum` under the interpreter is
numpy's pairwise sum); adjacent pairs keep the elements' order, so a combine that is associative but
not commutative (first/last wins, an argmax's tie-break) gives what the loop gives. Only the
interpreter is touched; a Triton without the hooks this relies on keeps its own loop."""

from __future__ import annotations

import os
from typing import Any

_INSTALLED = False
_LOOP: Any = None  # the interpreter's own loop, for a combine that cannot take whole arrays


def install() -> bool:
    """Use the tree in this process's interpreter (idempotent); False where it is not installed
    (kernels compiled for a GPU, or a Triton whose interpreter differs)."""
    global _INSTALLED
    if _INSTALLED:
        return True
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    reduce_ops = getattr(interpreter, "ReduceOps", None)
    if reduce_ops is None or not all(hasattr(reduce_ops, name) for name in ("generic_reduce", "unravel", "to_tensor")):
        return False
    global _LOOP
    _LOOP = reduce_ops.generic_reduce
    reduce_ops.generic_reduce = _tree_or_loop
    _INSTALLED = True
    return True


def _tree_or_loop(self: Any, inputs: tuple[Any, ...]) -> list[Any]:
    """The tree; the interpreter's loop where the combine fails on whole arrays (it then fails, or
    not, exactly as it would have)."""
    try:
        return _tree_reduce(self, inputs)
    except Exception:  # noqa: BLE001 - the loop is the reference behaviour, errors included
        return _LOOP(self, inputs)


def _tree_reduce(self: Any, inputs: tuple[Any, ...]) -> list[Any]:
    """`ReduceOps.generic_reduce` as an ordered pairwise tree over the reduced axis."""
    import numpy as np
    import triton.language as tl

    original_axis = self.axis
    inputs, axis = self.unravel(inputs, self.axis)
    dtypes = [arg.dtype for arg in inputs]
    input_shape = inputs[0].handle.data.shape
    # The reduced axis last; each array keeps its input's numpy dtype (the loop stored every partial
    # result back into an array of that dtype).
    values = [np.moveaxis(arg.handle.data, axis, -1) for arg in inputs]
    while values[0].shape[-1] > 1:
        count = values[0].shape[-1]
        even = count - count % 2
        left = [self.to_tensor(np.ascontiguousarray(v[..., 0:even:2]), dt) for v, dt in zip(values, dtypes)]
        right = [self.to_tensor(np.ascontiguousarray(v[..., 1:even:2]), dt) for v, dt in zip(values, dtypes)]
        combined = self.combine_fn.fn(*left, *right)
        combined = combined if isinstance(combined, tuple) else (combined,)
        paired = [
            np.broadcast_to(
                c.handle.data if isinstance(c, tl.core.tensor) else np.asarray(getattr(c, "value", c)),
                v[..., 0:even:2].shape,
            ).astype(v.dtype)
            for c, v in zip(combined, values)
        ]
        # An odd element out stays last, in its place.
        values = [np.concatenate([p, v[..., even:]], axis=-1) if even < count else p for p, v in zip(paired, values)]
    results = [v[..., 0] for v in values]
    packed = []
    for data, dtype in zip(results, dtypes):
        data = np.asarray(data)
        if self.keep_dims:
            if original_axis is not None:
                data = np.expand_dims(data, axis)
            else:
                for _ in range(len(input_shape)):
                    data = np.expand_dims(data, 0)
        elif original_axis is None:
            data = data.item()
        packed.append(self.to_tensor(data, dtype))
    return packed
