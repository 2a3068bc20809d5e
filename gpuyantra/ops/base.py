"""What an op family is: reference semantics, entry signature, module binding and a roofline model.

One file per family (`gpuyantra/ops/<family>.py`) builds an `OpFamily` and registers it. The
verifier, the swap engine, the profiler and the authors only ever talk to families through this
interface, so adding a family touches one file (plus its template kernel and its tests).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Tensor = torch.Tensor


@dataclass(frozen=True)
class ParamSpec:
    """One keyword parameter of `entry`, filled from an attribute of the replaced module."""

    name: str
    # Attribute names that hold this parameter on known module classes, in preference order.
    attr_aliases: tuple[str, ...]
    kind: str = "tensor"  # "tensor" | "float" | "optional_tensor" (a tensor or None: nn.Linear's bias)


@dataclass(frozen=True)
class OpFamily:
    name: str
    activations: tuple[str, ...]
    params: tuple[ParamSpec, ...]
    default_module: str
    # reference(*activations, **params) -> output (a tensor, or a tuple of them: add_rms_norm, rope),
    # the exact math of the transformers module.
    reference: Callable[..., Any]
    # make_activations(rows_shape, hidden, dtype, device, generator, scale) -> activations tuple.
    make_activations: Callable[..., tuple[Tensor, ...]]
    # module_call(module, *activations) -> output of the original module on those activations.
    module_call: Callable[..., Tensor]
    # replacement_forward(module, entry, adapter) -> function(*forward_args) to bind as `forward`.
    replacement_forward: Callable[..., Callable[..., Any]]
    # module_activations(module, rows_shape, dtype, device, generator) -> activations for module_call.
    module_activations: Callable[..., tuple[Tensor, ...]] | None = None
    # bytes_moved(shape, dtype) / flops(shape) where shape is the first activation's shape.
    bytes_moved: Callable[[Sequence[int], torch.dtype], int] = lambda shape, dtype: 0
    flops: Callable[[Sequence[int]], int] = lambda shape: 0
    # Module classes (dotted) known to compute this family; matching still checks numerically.
    known_modules: tuple[str, ...] = ()
    # Hidden size attribute lookups to size probe inputs for a module instance.
    hidden_of: Callable[[torch.nn.Module], int] | None = None
    tolerances: dict[torch.dtype, tuple[float, float]] = field(
        default_factory=lambda: {
            torch.float32: (1e-4, 1e-4),
            torch.float16: (2e-3, 2e-3),
            torch.bfloat16: (1.6e-2, 1.6e-2),
            torch.float64: (1e-9, 1e-9),
        }
    )
    # --- optional hooks (families whose module is not a plain `module(*activations)` op) ---
    # module_reference(module, *module_activations, **params) -> what `module` must return when it
    # computes this family, built from `reference` (e.g. an MLP: down_proj(reference(gate_proj(x),
    # up_proj(x)))). None: `reference(*module_activations, **params)`.
    module_reference: Callable[..., Any] | None = None
    # eager(*activations, **params) -> what the module itself computes in PyTorch, timed as the eager
    # and torch.compile baselines. `reference` may upcast for accuracy (a linear's float32 copies of
    # its weight), which a served module never does: timing that would flatter every candidate.
    # None: `reference` is already the module's own computation.
    eager: Callable[..., Any] | None = None
    # module_filter(module) -> False when the module cannot compute this family (cheap structural
    # precheck before the numerical probe, e.g. "has gate_proj/up_proj/down_proj"). None: any module.
    module_filter: Callable[[torch.nn.Module], bool] | None = None
    # param_factory(hidden, dtype, device, generator) -> {param name: value} for a probe of width
    # `hidden` (weights away from 0 and 1). None: tensors of shape (hidden,), floats 1e-6.
    param_factory: Callable[..., dict[str, Any]] | None = None
    # Free functions (dotted) that compute this family where no module does (e.g. rope's
    # `apply_rotary_pos_emb`); informational, for a function-level swap.
    known_functions: tuple[str, ...] = ()
    # Number of outputs `entry` returns: 1 for a tensor, n > 1 for a tuple of n tensors.
    n_outputs: int = 1
    # --- families whose parameter shapes are not all (H,) (linear: weight (N, K), bias (N,) or None) ---
    # param_shapes_of(module) -> {param name: live shape or None}: modules of one class with other
    # shapes are separate groups and profile targets (a 2048x1536 projection is not the lm_head).
    param_shapes_of: Callable[[torch.nn.Module], dict[str, list[int] | None]] | None = None
    # param_cost(shape, dtype, param_shapes) -> (bytes moved, flops) with the live parameter shapes.
    # None: (bytes_moved(shape, dtype), flops(shape)).
    param_cost: Callable[..., tuple[int, int]] | None = None
    # fit_params(shape, {name: shape or None}, device) -> the parameter shapes of one verifier case
    # at activation `shape`, shrunk where a live shape would be too slow or too big on `device`.
    fit_params: Callable[..., dict[str, list[int] | None]] | None = None
    # error_bound(activations, params, out_dtype) -> per-output-element allowance (float64, or None)
    # that an honest kernel may need on top of atol + rtol |want| when judged against float64
    # (linear: float32 accumulation over K grows with sum |x_k w_k|, which no fixed atol expresses).
    error_bound: Callable[..., Any] | None = None
    # Extra verifier hidden shapes per device ("cpu"/"cuda"), run in every dtype (linear: a long K).
    extra_hidden_shapes: dict[str, list[list[int]]] = field(default_factory=dict)
    # What each activation holds, for the verifier's activation-like inputs: "stream" (a residual
    # stream: offsets and outliers), "gate" (feeds exp: values past its overflow point) or "bounded"
    # (left as made, e.g. rope's cos/sin). Empty: every activation is a "stream".
    activation_roles: tuple[str, ...] = ()
    # adapt_shape(shape) -> the nearest shape this family accepts (e.g. rope needs an even head dim),
    # applied to the verifier's fixed stress shapes. None: every shape is valid.
    adapt_shape: Callable[[Sequence[int]], Sequence[int]] | None = None
    # The open target (gpuyantra.ops.open.OpenTarget) this family was built from; None for a
    # registered family.
    open_target: Any = None
    # True where the module's own math rounds after each elementwise op in a 16-bit dtype (rope's
    # q * cos + rotate_half(q) * sin): a kernel rounding as it does (so the served model's greedy
    # output cannot change) is then judged with the allowance of that computation too. Not for
    # families with reductions: eager's 16-bit accumulation is the device's choice.
    rounds_in_dtype: bool = False
    # True where the first activation is logits (softmax): the verifier's plan then also draws rows
    # partly -inf (masked) and a late element leading the row by more than exp's range.
    logits_input: bool = False

    def cost(
        self, shape: Sequence[int], dtype: torch.dtype, param_shapes: dict[str, list[int] | None] | None = None
    ) -> tuple[int, int]:
        """(bytes moved, flops) of one call on a first activation of `shape`."""
        if self.param_cost is not None:
            return self.param_cost(shape, dtype, param_shapes)
        return self.bytes_moved(shape, dtype), self.flops(shape)

    @property
    def adapter_params(self) -> tuple[str, ...]:
        """The params an ADAPTER binds to module attributes: every one but the numbers an open
        target's forward takes as arguments, which its caller passes to entry."""
        passed = set(getattr(self.open_target, "argument_names", ()))
        return tuple(p.name for p in self.params if p.name not in passed)

    def tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        """(atol, rtol) for outputs of `dtype`, measured against a float64 reference."""
        return self.tolerances.get(dtype, (1e-2, 1e-2))

    def default_adapter(self, module: torch.nn.Module | type) -> list[dict[str, str]]:
        """ADAPTER bindings for a module (instance or class) using the first alias it has."""
        bindings: list[dict[str, str]] = []
        for spec in self.params:
            attr = _first_attr(module, spec.attr_aliases)
            if attr is None:
                raise LookupError(
                    f"{_class_name(module)} has none of {list(spec.attr_aliases)} for parameter {spec.name!r}"
                )
            bindings.append({"kernel_param": spec.name, "module_attr": attr})
        return bindings

    def may_compute(self, module: torch.nn.Module) -> bool:
        """Cheap structural precheck; the numerical probe (binding.computes_family) decides."""
        return self.module_filter is None or bool(self.module_filter(module))

    def expected_module_output(
        self, module: torch.nn.Module, activations: Sequence[Tensor], adapter: Sequence[dict[str, str]]
    ) -> Any:
        """What `module_call(module, *activations)` must return if the module computes this family."""
        kwargs = adapter_kwargs(module, adapter)
        if self.module_reference is not None:
            return self.module_reference(module, *activations, **kwargs)
        return self.reference(*activations, **kwargs)

    def make_params(
        self, hidden: int, dtype: torch.dtype, device: torch.device | str, generator: torch.Generator
    ) -> dict[str, Any]:
        """Random keyword parameters for `entry`/`reference` at width `hidden`."""
        if self.param_factory is not None:
            return self.param_factory(hidden, dtype, device, generator)
        params: dict[str, Any] = {}
        for spec in self.params:
            if spec.kind == "float":
                params[spec.name] = 1e-6
            else:
                params[spec.name] = randn((hidden,), dtype, device, generator, 0.5) + 1.0
        return params

    def hidden_size(self, module: torch.nn.Module) -> int:
        if self.hidden_of is not None:
            return self.hidden_of(module)
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() >= 1:
            return int(weight.shape[-1])
        raise LookupError(f"cannot tell the hidden size of {type(module).__name__}")

    def activations_for_module(
        self,
        module: torch.nn.Module,
        rows: Sequence[int],
        dtype: torch.dtype,
        device: torch.device | str,
        generator: torch.Generator,
        scale: float = 1.0,
    ) -> tuple[Tensor, ...]:
        if self.module_activations is not None:
            return self.module_activations(module, rows, dtype, device, generator)
        return self.make_activations(tuple(rows), self.hidden_size(module), dtype, device, generator, scale)


def as_tuple(output: Any) -> tuple[Any, ...]:
    """An op's output as a tuple (families like rope return several tensors)."""
    return tuple(output) if isinstance(output, (tuple, list)) else (output,)


def outputs_close(got: Any, want: Any, atol: float, rtol: float) -> bool:
    """Same structure, shapes and dtypes-as-tensors, and every element within tolerance."""
    got_t, want_t = as_tuple(got), as_tuple(want)
    if len(got_t) != len(want_t):
        return False
    for g, w in zip(got_t, want_t):
        if not isinstance(g, Tensor) or not isinstance(w, Tensor) or g.shape != w.shape:
            return False
        if not torch.allclose(g.double(), w.double(), rtol=rtol, atol=atol, equal_nan=True):
            return False
    return True


def numel(shape: Sequence[int]) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    return n


def itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def adapter_kwargs(module: torch.nn.Module, adapter: Sequence[dict[str, str]]) -> dict[str, Any]:
    """Read the live values each ADAPTER binding names (read at call time: weights may change)."""
    return {b["kernel_param"]: resolve_attr(module, b["module_attr"]) for b in adapter}


def resolve_attr(obj: Any, dotted: str) -> Any:
    """`obj.a.b` for "a.b" (an open target binds a submodule's weight as "ln.weight")."""
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def has_attr_path(obj: Any, dotted: str) -> bool:
    try:
        resolve_attr(obj, dotted)
    except AttributeError:
        return False
    return True


# Model code is imported by one thread at a time. Two threads importing parts of one library with
# import cycles (transformers' modeling modules) can each hold a module the other needs: Python then
# hands one of them the module half initialized, and a class it needs is missing. A GPU worker's
# first verdict rejected an honest kernel as `module-class` this way (H200), its contract importing
# the model's module while the worker imported the library's core in the background.
MODEL_CODE_IMPORT = threading.RLock()


def import_model_code(module_name: str) -> Any:
    """`importlib.import_module`, one thread at a time (MODEL_CODE_IMPORT)."""
    with MODEL_CODE_IMPORT:
        return importlib.import_module(module_name)


def import_class(dotted: str) -> type:
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"{dotted!r} is not a dotted class path like package.module.Class")
    try:
        return getattr(import_model_code(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import module class {dotted!r}: {exc}") from exc


def randn(
    shape: Sequence[int], dtype: torch.dtype, device: torch.device | str, generator: torch.Generator, scale: float = 1.0
) -> Tensor:
    """Random normal values drawn on the CPU generator (reproducible across devices), then moved.

    A generator on another device (e.g. a CUDA generator, for benchmark-sized inputs) draws there."""
    gen_device = generator.device
    values = torch.randn(tuple(shape), generator=generator, dtype=torch.float32, device=gen_device) * scale
    return values.to(device=device, dtype=dtype)


def _first_attr(module: torch.nn.Module | type, aliases: Sequence[str]) -> str | None:
    for alias in aliases:
        if isinstance(module, type):
            if alias in _class_attribute_names(module):
                return alias
        elif has_attr_path(module, alias):
            return alias
    return None


def _class_attribute_names(cls: type) -> set[str]:
    """Attributes an instance of `cls` will have, found on a meta-device instance when possible."""
    from gpuyantra.ops.meta import meta_instance

    instance = meta_instance(cls)
    return set(dir(instance)) if instance is not None else set(dir(cls))


def _class_name(module: torch.nn.Module | type) -> str:
    return module.__name__ if isinstance(module, type) else type(module).__name__
