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
  (`eps`, `margin`, a scaling factor): integer attributes (`dim`) are structure, not values.

Which input sizes may change is found by asking the module: a dim is *variable* when the forward
still runs after that dim grows (checked on the meta device, nothing allocated). The verifier draws
its unseen shapes and its stress shapes along those dims only.

An open target is named `open.<class>_<digest>` and saved under `<state>/targets/<name>/`, so the
verifier's sandbox child, the workers and a restarted server find it by name (`get_op`).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from gpuyantra.ops.base import OpFamily, ParamSpec, Tensor, adapter_kwargs, numel, resolve_attr

OPEN_PREFIX = "open."
DOMAINS = ("real", "positive", "unit", "simplex", "int", "bool")
# Floats a probe moves to see whether an attribute changes the output.
_PROBE_FACTOR, _PROBE_SHIFT = 1.37, 0.11
# Element caps for the verifier's correctness cases (the parent keeps a float64 reference of each).
CPU_CASE_ELEMENTS = 1 << 15
CUDA_CASE_ELEMENTS = 1 << 24
# Stress sizes along the largest variable dim: past a 1024-program grid on the CPU interpreter, past
# a 65,535 grid dimension and a 16,384-wide tile on CUDA.
STRESS_SIZE = {"cpu": 1031, "cuda": 70001}


class OpenTargetError(ValueError):
    """The module and inputs cannot make an open target (one-line reason)."""


@dataclass(frozen=True)
class OpenInput:
    name: str
    shape: tuple[int, ...]
    dtype: str
    domain: str = "real"  # see DOMAINS
    high: int = 0  # integer inputs: values in [0, high)
    # Integer inputs that index a dim of input 0 (class ids of a cross-entropy): values in
    # [0, size of that dim) whatever size the case gives it. -1: `high` is fixed.
    high_dim: int = -1


@dataclass(frozen=True)
class OpenParam:
    kernel_param: str
    module_attr: str  # dotted path on the module: "weight", "ln.weight"
    kind: str  # "tensor" | "float"
    shape: tuple[int, ...] = ()
    dtype: str = ""
    value: float = 0.0
    positive: bool = False  # every live value >= 0 (running variances, scales): drawn positive


@dataclass
class OpenTarget:
    op: str
    module_class: str
    inputs: tuple[OpenInput, ...]
    params: tuple[OpenParam, ...]
    # Per input: (own dim, input 0's dim) pairs of the dims that may take any size; an input's dim
    # follows the input-0 dim it is linked to (a batch dim shared by predictions and targets).
    links: tuple[tuple[tuple[int, int], ...], ...]
    module: torch.nn.Module
    # A .py file that defines the module's class (KernelBench problems): imported under
    # `source_module` before the module is unpickled elsewhere.
    source_file: str | None = None
    source_module: str | None = None
    _copies: dict[tuple[str, str], torch.nn.Module] = field(default_factory=dict, repr=False)
    _meta_cache: dict[tuple[int, ...], Any] = field(default_factory=dict, repr=False)

    # --- what authors read (the OpenSpec fields) ---
    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def tensor_params(self) -> tuple[tuple[str, str], ...]:
        return tuple((p.kernel_param, p.module_attr) for p in self.params if p.kind == "tensor")

    @property
    def float_params(self) -> tuple[tuple[str, str], ...]:
        return tuple((p.kernel_param, p.module_attr) for p in self.params if p.kind == "float")

    @property
    def variable_dims(self) -> tuple[tuple[int, ...], ...]:
        """Per input, the dims that may take any size."""
        return tuple(tuple(own for own, _ in pairs) for pairs in self.links)

    @property
    def adapter(self) -> list[dict[str, str]]:
        return [{"kernel_param": p.kernel_param, "module_attr": p.module_attr} for p in self.params]

    def example_inputs(
        self, shapes: Sequence[Sequence[int]] | None = None, dtype: torch.dtype | None = None, seed: int = 0
    ) -> tuple[Tensor, ...]:
        """CPU inputs in each input's domain, at `shapes` (default: the live ones)."""
        generator = torch.Generator().manual_seed(seed)
        shapes = shapes or [i.shape for i in self.inputs]
        return tuple(
            draw_input(spec, tuple(shape), dtype, "cpu", generator, 1.0, shapes[0])
            for spec, shape in zip(self.inputs, shapes)
        )

    # --- the reference computation ---
    def copy_for(self, dtype: torch.dtype, device: torch.device | str) -> torch.nn.Module:
        """A private copy of the module in `dtype` on `device`, made once per pair."""
        key = (str(dtype), str(torch.device(device)))
        module = self._copies.get(key)
        if module is None:
            module = copy.deepcopy(self.module).to(device=device)
            module = module.to(dtype=dtype) if dtype.is_floating_point else module
            module.eval()
            for p in module.parameters():
                p.requires_grad_(False)
            self._copies[key] = module
        return module

    def reference(self, *activations: Tensor, **params: Any) -> Any:
        """The module's forward on `activations` with the given parameter values (the float
        attributes set on a private copy, the tensors passed by `functional_call`, which
        torch.compile traces as it traces a module)."""
        floating = [a for a in activations if isinstance(a, Tensor) and a.is_floating_point()]
        dtype = floating[0].dtype if floating else _dtype(self.params_dtype())
        device = activations[0].device if activations else torch.device("cpu")
        module = self.copy_for(dtype, device)
        tensors: dict[str, Tensor] = {}
        for spec in self.params:
            if spec.kernel_param not in params:
                continue
            value = params[spec.kernel_param]
            if spec.kind == "float":
                owner, _, attr = _owner(module, spec.module_attr)
                setattr(owner, attr, value)
            else:
                tensors[spec.module_attr] = value
        if not tensors:
            return module(*activations)
        return torch.func.functional_call(module, tensors, tuple(activations))

    def params_dtype(self) -> str:
        for p in self.params:
            if p.kind == "tensor":
                return p.dtype
        return "float32"

    # --- shapes the verifier draws ---
    def case_shapes(self, device: str, live: Sequence[Sequence[int]] | None) -> tuple[list[list[int]], list[list[int]]]:
        """(correctness shapes of input 0, stress shapes): live first, then unseen sizes along the
        variable dims, all capped to what the device's verifier can hold."""
        cap = CPU_CASE_ELEMENTS if device == "cpu" else CUDA_CASE_ELEMENTS
        base = [int(d) for d in (live[0] if live else self.inputs[0].shape)]
        dims = self.variable_dims[0] if self.variable_dims else ()
        shapes: list[list[int]] = []

        def add(shape: list[int]) -> None:
            shape = shrink(shape, dims, cap)
            if shape not in shapes:
                shapes.append(shape)

        for shape in [list(map(int, s)) for s in live or []] or [base]:
            add(shape)
        base = shapes[0]
        for dim in dims:
            for size in (1 if base[dim] > 1 else 3, max(3, base[dim] // 2 + 1) | 1):
                add([size if d == dim else s for d, s in enumerate(base)])
        # One stress shape per variable dim (up to 4): that dim past the caps, the others at 1 (or,
        # where the module needs more, at their sizes above), so a capped grid and a capped tile are
        # both met whichever dim the kernel maps to programs.
        stress: list[list[int]] = []
        for dim in sorted(dims, key=lambda d: -base[d])[:4]:
            for others_at_one in (True, False):
                big = [1 if d in dims and others_at_one else base[d] for d in range(len(base))]
                big[dim] = STRESS_SIZE.get(device, STRESS_SIZE["cuda"])
                if numel(big) <= cap * 4 and big not in stress and self.accepts(big):
                    stress.append(big)
                    break
        # Sizes the module itself refuses (an instance norm over one element) are no test of a kernel.
        return [s for s in shapes if self.accepts(s)] or shapes[:1], stress

    def accepts(self, first: Sequence[int]) -> bool:
        """Whether the module's forward runs when input 0 has shape `first` (meta device)."""
        return self._meta_outputs(tuple(int(d) for d in first)) is not None

    def output_bytes(self, first: Sequence[int], itemsize: int) -> int:
        """Bytes of the outputs when input 0 has shape `first` (integer outputs at 8 bytes)."""
        outs = self._meta_outputs(tuple(int(d) for d in first)) or []
        return sum(numel(shape) * (itemsize if floating else 8) for shape, floating in outs)

    def _meta_outputs(self, first: tuple[int, ...]) -> list[tuple[tuple[int, ...], bool]] | None:
        cache = self._meta_cache
        if first not in cache:
            shapes = self.shapes_for(first)
            args = [torch.empty(s, dtype=_dtype(i.dtype), device="meta") for s, i in zip(shapes, self.inputs)]
            try:
                with torch.no_grad():
                    outs = _tensors(self.copy_for(torch.float32, "meta")(*args))
                cache[first] = [(tuple(o.shape), o.is_floating_point()) for o in outs]
            except Exception:  # noqa: BLE001 - the module refuses these sizes
                cache[first] = None
        return cache[first]

    def shapes_for(self, first: Sequence[int]) -> list[tuple[int, ...]]:
        """Every input's shape when input 0 has shape `first` (see `follow_shapes`)."""
        return follow_shapes([i.shape for i in self.inputs], self.links, first)

    # --- persistence ---
    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        meta = {
            "op": self.op,
            "module_class": self.module_class,
            "inputs": [asdict(i) for i in self.inputs],
            "params": [asdict(p) for p in self.params],
            "links": [[list(pair) for pair in pairs] for pairs in self.links],
            "source_file": self.source_file,
            "source_module": self.source_module,
        }
        (folder / "target.json").write_text(json.dumps(meta, indent=1))
        torch.save(self.module.to("cpu"), folder / "module.pt")
        return folder


def draw_input(
    spec: OpenInput,
    shape: tuple[int, ...],
    dtype: torch.dtype | None,
    device: torch.device | str,
    generator: torch.Generator,
    scale: float,
    first: Sequence[int] | None = None,
) -> Tensor:
    """One activation drawn in its domain (a dtype given overrides a floating input's own);
    `first` is input 0's shape, which an index input's range may follow."""
    where = generator.device
    own = _dtype(spec.dtype)
    if spec.domain == "int":
        high = spec.high if spec.high_dim < 0 or first is None else int(first[spec.high_dim])
        values = torch.randint(0, max(1, high), shape, generator=generator, device=where)
        return values.to(device=device, dtype=own)
    if spec.domain == "bool":
        return (torch.rand(shape, generator=generator, device=where) < 0.5).to(device)
    out_dtype = dtype if dtype is not None and own.is_floating_point else own
    if spec.domain == "unit":
        values = torch.rand(shape, generator=generator, device=where)
    elif spec.domain == "positive":
        values = torch.randn(shape, generator=generator, device=where).abs() * abs(scale) + 1e-3
    elif spec.domain == "simplex":
        values = torch.randn(shape, generator=generator, device=where).softmax(dim=-1)
    else:
        values = torch.randn(shape, generator=generator, device=where) * scale
    return values.to(device=device, dtype=out_dtype)


def follow_shapes(
    live: Sequence[Sequence[int]], links: Sequence[Sequence[tuple[int, int]]], first: Sequence[int]
) -> list[tuple[int, ...]]:
    """Every input's shape when input 0 takes shape `first`: each linked dim takes the size of
    the input-0 dim it follows; every other dim keeps its live size."""
    out: list[tuple[int, ...]] = [tuple(int(d) for d in first)]
    for index, shape_live in enumerate(live[1:], start=1):
        shape = [int(d) for d in shape_live]
        for own, dim0 in links[index] if index < len(links) else ():
            if dim0 < len(first):
                shape[own] = int(first[dim0])
        out.append(tuple(shape))
    return out


def reduced_shapes(
    live: Sequence[Sequence[int]], links: Sequence[Sequence[tuple[int, int]]], cap: int
) -> list[tuple[int, ...]] | None:
    """Smaller shapes of the same problem: input 0's variable dims halved until every input holds
    at most `cap` elements (the others follow). None when the fixed dims alone are too large."""
    dims0 = [own for own, _ in links[0]] if links else []
    first = [int(d) for d in live[0]]
    while True:
        shapes = follow_shapes(live, links, first)
        if all(numel(s) <= cap for s in shapes):
            return shapes
        movable = [d for d in dims0 if first[d] > 1]
        if not movable:
            return None
        d = max(movable, key=lambda i: first[i])
        first[d] = _halve(first[d])


class ShrinkFactories(torch.overrides.TorchFunctionMode):
    """While active, tensor factories (`torch.randn(4096, 393216)`, `torch.randint(0, 10, (4096,))`)
    asked for a shape in `sizes` make the mapped smaller shape instead: a problem's own
    `get_inputs()` then draws reduced inputs with its own distributions (softmax, abs, rand...)."""

    FACTORIES = frozenset(
        {torch.randn, torch.rand, torch.randint, torch.zeros, torch.ones, torch.empty, torch.full, torch.normal}
    )

    def __init__(self, sizes: dict[tuple[int, ...], tuple[int, ...]]):
        super().__init__()
        self.sizes = sizes
        # randint's upper bound when it is a reduced dim's size (class ids of a reduced class dim).
        self.bounds = {a: b for live, small in sizes.items() for a, b in zip(live, small) if a != b}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in self.FACTORIES:
            args, kwargs = self._resize(func, tuple(args), kwargs)
        return func(*args, **kwargs)

    def _resize(self, func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if "size" in kwargs and tuple(kwargs["size"]) in self.sizes:
            kwargs["size"] = self.sizes[tuple(kwargs["size"])]
            return args, kwargs
        # randint(high, size) / randint(low, high, size): the size comes after the bounds.
        lead = (2 if len(args) >= 3 else 1) if func is torch.randint else 0
        if func is torch.randint and lead and isinstance(args[lead - 1], int) and args[lead - 1] in self.bounds:
            args = (*args[: lead - 1], self.bounds[args[lead - 1]], *args[lead:])
        rest = args[lead:]
        if rest and isinstance(rest[0], (tuple, list, torch.Size)) and tuple(rest[0]) in self.sizes:
            return (*args[:lead], self.sizes[tuple(rest[0])], *rest[1:]), kwargs
        ints = tuple(a for a in rest if isinstance(a, int) and not isinstance(a, bool))
        if func is not torch.full and ints and ints == tuple(rest[: len(ints)]) and ints in self.sizes:
            return (*args[:lead], *self.sizes[ints], *rest[len(ints) :]), kwargs
        return args, kwargs


def shrink(shape: list[int], dims: Sequence[int], cap: int) -> list[int]:
    """Halve the largest variable dims until the shape holds at most `cap` elements."""
    shape = list(shape)
    while numel(shape) > cap:
        movable = [d for d in dims if shape[d] > 1]
        if not movable:
            break
        d = max(movable, key=lambda i: shape[i])
        shape[d] = _halve(shape[d])
    return shape


def _halve(size: int) -> int:
    """About half of `size`, odd (sizes the kernel never saw as powers of two)."""
    return max(1, (size // 2) | 1) if size > 3 else 1


# ---------------------------------------------------------------------------------------------
# Building a target from a live module


def build_open_target(
    module: torch.nn.Module,
    inputs: Sequence[Any],
    *,
    name_hint: str | None = None,
    source_file: str | None = None,
    source_module: str | None = None,
) -> OpenTarget:
    """An open target for `module` called as `module(*inputs)`. Raises OpenTargetError."""
    if not inputs or not all(isinstance(i, Tensor) for i in inputs):
        raise OpenTargetError("an open target needs tensor inputs only (non-tensor forward arguments are not bound)")
    module = _cpu_copy(module)
    names = _input_names(module, len(inputs))
    specs = _link_index_ranges(tuple(_input_spec(name, t) for name, t in zip(names, inputs)))
    if specs[0].domain in ("int", "bool") or not specs[0].shape:
        raise OpenTargetError("the first input must be a floating tensor with at least one dim")
    probe_inputs = tuple(t.detach().to("cpu") for t in leading_rows(inputs, 1 << 20))
    params = _tensor_params(module) + _float_params(module, probe_inputs)
    links = dim_links(module, specs)
    cls = type(module)
    dotted = f"{cls.__module__}.{cls.__qualname__}"
    digest = _digest(dotted, specs, params, source_file)
    slug = re.sub(r"[^a-z0-9]+", "_", (name_hint or cls.__name__).lower()).strip("_")[:40] or "module"
    return OpenTarget(
        op=f"{OPEN_PREFIX}{slug}_{digest}",
        module_class=dotted,
        inputs=specs,
        params=params,
        links=links,
        module=module,
        source_file=source_file,
        source_module=source_module,
    )


def _cpu_copy(module: torch.nn.Module) -> torch.nn.Module:
    copied = copy.deepcopy(module).to("cpu").eval()
    for p in copied.parameters():
        p.requires_grad_(False)
    return copied


def _input_names(module: torch.nn.Module, n: int) -> list[str]:
    try:
        names = [
            p.name
            for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        names = []
    names = (names + [f"x{i}" for i in range(len(names), n)])[:n]
    out: list[str] = []
    for i, name in enumerate(names):
        name = name if name.isidentifier() and name not in out else f"x{i}"
        out.append(name)
    return out


def _input_spec(name: str, t: Tensor) -> OpenInput:
    dtype = str(t.dtype).replace("torch.", "")
    shape = tuple(int(d) for d in t.shape)
    if t.dtype == torch.bool:
        return OpenInput(name, shape, dtype, "bool")
    if not t.is_floating_point():
        bound = int(t.max().item()) + 1 if t.numel() and not t.is_meta else 2
        return OpenInput(name, shape, dtype, "int", max(2, bound))
    if t.is_meta or t.numel() == 0:
        return OpenInput(name, shape, dtype)
    values = t.detach().float()
    low, high = float(values.min()), float(values.max())
    if low >= 0 and t.dim() >= 1 and bool(torch.allclose(values.sum(-1), torch.ones(()), atol=1e-3)):
        return OpenInput(name, shape, dtype, "simplex")
    if low >= 0 and high <= 1:
        return OpenInput(name, shape, dtype, "unit")
    if low >= 0:
        return OpenInput(name, shape, dtype, "positive")
    return OpenInput(name, shape, dtype)


def _link_index_ranges(specs: tuple[OpenInput, ...]) -> tuple[OpenInput, ...]:
    """An integer input whose values cover most of a dim of input 0 indexes that dim (class ids):
    its range follows that dim's size (the smallest such dim)."""
    first = specs[0].shape
    out = [specs[0]]
    for spec in specs[1:]:
        dims = [d for d, size in enumerate(first) if spec.domain == "int" and size >= spec.high > size // 2]
        out.append(replace(spec, high_dim=min(dims, key=lambda d: first[d])) if dims else spec)
    return tuple(out)


def _kernel_name(path: str, taken: set[str]) -> str:
    name = re.sub(r"\W", "_", path)
    name = name if name.isidentifier() else f"p_{name}"
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _tensor_params(module: torch.nn.Module) -> tuple[OpenParam, ...]:
    taken: set[str] = set()
    params: list[OpenParam] = []
    buffers = {path for path, _ in module.named_buffers()}
    for path, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        if not tensor.is_floating_point():
            continue  # integer buffers (num_batches_tracked) are bookkeeping, not values
        # Drawn positive only where the module keeps a nonnegative statistic (running variances):
        # a freshly initialized weight of ones is a weight, and weights get both signs.
        positive = path in buffers and bool(tensor.numel()) and not tensor.is_meta and bool((tensor >= 0).all())
        params.append(
            OpenParam(
                kernel_param=_kernel_name(path, taken),
                module_attr=path,
                kind="tensor",
                shape=tuple(int(d) for d in tensor.shape),
                dtype=str(tensor.dtype).replace("torch.", ""),
                positive=positive,
            )
        )
    return tuple(params)


def _float_attributes(module: torch.nn.Module) -> list[tuple[str, float]]:
    found = []
    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if attr.startswith("_") or attr == "training" or isinstance(value, bool) or not isinstance(value, float):
                continue
            found.append((f"{prefix}.{attr}" if prefix else attr, value))
    return found


def _float_params(module: torch.nn.Module, inputs: tuple[Tensor, ...]) -> tuple[OpenParam, ...]:
    """Float attributes whose value changes the output on the probe inputs (dropout's p in eval
    mode, momentum: no effect, not bound)."""
    probe = list(leading_rows(inputs, 1 << 16))
    try:
        with torch.no_grad():
            before = [o.clone() for o in _tensors(module(*probe))]
    except Exception:  # noqa: BLE001 - dim 0 is not free: probe on the whole inputs
        probe = list(inputs)
        try:
            with torch.no_grad():
                before = [o.clone() for o in _tensors(module(*probe))]
        except Exception as exc:  # noqa: BLE001 - the forward itself fails: nothing can be bound
            raise OpenTargetError(f"the module's forward fails on its inputs: {type(exc).__name__}: {exc}") from exc
    taken = {p.kernel_param for p in _tensor_params(module)}
    params = []
    for path, value in _float_attributes(module):
        owner, _, attr = _owner(module, path)
        setattr(owner, attr, value * _PROBE_FACTOR + _PROBE_SHIFT)
        try:
            with torch.no_grad():
                after = _tensors(module(*probe))
            changed = any(not torch.equal(a, b) for a, b in zip(after, before))
        except Exception:  # noqa: BLE001 - another value breaks the forward: structural, not bound
            changed = False
        finally:
            setattr(owner, attr, value)
        if changed:
            params.append(
                OpenParam(kernel_param=_kernel_name(path, taken), module_attr=path, kind="float", value=value)
            )
    return tuple(params)


def leading_rows(inputs: Sequence[Any], max_elements: int) -> Sequence[Any]:
    """`inputs` cut to their first rows so input 0 holds about `max_elements`: every tensor whose
    dim 0 has input 0's size is cut alike (a batch shared by predictions and targets). The same
    sequence object when nothing needs cutting."""
    first = inputs[0] if inputs else None
    if not isinstance(first, Tensor) or first.dim() == 0 or first.numel() <= max_elements:
        return inputs
    rows = max(1, max_elements // max(1, numel(first.shape[1:])))
    if rows >= first.shape[0]:
        return inputs
    size = first.shape[0]
    return [t[:rows] if isinstance(t, Tensor) and t.dim() and t.shape[0] == size else t for t in inputs]


def _tensors(out: Any) -> list[Tensor]:
    items = out if isinstance(out, (tuple, list)) else [out]
    return [o for o in items if isinstance(o, Tensor)]


def dim_links(module: torch.nn.Module, specs: Sequence[OpenInput]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per input, (own dim, input 0's dim) for the dims whose size the forward accepts changing,
    found on the meta device (nothing allocated). Input 0's dim d grows by 3; each other input's
    dim of the same size grows with it, aligned by leading dims first (a shared batch dim), else by
    trailing dims (broadcasting)."""
    try:
        meta = copy.deepcopy(module).to("meta")
    except Exception:  # noqa: BLE001 - modules that cannot move to meta: only the live shapes
        return tuple(() for _ in specs)
    live = [s.shape for s in specs]

    def runs(shapes: Sequence[Sequence[int]]) -> bool:
        args = [torch.empty(tuple(s), dtype=_dtype(spec.dtype), device="meta") for s, spec in zip(shapes, specs)]
        try:
            with torch.no_grad():
                return bool(_tensors(meta(*args)))
        except Exception:  # noqa: BLE001 - the forward refuses the size: a fixed dim
            return False

    if not runs(live):
        return tuple(() for _ in specs)
    links: list[list[tuple[int, int]]] = [[] for _ in specs]
    for d in range(len(live[0])):
        for aligned in _alignments(live, d):
            grown = follow_shapes(live, aligned, [s + 3 if i == d else s for i, s in enumerate(live[0])])
            if runs(grown):
                for index, pairs in enumerate(aligned):
                    links[index] += pairs
                break
    return tuple(tuple(sorted(set(pairs))) for pairs in links)


def _alignments(live: Sequence[Sequence[int]], d: int) -> list[list[list[tuple[int, int]]]]:
    """Ways input 0's dim d can be shared by the other inputs: by leading position, by trailing
    position, or not at all (the others keep their sizes)."""
    size = live[0][d]
    ways: list[list[list[tuple[int, int]]]] = []
    for trailing in (False, True):
        way: list[list[tuple[int, int]]] = [[(d, d)]]
        for shape in live[1:]:
            own = d - (len(live[0]) - len(shape)) if trailing else d
            way.append([(own, d)] if 0 <= own < len(shape) and shape[own] == size and size != 1 else [])
        if way not in ways:
            ways.append(way)
    alone = [[(d, d)]] + [[] for _ in live[1:]]
    if alone not in ways:
        ways.append(alone)
    return ways


def _digest(dotted: str, specs: Sequence[OpenInput], params: Sequence[OpenParam], source: str | None) -> str:
    text = json.dumps(
        [dotted, [asdict(s) for s in specs], [(p.module_attr, p.kind, p.shape) for p in params], source],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _owner(module: torch.nn.Module, dotted: str) -> tuple[Any, str, str]:
    parent, _, attr = dotted.rpartition(".")
    return (resolve_attr(module, parent) if parent else module), parent, attr


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise OpenTargetError(f"unknown dtype {name!r}")
    return value


# ---------------------------------------------------------------------------------------------
# The family view: what the verifier, swap engine and authors use


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
        shapes = target.shapes_for((*rows, hidden))
        return tuple(
            draw_input(spec, shape, dtype, device, generator, scale, shapes[0])
            for spec, shape in zip(target.inputs, shapes)
        )

    def module_activations(
        module: torch.nn.Module, rows: Sequence[int], dtype: torch.dtype, device: Any, generator: torch.Generator
    ) -> tuple[Tensor, ...]:
        first = list(target.inputs[0].shape)
        shapes = target.shapes_for(shrink(first, target.variable_dims[0] if target.variable_dims else (), 4096))
        return tuple(
            draw_input(spec, shape, dtype, device, generator, 1.0, shapes[0])
            for spec, shape in zip(target.inputs, shapes)
        )

    def module_reference(module: torch.nn.Module, *activations: Tensor, **params: Any) -> Any:
        return target.reference(*activations, **params)

    def replacement_forward(module: torch.nn.Module, entry: Callable[..., Any], adapter: list[dict[str, str]]) -> Any:
        def forward(_self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            # Inputs passed by keyword (`norm(hidden_states=x)`) take their place in forward order.
            named = tuple(kwargs[n] for n in target.input_names[len(args) :] if n in kwargs)
            return entry(*args, *named, **adapter_kwargs(module, adapter))

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

    def adapt_shape(shape: Sequence[int]) -> Sequence[int]:
        return shape

    roles = tuple("stream" if i.domain == "real" else "bounded" for i in target.inputs)
    return OpFamily(
        name=target.op,
        activations=target.input_names,
        params=tuple(ParamSpec(p.kernel_param, (p.module_attr,), p.kind) for p in target.params),
        default_module=target.module_class,
        reference=target.reference,
        make_activations=make_activations,
        module_call=lambda module, *acts: module(*acts),
        replacement_forward=replacement_forward,
        module_activations=module_activations,
        module_reference=module_reference,
        bytes_moved=bytes_moved,
        known_modules=(target.module_class,),
        hidden_of=lambda module: int(target.inputs[0].shape[-1]),
        module_filter=lambda module: _same_class(module, target.module_class),
        n_outputs=len(_tensors(target.reference(*target.example_inputs(target.shapes_for(_tiny(target)))))) or 1,
        activation_roles=roles,
        adapt_shape=adapt_shape,
        open_target=target,
    )


def _tiny(target: OpenTarget) -> list[int]:
    dims = target.variable_dims[0] if target.variable_dims else ()
    return shrink(list(target.inputs[0].shape), dims, 4096)


def _same_class(module: torch.nn.Module, dotted: str) -> bool:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}" == dotted


# ---------------------------------------------------------------------------------------------
# Registry: by name, in this process or from the state folder


def targets_dir() -> Path:
    from gpuyantra.config import state_dir

    return state_dir() / "targets"


def register_open(target: OpenTarget, save: bool = True) -> OpFamily:
    """Register the target's family in this process (and save it for other processes)."""
    from gpuyantra.ops import register

    if save:
        target.save(targets_dir() / target.op)
    return register(open_family(target))


def load_open_target(folder: Path) -> OpenTarget:
    meta = json.loads((folder / "target.json").read_text())
    source_file, source_module = meta.get("source_file"), meta.get("source_module")
    if source_file and source_module and source_module not in sys.modules:
        _import_source(Path(source_file), source_module)
    module = torch.load(folder / "module.pt", weights_only=False, map_location="cpu")
    return OpenTarget(
        op=meta["op"],
        module_class=meta["module_class"],
        inputs=tuple(OpenInput(**{**i, "shape": tuple(i["shape"])}) for i in meta["inputs"]),
        params=tuple(OpenParam(**{**p, "shape": tuple(p["shape"])}) for p in meta["params"]),
        links=tuple(tuple((int(a), int(b)) for a, b in pairs) for pairs in meta["links"]),
        module=module,
        source_file=source_file,
        source_module=source_module,
    )


def _import_source(file: Path, name: str) -> None:
    from gpuyantra.candidate import import_file

    import_file(file, name)


def find_open_family(name: str) -> OpFamily | None:
    """The family of a saved open target named `name`, registered on first use; None if unknown."""
    if not name.startswith(OPEN_PREFIX) or not re.fullmatch(r"open\.[a-z0-9_]+", name):
        return None
    folder = targets_dir() / name
    if not (folder / "target.json").is_file():
        return None
    return register_open(load_open_target(folder), save=False)


def open_spec_for(name: str) -> OpenTarget:
    """The open target behind op `name` (what the open author reads)."""
    from gpuyantra.ops import get_op

    target = getattr(get_op(name), "open_target", None)
    if target is None:
        raise OpenTargetError(f"{name!r} is not an open target")
    return target


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
        if p.kind == "float":
            parts.append(f"# {p.module_attr} = {p.value!r}  (live value; passed as keyword {p.kernel_param!r})")
    for spec, dims in zip(target.inputs, target.variable_dims):
        extra = f", values in [0, size of input 0 dim {spec.high_dim})" if spec.high_dim >= 0 else ""
        parts.append(
            f"# input {spec.name}: shape {list(spec.shape)} {spec.dtype}, domain {spec.domain}{extra}; "
            f"dims that may take any size: {list(dims)}"
        )
    return "\n\n".join(parts)


def is_open(name: str | None) -> bool:
    return bool(name) and str(name).startswith(OPEN_PREFIX)
