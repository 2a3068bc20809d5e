"""The eager and torch.compile baselines time what the module itself computes (`OpFamily.eager`),
not the family's accuracy reference where that upcasts: the same function, the module's cost."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpuyantra.ops import get_op
from gpuyantra.ops.base import as_tuple

WITH_EAGER = ["linear", "layer_norm", "add_rms_norm"]


class AtenOps(TorchDispatchMode):
    """Records the aten ops a call issues."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def _inputs(name: str, dtype: torch.dtype) -> tuple[tuple[torch.Tensor, ...], dict]:
    family = get_op(name)
    generator = torch.Generator().manual_seed(7)
    activations = family.make_activations((3, 5), 96, dtype, "cpu", generator, 1.0)
    return tuple(activations), family.make_params(96, dtype, "cpu", generator)


@pytest.mark.parametrize("name", WITH_EAGER)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_module_math_computes_the_reference(name: str, dtype: torch.dtype) -> None:
    family = get_op(name)
    assert family.eager is not None
    activations, params = _inputs(name, dtype)
    atol, rtol = family.tolerance(dtype)
    module_math = as_tuple(family.eager(*activations, **params))
    for got, want in zip(module_math, as_tuple(family.reference(*activations, **params))):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", ["linear", "layer_norm"])
def test_the_baseline_makes_no_float32_copies_of_16_bit_inputs(name: str) -> None:
    """`reference` upcasts x and the weight (several kernels and a weight-sized copy per call); the
    served module runs one kernel: a baseline that timed the upcast would flatter every candidate."""
    family = get_op(name)
    activations, params = _inputs(name, torch.bfloat16)
    with AtenOps() as upcast:
        family.reference(*activations, **params)
    with AtenOps() as module_math:
        assert family.eager is not None
        family.eager(*activations, **params)
    assert "_to_copy" in upcast.ops
    assert "_to_copy" not in module_math.ops and len(module_math.ops) < len(upcast.ops)
