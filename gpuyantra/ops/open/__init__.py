"""Open targets: any module's own computation as an op, without registering a family by hand.

A registered family (rms_norm, softmax, ...) carries a hand-written reference, templates and a bytes
model. An open target is built from a live module instance (or a KernelBench problem's `Model`) and
the inputs it was called with:

- its **reference** is the module's own forward, run on a private copy of the module in the inputs'
  dtype (float64 for the verifier's reference), with the parameters a case passes in;
- its **activations** are the forward's tensor inputs: shapes, dtypes and the value domain each one
  was seen with (any real value, positive, in [0, 1], rows on the simplex, integer class ids);
- its **parameters** are the module's floating parameters and buffers (named by their dotted path,
  `ln.weight`, bound by the ADAPTER like a family's) and the float attributes that change its output
  (`eps`, `margin`, a scaling factor): integer attributes (`dim`) are structure, not values;
- the **numbers** the forward takes as arguments besides its tensors (`forward(self, A, s: float)`)
  are parameters too, which entry takes by keyword and the caller passes (no ADAPTER binds them): a
  float is a value of each call, which the verifier draws around the live one; an int or a bool
  selects behaviour and stays at its live value (see `ARGUMENT_KINDS`).

Which input sizes may change is found by asking the module: a dim is *variable* when the forward
still runs after that dim grows (checked on the meta device, nothing allocated). The verifier draws
its unseen shapes and its stress shapes along those dims only.

An open target is named `open.<class>_<digest>` and saved under `<state>/targets/<name>/`, so the
verifier's sandbox child, the workers and a restarted server find it by name (`get_op`).
"""

from __future__ import annotations

from gpuyantra.ops.open.build import ShrinkFactories, build_open_target, dim_links, leading_rows
from gpuyantra.ops.open.family import describe_reference, open_family
from gpuyantra.ops.open.registry import (
    ensure_open_target,
    find_open_family,
    load_open_target,
    open_spec_for,
    register_open,
    stage_open_target,
    targets_dir,
)
from gpuyantra.ops.open.spec import (
    ARGUMENT_KINDS,
    CPU_CASE_ELEMENTS,
    CUDA_CASE_ELEMENTS,
    DOMAINS,
    OPEN_PREFIX,
    STRESS_SIZE,
    OpenInput,
    OpenParam,
    OpenTargetError,
    WithArguments,
    argument_kind,
    draw_input,
    follow_shapes,
    forward_args,
    is_open,
    reduced_shapes,
    shrink,
    split_arguments,
    with_arguments,
)
from gpuyantra.ops.open.target import OpenTarget

__all__ = [
    "ARGUMENT_KINDS",
    "CPU_CASE_ELEMENTS",
    "CUDA_CASE_ELEMENTS",
    "DOMAINS",
    "OPEN_PREFIX",
    "OpenInput",
    "OpenParam",
    "OpenTarget",
    "OpenTargetError",
    "STRESS_SIZE",
    "ShrinkFactories",
    "WithArguments",
    "argument_kind",
    "build_open_target",
    "describe_reference",
    "dim_links",
    "draw_input",
    "ensure_open_target",
    "find_open_family",
    "follow_shapes",
    "forward_args",
    "is_open",
    "leading_rows",
    "load_open_target",
    "open_family",
    "open_spec_for",
    "reduced_shapes",
    "register_open",
    "shrink",
    "split_arguments",
    "stage_open_target",
    "targets_dir",
    "with_arguments",
]
