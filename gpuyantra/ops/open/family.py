"""The family view of an open target: what the verifier, the swap engine and the authors use."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpuyantra.ops.base import OpFamily, ParamSpec, Tensor, adapter_kwargs, numel
from gpuyantra.ops.open.spec import CaseKey, _dtype, forward_args, shrink
from gpuyantra.ops.open.target import OpenTarget

# Largest input or output of a swap's parity check on a live call's shapes (bigger calls are
# checked at their variable dims halved): the served device's own cost, not the verifier's.
PARITY_ELEMENTS = {"cpu": 1 << 16, "cuda": 1 << 24}


def open_family(target: OpenTarget) -> OpFamily:
    """An OpFamily whose every hook reads the open target."""

    def make_activations(
        rows: Sequence[int],
        hidden: int,
        dtype: torch.dtype,
        device: torch.device | str,
        generator: torch.Generator,
        scale: float = 1.0,
    ) -> tuple[Tensor, ...]:
        return target.draw(target.shapes_for((*rows, hidden)), dtype, device, generator, scale)

    def module_activations(
        module: torch.nn.Module, rows: Sequence[int], dtype: torch.dtype, device: Any, generator: torch.Generator
    ) -> tuple[Tensor, ...]:
        # The swap's parity check passes a case key (a live call's shapes, `OpenTarget.case_key`);
        # anything else (binding's probe rows) gets the live shapes the target was built from.
        key = [int(d) for d in rows]
        if not isinstance(rows, CaseKey) or not target._valid_key(key):
            key = shrink(list(target.inputs[0].shape), target.variable_dims[0] if target.variable_dims else (), 4096)
        cap = PARITY_ELEMENTS["cuda" if torch.device(device).type == "cuda" else "cpu"]
        return target.draw(target.shapes_for(target.fit(key, cap)), dtype, device, generator)

    def module_reference(module: torch.nn.Module, *activations: Tensor, **params: Any) -> Any:
        # What the module returns: the forward's outputs, without the updated buffers' new values.
        return target.split_outputs(target.reference(*activations, **params))[0]

    def replacement_forward(module: torch.nn.Module, entry: Callable[..., Any], adapter: list[dict[str, str]]) -> Any:
        def forward(_self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            # Inputs passed by keyword (`norm(hidden_states=x)`) take their place in forward order;
            # the forward's number arguments go to entry by keyword.
            named = tuple(kwargs[n] for n in target.forward_names[len(args) :] if n in kwargs)
            inputs, numbers = target.split_call((*args, *named))
            # A call of a shape the kernel was not verified for raises (the swap serves it with the
            # original forward) instead of computing it wrongly.
            target.check_call([getattr(a, "shape", ()) for a in inputs])
            out = entry(*inputs, **adapter_kwargs(module, adapter), **numbers)
            if not target.updates_state:
                return out
            # The entry also returns the new values of the buffers the forward updates (a
            # training-mode BatchNorm's running statistics): written into the module, as its
            # own forward would, and left out of what the forward returns.
            result, new = target.split_outputs(out)
            target.apply_updates(module, new)
            return result

        return forward

    def bytes_moved(shape: Sequence[int], dtype: torch.dtype) -> int:
        """Every input, parameter and output read or written once (the copy floor's bytes)."""
        size = torch.empty((), dtype=dtype).element_size()
        shapes = target.shapes_for(shape)
        total = sum(
            numel(s) * (size if _dtype(i.dtype).is_floating_point else _dtype(i.dtype).itemsize)
            for s, i in zip(shapes, target.inputs)
        )
        total += sum(numel(p.shape) * size for p in target.params if p.kind == "tensor")
        return total + target.output_bytes(shape, size)

    roles = tuple("stream" if i.domain == "real" else "bounded" for i in target.inputs)
    return OpFamily(
        name=target.op,
        activations=target.input_names,
        params=tuple(ParamSpec(p.kernel_param, (p.module_attr,), p.kind) for p in target.params),
        default_module=target.module_class,
        reference=target.reference,
        make_activations=make_activations,
        module_call=lambda module, *acts: module(*forward_args(acts, target.live_arguments())),
        replacement_forward=replacement_forward,
        module_activations=module_activations,
        module_reference=module_reference,
        bytes_moved=bytes_moved,
        known_modules=(target.module_class,),
        hidden_of=lambda module: int(target.inputs[0].shape[-1]),
        module_filter=lambda module: _same_class(module, target.module_class),
        n_outputs=len(target.meta_outputs(tuple(target.inputs[0].shape)) or [None]),
        activation_roles=roles,
        open_target=target,
    )


def _same_class(module: torch.nn.Module, dotted: str) -> bool:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}" == dotted


def describe_reference(target: OpenTarget) -> str:
    """The open target's computation for a reader (an LLM author): the module's class source (and
    its submodules' classes where they are not torch's own), its structure with the live values of
    its float attributes, and its inputs as seen."""
    parts: list[str] = []
    classes: list[type] = []
    for sub in target.module.modules():
        cls = type(sub)
        if cls not in classes and not cls.__module__.startswith("torch."):
            classes.append(cls)
    for cls in classes:
        try:
            parts.append(textwrap.dedent(inspect.getsource(cls)).rstrip())
        except (OSError, TypeError):
            parts.append(f"# source of {cls.__module__}.{cls.__qualname__} is not available")
    parts.append("# the module as served:\n# " + repr(target.module).replace("\n", "\n# "))
    for p in target.params:
        if p.kind == "float" and p.argument < 0:
            parts.append(f"# {p.module_attr} = {p.value!r}  (live value; passed as keyword {p.kernel_param!r})")
    for p in target.arguments:
        how = (
            "a value of each call: the kernel takes it at run time, never baked"
            if p.kind == "float"
            else "it selects behaviour: a kernel written for the live value must raise for any other"
        )
        parts.append(
            f"# forward argument {p.argument}, {p.module_attr} ({p.kind}, live value {p.value!r}): passed to "
            f"entry as keyword {p.kernel_param!r} (not in ADAPTER); {how}"
        )
    if target.updated_buffers:
        steps = ", ".join(path for path, _ in target.buffer_steps)
        parts.append(
            f"# the forward writes new values into its buffers {', '.join(target.updated_attrs)}: entry returns "
            "the forward's outputs, then the new value of each of these, in this order"
            + (f" (the caller advances {steps} itself)" if steps else "")
        )
    for spec, dims in zip(target.inputs, target.variable_dims):
        extra = f", values in [0, size of input 0 dim {spec.high_dim})" if spec.high_dim >= 0 else ""
        parts.append(
            f"# input {spec.name}: shape {list(spec.shape)} {spec.dtype}, domain {spec.domain}{extra}; "
            f"dims that may take any size: {list(dims)}"
        )
    if len(target.calls) > 1:
        calls = "; ".join(", ".join(f"{n} {list(s)}" for n, s in zip(target.input_names, c)) for c in target.calls)
        parts.append(
            f"# the live model calls it with these shapes (every input's sizes come from the call, "
            f"none may be baked): {calls}"
        )
    return "\n\n".join(parts)
