"""Find which modules of a model compute an op family, by checking their forward numerically.

A class is bound to a family only when an instance's forward equals the family's reference on
random inputs with freshly randomized parameters (never weight = 1, bias = 0); class names are
only a hint for which attributes to read. So a Gemma `(1 + weight)` norm never receives `rms_norm`.

The probe runs twice on a private copy of the module (the live module is never touched):
1. float64, tight tolerance: the math must be the family's (catches `1 + weight`, another
   activation function, a missing bias...).
2. bfloat16, the family's bf16 tolerance: output dtype and rounding order must agree with the
   reference's dtype handling (catches e.g. a norm that returns float32 for bf16 input). A module
   whose bf16 forward cannot run on the CPU is judged on the float64 check alone.

Families whose module is not `module(*activations)` (gated MLPs: the module takes x, the op takes
(gate, up)) supply `module_activations` / `module_reference` hooks on their `OpFamily`.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpuyantra.ops import OpFamily, UnknownOpError, all_ops, get_op
from gpuyantra.ops.base import as_tuple, outputs_close

PROBE_ROWS = (3,)
OPEN_TARGETS_PER_MODEL = 12  # uncovered leaf classes made open targets, in first-call order
# Leaf modules with nothing to compute (or nothing a kernel could replace).
NO_COMPUTE = (torch.nn.Dropout, torch.nn.Identity, torch.nn.Embedding)
FP64_TOLERANCE = (1e-8, 1e-6)  # (atol, rtol)


@dataclass
class ModuleGroup:
    """All instances of one module class in a model that compute one op family."""

    op: str
    module_class: str
    qualified_class: str
    names: list[str] = field(default_factory=list)
    adapter: list[dict[str, str]] = field(default_factory=list)
    # Live tensor shapes shared by the group's modules, for families that tell shapes apart
    # (linear: {"weight": [N, K], "bias": [N] or None}); {} for every other family.
    param_shapes: dict[str, list[int] | None] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def variant(self) -> str:
        """`weight=2048x1536,bias=none` (the `verify --param-shape` syntax), "" without param_shapes."""
        return format_param_shapes(self.param_shapes)

    @property
    def key(self) -> str:
        """The class, plus the variant where the family tells parameter shapes apart: what live
        shapes are recorded under (a linear's K differs between its shapes)."""
        return f"{self.qualified_class}[{self.variant}]" if self.param_shapes else self.qualified_class


def format_param_shapes(param_shapes: dict[str, list[int] | None] | None) -> str:
    return ",".join(
        f"{name}={'none' if shape is None else 'x'.join(str(d) for d in shape)}"
        for name, shape in (param_shapes or {}).items()
    )


def randomize_parameters(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Give every floating parameter and buffer fresh random values away from 0 and 1."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                values = torch.randn(tensor.shape, generator=generator) * 0.5 + 0.3
                tensor.copy_(values.to(tensor.dtype))


def probe_copy(module: torch.nn.Module, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """A CPU copy of `module` whose floating parameters/buffers are new (uninitialized) `dtype`
    tensors: the live weights are never copied (no GPU allocation, no copy of a large checkpoint
    in its own dtype); the caller randomizes them."""
    memo: dict[int, object] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if tensor.is_floating_point():
            fresh = torch.empty(tensor.shape, dtype=dtype, device="meta")
            memo[id(tensor)] = (
                torch.nn.Parameter(fresh, requires_grad=False) if isinstance(tensor, torch.nn.Parameter) else fresh
            )
    try:
        probe = copy.deepcopy(module, memo)
    except Exception:  # noqa: BLE001 - exotic modules: fall back to a plain copy
        return copy.deepcopy(module).to(device="cpu", dtype=dtype)

    def materialize(t: torch.Tensor) -> torch.Tensor:
        if t.is_meta:
            return torch.empty(t.shape, dtype=t.dtype, device="cpu")
        return t.to("cpu")

    probe = probe._apply(materialize)
    # Instance-level forwards are bindings of the live modules (swaps, fused projections) whose
    # closures still compute with the live tensors: the probe checks the classes' own math.
    for sub in probe.modules():
        sub.__dict__.pop("forward", None)
    return probe


def _agrees(
    module: torch.nn.Module,
    family: OpFamily,
    adapter: list[dict[str, str]],
    dtype: torch.dtype,
    seed: int,
    atol: float,
    rtol: float,
) -> bool | None:
    """True/False: module and reference agree at `dtype`; None: the probe could not run."""
    generator = torch.Generator().manual_seed(seed + 1)
    try:
        activations = family.activations_for_module(module, PROBE_ROWS, dtype, "cpu", generator)
        with torch.no_grad():
            got = family.module_call(module, *activations)
            want = family.expected_module_output(module, activations, adapter)
    except Exception:  # noqa: BLE001 - a module that cannot run the family's inputs is no match
        return None
    return same_outputs(got, want, atol=atol, rtol=rtol)


def same_outputs(got: Any, want: Any, *, atol: float, rtol: float) -> bool:
    """Outputs of one structure: as many tensors, of the same dtypes, each close to its reference."""
    got_t, want_t = as_tuple(got), as_tuple(want)
    if len(got_t) != len(want_t) or any(
        not isinstance(g, torch.Tensor) or not isinstance(w, torch.Tensor) or g.dtype != w.dtype
        for g, w in zip(got_t, want_t)
    ):
        return False
    return outputs_close(got, want, atol=atol, rtol=rtol)


def computes_family(module: torch.nn.Module, family: OpFamily, seed: int = 0) -> list[dict[str, str]] | None:
    """The ADAPTER under which `module` computes `family`, or None when its math differs."""
    if not family.may_compute(module):
        return None
    try:
        adapter = family.default_adapter(module)
    except LookupError:
        return None
    try:
        probe = probe_copy(module, torch.float64)
    except Exception:  # noqa: BLE001 - a module that cannot be copied cannot be probed
        return None
    randomize_parameters(probe, torch.Generator().manual_seed(seed))
    probe.eval()
    atol, rtol = FP64_TOLERANCE
    if not _agrees(probe, family, adapter, torch.float64, seed, atol, rtol):
        return None
    # Dtype handling: same probe weights rounded to bf16; a CPU-unsupported forward (None) passes.
    low = probe.to(torch.bfloat16)
    atol, rtol = family.tolerance(torch.bfloat16)
    if _agrees(low, family, adapter, torch.bfloat16, seed, 2 * atol, 2 * rtol) is False:
        return None
    return adapter


def find_module_groups(model: torch.nn.Module, ops: Sequence[str] | None = None) -> list[ModuleGroup]:
    """Group the model's modules by (family, class) for every family their computation matches.
    Named `ops` may include open targets (found by name, e.g. after a restart)."""
    families = all_ops() if ops is None else _families_named(ops)
    verdict_cache: dict[tuple[str, type], list[dict[str, str]] | None] = {}
    groups: dict[tuple[str, type, str], ModuleGroup] = {}
    for name, module in model.named_modules():
        cls = type(module)
        for family in families:
            key = (family.name, cls)
            if not family.may_compute(module):
                continue  # per module too: instances of a class may differ (a Linear fused away)
            if key not in verdict_cache:
                verdict_cache[key] = computes_family(module, family)
            adapter = verdict_cache[key]
            if adapter is None:
                continue
            # Families that tell live shapes apart (linear) group each shape on its own.
            shapes = family.param_shapes_of(module) if family.param_shapes_of is not None else {}
            group = groups.setdefault(
                (*key, format_param_shapes(shapes)),
                ModuleGroup(
                    op=family.name,
                    module_class=cls.__name__,
                    qualified_class=f"{cls.__module__}.{cls.__qualname__}",
                    adapter=adapter,
                    param_shapes=shapes,
                ),
            )
            group.names.append(name)
    return list(groups.values())


def _families_named(ops: Sequence[str]) -> list[OpFamily]:
    families = []
    for name in ops:
        try:
            families.append(get_op(name))
        except UnknownOpError:
            continue  # an op this process cannot know binds nothing
    return families


# ---------------------------------------------------------------------------------------------
# Open targets: leaf modules no registered family covers


def find_open_groups(
    model: torch.nn.Module,
    run_probe: Callable[[], Any],
    covered: Sequence[ModuleGroup],
    limit: int = OPEN_TARGETS_PER_MODEL,
) -> list[ModuleGroup]:
    """Open targets for the model's leaf module classes that no registered family covers.

    One probe run (which may run several workloads: prefill, decode at each served batch) records
    every call of each uncovered leaf class: the first call's positional tensor inputs build the
    target, every call's input shapes are its evidence of which sizes change (a position input of
    batch 1 in a prefill and of batch 8 in a decode); each class becomes an open target saved by
    name. Every instance of the class whose forward the target's reference reproduces with its own
    parameters joins the group (binding by computation, as for a family); others stay out."""
    from gpuyantra.ops.open import OpenTargetError, build_open_target, register_open

    covered_names = {n for g in covered for n in g.names}
    candidates = _uncovered_leaves(model, covered_names)
    calls = _first_calls(candidates, run_probe)
    groups: list[ModuleGroup] = []
    for cls, (name, inputs, shapes) in list(calls.items())[:limit]:
        module = candidates[name]
        try:
            target = build_open_target(module, inputs, name_hint=cls.__name__, calls=shapes)
            family = register_open(target)
        except OpenTargetError:
            continue  # int-only inputs (embeddings), a class other processes cannot import...
        group = ModuleGroup(
            op=family.name,
            module_class=cls.__name__,
            qualified_class=f"{cls.__module__}.{cls.__qualname__}",
            adapter=target.adapter,
        )
        for other_name, other in candidates.items():
            if type(other) is cls and computes_family(other, family) is not None:
                group.names.append(other_name)
        if group.names:
            groups.append(group)
    return groups


def _uncovered_leaves(model: torch.nn.Module, covered: set[str]) -> dict[str, torch.nn.Module]:
    """Leaf modules with something to compute, outside every module a family already binds."""
    leaves: dict[str, torch.nn.Module] = {}
    for name, module in model.named_modules():
        if not name or any(True for _ in module.children()) or isinstance(module, NO_COMPUTE):
            continue
        if any(name == c or name.startswith(c + ".") for c in covered):
            continue
        leaves[name] = module
    return leaves


# Distinct input shapes recorded per class during discovery (prefill, decode at each served batch).
MAX_CALL_SHAPES = 16


def _first_calls(
    modules: dict[str, torch.nn.Module], run_probe: Callable[[], Any]
) -> dict[type, tuple[str, tuple[torch.Tensor, ...], list[tuple[tuple[int, ...], ...]]]]:
    """(module name, positional tensor inputs, every call's input shapes) of each class during one
    probe: the inputs of its first call, the shapes of all its calls (each distinct one once);
    classes called with keyword or non-tensor arguments are left out."""
    calls: dict[type, tuple[str, tuple[torch.Tensor, ...], list[tuple[tuple[int, ...], ...]]]] = {}
    refused: set[type] = set()

    def hook(name: str) -> Callable[..., None]:
        def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            cls = type(module)
            if cls in refused:
                return
            if kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args):
                if cls not in calls:
                    refused.add(cls)
                return
            shapes = tuple(tuple(int(d) for d in a.shape) for a in args)
            if cls not in calls:
                calls[cls] = (name, tuple(a.detach().to("cpu").clone() for a in args), [shapes])
            elif shapes not in calls[cls][2] and len(calls[cls][2]) < MAX_CALL_SHAPES:
                calls[cls][2].append(shapes)

        return record

    handles = [m.register_forward_pre_hook(hook(n), with_kwargs=True) for n, m in modules.items()]
    try:
        with torch.no_grad():
            run_probe()
    finally:
        for handle in handles:
            handle.remove()
    return calls
