"""Layer 2: the deployment contract, checked without running the candidate.

OP, ADAPTER and entry's signature come from the static layer's reading of the source. Every ADAPTER
binding must name an attribute of the module class the kernel would replace, checked on a
`meta`-device instance (nothing allocated), and of the kind the family's parameter needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gpuyantra.candidate import CandidateError, validate_adapter
from gpuyantra.ops import UnknownOpError, get_op
from gpuyantra.ops.base import MODEL_CODE_IMPORT, OpFamily, import_class
from gpuyantra.verifier.module_contracts import contract_key, keep_param_specs, kept_param_specs
from gpuyantra.verifier.static import StaticReport
from gpuyantra.verifier.verdict import Failure

LAYER = "contract"
DEFAULT_FLOAT_PARAM = 1e-6


@dataclass
class ContractResult:
    failures: list[Failure] = field(default_factory=list)
    family: OpFamily | None = None
    module_class: str | None = None
    adapter: list[dict[str, str]] = field(default_factory=list)
    # How to build each parameter for a case: {"name", "kind", "shape": [... "H" ...]} or {"name", "kind", "value"}.
    param_specs: list[dict[str, Any]] = field(default_factory=list)

    def fail(self, rule: str, message: str) -> None:
        self.failures.append(Failure(LAYER, rule, message))


def resolve_family(op: str | None) -> tuple[OpFamily | None, str | None]:
    if op is None:
        return None, None
    try:
        return get_op(op), None
    except UnknownOpError as exc:
        return None, str(exc)


def check_contract(report: StaticReport, module_class: str | None = None) -> ContractResult:
    result = ContractResult()
    # OP names a registered family.
    if report.op_error:
        result.fail("unknown-op", report.op_error)
        return result
    family, error = resolve_family(report.op)
    if family is None:
        result.fail("unknown-op", error or f"unknown op {report.op!r}")
        return result
    result.family = family
    _check_entry(report, family, result)
    # ADAPTER is a well-formed literal binding exactly the family's parameters.
    adapter: list[dict[str, str]] | None = None
    if report.adapter_error:
        result.fail("adapter-invalid", report.adapter_error)
    else:
        try:
            adapter = validate_adapter(report.adapter)
        except CandidateError as exc:
            result.fail("adapter-invalid", str(exc))
    if adapter is not None:
        result.adapter = adapter
        wanted = list(family.adapter_params)
        bound = [b["kernel_param"] for b in adapter]
        for name in sorted({n for n in bound if bound.count(n) > 1}):
            result.fail("adapter-params", f"kernel parameter {name!r} is bound more than once")
        passed = [p.name for p in family.params if p.name not in wanted]
        for name in bound:
            if name in passed:
                result.fail(
                    "adapter-params",
                    f"{name!r} is an argument of {family.name}'s forward, passed by its caller: no ADAPTER binds it",
                )
            elif name not in wanted:
                result.fail(
                    "adapter-params",
                    f"{name!r} is not a parameter of {family.name} (its parameters: {wanted or 'none'})",
                )
        for name in wanted:
            if name not in bound:
                result.fail("adapter-params", f"ADAPTER does not bind {family.name}'s parameter {name!r}")
    if family.open_target is not None:
        _check_open_attrs(family, adapter or [], result)
        return result
    dotted = module_class or family.default_module
    result.module_class = dotted
    # A passing check of the same class, bindings and code, kept from an earlier process.
    key = None
    if not result.failures:
        key = contract_key(dotted, family.name, family.reference.__module__, adapter or [])
        kept = kept_param_specs(key)
        if kept is not None:
            result.param_specs = kept
            return result
    with MODEL_CODE_IMPORT:  # building it may import more of the library (its config classes, lazily)
        _check_module_class(family, dotted, adapter, result)
    if not result.failures:
        keep_param_specs(key, dotted, result.param_specs)
    return result


def _check_module_class(
    family: OpFamily, dotted: str, adapter: list[dict[str, str]] | None, result: ContractResult
) -> None:
    """The module class imports and builds on the meta device; each binding names a real attribute."""
    try:
        cls = import_class(dotted)
    except ValueError as exc:
        result.fail("module-class", str(exc))
        return
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        result.fail("module-class", f"{dotted} is not a torch.nn.Module class")
        return
    from gpuyantra.ops.meta import build_instance, meta_instance

    # A class is hashable; mypy checks type[Module] against Hashable through Module's instance __hash__.
    meta = meta_instance(cls)  # type: ignore[arg-type]
    if meta is None:
        result.fail("module-class", f"cannot build {dotted} on the meta device with a tiny configuration")
        return
    kinds = {p.name: p.kind for p in family.params}
    attr_of: dict[str, str] = {}
    for binding in adapter or []:
        attr = binding["module_attr"]
        if not hasattr(meta, attr):
            result.fail(
                "adapter-attr",
                f"{cls.__name__} has no attribute {attr!r} "
                f"(bound to kernel parameter {binding['kernel_param']!r}), checked on a meta instance",
            )
            continue
        value = getattr(meta, attr)
        kind = kinds.get(binding["kernel_param"])
        if kind == "tensor" and not isinstance(value, torch.Tensor):
            result.fail(
                "adapter-attr",
                f"{cls.__name__}.{attr} is {type(value).__name__}, but {binding['kernel_param']!r} needs a tensor",
            )
        elif kind == "optional_tensor" and value is not None and not isinstance(value, torch.Tensor):
            result.fail(
                "adapter-attr",
                f"{cls.__name__}.{attr} is {type(value).__name__}, "
                f"but {binding['kernel_param']!r} needs a tensor or None",
            )
        elif kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            result.fail(
                "adapter-attr",
                f"{cls.__name__}.{attr} is {type(value).__name__}, but {binding['kernel_param']!r} needs a number",
            )
        attr_of[binding["kernel_param"]] = attr
    if result.failures:
        return
    result.param_specs = _param_specs(family, cls, attr_of, build_instance)


def _check_open_attrs(family: OpFamily, adapter: list[dict[str, str]], result: ContractResult) -> None:
    """An open target's module is the instance it was built from: each binding must name the
    attribute path its parameter was read from (checked on that instance, not a class)."""
    target = family.open_target
    result.module_class = target.module_class
    expected = {p.kernel_param: p for p in target.params}
    for binding in adapter:
        spec = expected.get(binding["kernel_param"])
        if spec is not None and binding["module_attr"] != spec.module_attr:
            result.fail(
                "adapter-attr",
                f"kernel parameter {spec.kernel_param!r} must bind {spec.module_attr!r} of {target.module_class}, "
                f"not {binding['module_attr']!r}",
            )
    if result.failures:
        return
    result.param_specs = [
        {"name": p.kernel_param, "kind": "tensor", "shape": list(p.shape), "positive": p.positive}
        if p.kind == "tensor"
        else {"name": p.kernel_param, "kind": p.kind, "value": float(p.value) if p.kind == "float" else p.value}
        for p in target.params
    ]


def _check_entry(report: StaticReport, family: OpFamily, result: ContractResult) -> None:
    entry = report.entry
    expected = (
        f"def entry({', '.join(family.activations)}{', *, ' if family.params else ''}"
        f"{', '.join(p.name for p in family.params)})"
    )
    if entry is None:
        result.fail("entry-signature", f"no module-level `def entry(...)`; {family.name} needs {expected}")
        return
    if entry.definitions > 1:
        result.fail("entry-signature", "entry is bound more than once at module level")
    if entry.is_async:
        result.fail("entry-signature", "entry must be a plain def, not async def")
    n_acts = len(family.activations)
    if len(entry.positional) != n_acts and not (entry.vararg and len(entry.positional) <= n_acts):
        result.fail(
            "entry-signature",
            f"entry takes {len(entry.positional)} positional argument(s), "
            f"{family.name} passes {n_acts} ({', '.join(family.activations)}); expected {expected}",
        )
    names = [p.name for p in family.params]
    for name in names:
        if name not in entry.kwonly and not entry.kwarg:
            result.fail("entry-signature", f"entry has no keyword-only parameter {name!r}; expected {expected}")
    for name in entry.kwonly_required:
        if name not in names:
            result.fail("entry-signature", f"entry requires keyword {name!r}, which {family.name} never passes")


def _param_specs(family: OpFamily, cls: type, attr_of: dict[str, str], build_instance: Any) -> list[dict[str, Any]]:
    """Shapes and scalar values of the family's parameters, read from a real CPU instance."""
    instance = build_instance(cls, "cpu")
    hidden = None
    if instance is not None:
        try:
            hidden = family.hidden_size(instance)
        except (LookupError, AttributeError, TypeError):
            hidden = None
    specs: list[dict[str, Any]] = []
    for param in family.params:
        value: Any = getattr(instance, attr_of.get(param.name, param.name), None) if instance is not None else None
        if param.kind in ("tensor", "optional_tensor"):
            shape: list[Any] | None
            if isinstance(value, torch.Tensor) and value.dim() >= 1:
                shape = ["H" if hidden is not None and d == hidden else int(d) for d in value.shape]
            else:
                # An optional tensor the instance holds as None (nn.Linear(bias=False)) stays None.
                shape = None if param.kind == "optional_tensor" and instance is not None else ["H"]
            specs.append({"name": param.name, "kind": param.kind, "shape": shape})
        else:
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                value = DEFAULT_FLOAT_PARAM if param.kind == "float" else value
            specs.append(
                {"name": param.name, "kind": param.kind, "value": float(value) if param.kind == "float" else value}
            )
    return specs
