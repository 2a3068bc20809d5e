"""`OpenTarget`: the module, its reference computation, the shapes the verifier draws, persistence."""

from __future__ import annotations

import base64
import copy
import io
import json
import pickle
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpuyantra.ops.base import Tensor, numel
from gpuyantra.ops.open.library import kinds_in_forward
from gpuyantra.ops.open.spec import (
    CPU_CASE_ELEMENTS,
    CUDA_CASE_ELEMENTS,
    OPEN_CLASS_SIZES,
    STRESS_SIZE,
    OpenInput,
    OpenParam,
    OpenTargetError,
    _dtype,
    _owner,
    _tensors,
    draw_input,
    follow_shapes,
    forward_args,
    halve,
    shrink,
    trace_sizes,
)


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
    # Buffers the forward writes new values into (a BatchNorm's running statistics in training
    # mode): the kernel params of the floating ones, whose new values the reference returns after
    # the forward's outputs in this order, and (module attr, step) of the integer ones the forward
    # advances by a fixed step (num_batches_tracked), which the wrapper applies itself.
    updated_buffers: tuple[str, ...] = ()
    buffer_steps: tuple[tuple[str, int], ...] = ()
    forward_returns_tuple: bool = False  # with updated buffers: whether the forward itself returns a tuple
    # Groups of (input, dim) of the later inputs whose size changes between the live calls without
    # following any dim of input 0 (a cache length): each group's dims take one size together.
    free: tuple[tuple[tuple[int, int], ...], ...] = ()
    # Every input's shapes in each live call the target was built from (the build call first):
    # the verifier's cases and the swap's parity check run at each of them.
    calls: tuple[tuple[tuple[int, ...], ...], ...] = ()
    _copies: dict[tuple[str, str], torch.nn.Module] = field(default_factory=dict, repr=False)
    _meta_cache: dict[tuple[int, ...], Any] = field(default_factory=dict, repr=False)
    _library_kinds: frozenset[str] | None = field(default=None, repr=False)

    # --- what authors read (the OpenSpec fields) ---
    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def tensor_params(self) -> tuple[tuple[str, str], ...]:
        return tuple((p.kernel_param, p.module_attr) for p in self.params if p.kind == "tensor")

    @property
    def float_params(self) -> tuple[tuple[str, str], ...]:
        """(kernel param, module attr) of the float attributes (not the forward's number arguments)."""
        return tuple((p.kernel_param, p.module_attr) for p in self.params if p.kind == "float" and p.argument < 0)

    @property
    def arguments(self) -> tuple[OpenParam, ...]:
        """The numbers the forward takes as arguments (OpenParam.argument), in forward order."""
        return tuple(sorted((p for p in self.params if p.argument >= 0), key=lambda p: p.argument))

    @property
    def argument_names(self) -> tuple[str, ...]:
        """Kernel params of the forward's number arguments: entry takes them as keywords, the caller
        passes them (an ADAPTER binds the module's attributes only)."""
        return tuple(p.kernel_param for p in self.arguments)

    @property
    def forward_names(self) -> tuple[str, ...]:
        """Every positional argument of the forward by name, tensors and numbers, in order."""
        return tuple(forward_args(self.input_names, [(p.argument, p.module_attr) for p in self.arguments]))

    def live_arguments(self, values: dict[str, Any] | None = None) -> list[tuple[int, Any]]:
        """(position, value) of each number argument: its value in `values` (by kernel param), else the live one."""
        values = values or {}
        return [(p.argument, values.get(p.kernel_param, p.value)) for p in self.arguments]

    def split_call(self, args: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
        """(the tensor inputs, {kernel param: value} of the number arguments) of a forward's
        positional arguments: what entry takes positionally and by keyword."""
        at = {p.argument: p.kernel_param for p in self.arguments}
        return [a for i, a in enumerate(args) if i not in at], {at[i]: a for i, a in enumerate(args) if i in at}

    @property
    def variable_dims(self) -> tuple[tuple[int, ...], ...]:
        """Per input, the dims that may take any size (following input 0's, or free)."""
        free = {pair for group in self.free for pair in group}
        return tuple(
            tuple(sorted({own for own, _ in pairs} | {d for i, d in free if i == index}))
            for index, pairs in enumerate(self.links)
        )

    # --- case keys: every input's shapes as one list of ints ---
    # A case names its shapes by one list of ints (the verifier's `Case.shape`, a profile's
    # `shapes`): input 0's shape when every other input follows it (`follow_shapes`), else every
    # input's shape one after the other (a live call whose later inputs the links do not give).
    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(len(i.shape) for i in self.inputs)

    def case_key(self, shapes: Sequence[Sequence[int]]) -> list[int]:
        """The key of a call with these input shapes (see above)."""
        shapes = [tuple(int(d) for d in s) for s in shapes]
        if len(shapes) != len(self.inputs) or tuple(len(s) for s in shapes) != self.ranks:
            raise OpenTargetError(
                f"a call with input shapes {[list(s) for s in shapes]} does not match the inputs of {self.op} "
                f"(ranks {list(self.ranks)})"
            )
        if self.shapes_for(shapes[0]) == shapes:
            return list(shapes[0])
        return [d for s in shapes for d in s]

    def call_keys(self) -> list[list[int]]:
        """The keys of the live calls the target was built from, without repeats."""
        keys: list[list[int]] = []
        for call in self.calls:
            try:
                key = self.case_key(call)
            except OpenTargetError:
                continue
            if key not in keys:
                keys.append(key)
        return keys

    def check_call(self, shapes: Sequence[Sequence[int]]) -> None:
        """Raise OpenTargetError unless a call with these input shapes is one the target describes:
        every input of its rank, every dim that is not variable at its live size. A kernel was
        verified along the variable dims only: the swapped forward refuses (and falls back) rather
        than compute another shape wrongly."""
        variable = self.variable_dims
        for index, (spec, shape) in enumerate(zip(self.inputs, shapes)):
            shape = tuple(int(d) for d in shape)
            fixed = [d for d in range(len(spec.shape)) if d not in variable[index]]
            if len(shape) != len(spec.shape) or any(shape[d] != spec.shape[d] for d in fixed):
                raise OpenTargetError(
                    f"input {spec.name} has shape {list(shape)}; {self.op} was verified for shapes "
                    f"{list(spec.shape)} changing only along dims {list(variable[index])}"
                )

    @property
    def updated_attrs(self) -> tuple[str, ...]:
        """Module attrs of the floating buffers the forward updates, in the order of the extra outputs."""
        attr = {p.kernel_param: p.module_attr for p in self.params}
        return tuple(attr[kp] for kp in self.updated_buffers)

    @property
    def updates_state(self) -> bool:
        return bool(self.updated_buffers or self.buffer_steps)

    def split_outputs(self, out: Any) -> tuple[Any, tuple[Tensor, ...]]:
        """(what the forward returns, the updated buffers' new values) from an entry's or the
        reference's outputs (the forward's outputs, then one per updated buffer)."""
        if not self.updated_buffers:
            return out, ()
        items = tuple(out)
        k = len(items) - len(self.updated_buffers)
        kept, new = items[:k], items[k:]
        return (kept if self.forward_returns_tuple or len(kept) != 1 else kept[0]), new

    def apply_updates(self, module: torch.nn.Module, new: Sequence[Tensor]) -> None:
        """Write the updated buffers' new values (and the integer buffers' steps) into `module`."""
        with torch.no_grad():
            for path, value in zip(self.updated_attrs, new):
                owner, _, attr = _owner(module, path)
                getattr(owner, attr).copy_(value)
            for path, step in self.buffer_steps:
                owner, _, attr = _owner(module, path)
                getattr(owner, attr).add_(step)

    @property
    def adapter(self) -> list[dict[str, str]]:
        """The module attributes entry's keywords are bound to (the forward's number arguments are not)."""
        return [{"kernel_param": p.kernel_param, "module_attr": p.module_attr} for p in self.params if p.argument < 0]

    def example_inputs(
        self, shapes: Sequence[Sequence[int]] | None = None, dtype: torch.dtype | None = None, seed: int = 0
    ) -> tuple[Tensor, ...]:
        """CPU inputs in each input's domain, at `shapes` (default: the live ones)."""
        generator = torch.Generator().manual_seed(seed)
        return self.draw(shapes or [i.shape for i in self.inputs], dtype, "cpu", generator)

    def draw(
        self,
        shapes: Sequence[Sequence[int]],
        dtype: torch.dtype | None,
        device: torch.device | str,
        generator: torch.Generator,
        scale: float = 1.0,
    ) -> tuple[Tensor, ...]:
        """One tensor per input at `shapes`, each drawn in its domain (see `draw_input`)."""
        return tuple(
            draw_input(spec, tuple(shape), dtype, device, generator, scale, shapes[0])
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
            if spec.kernel_param not in params or spec.argument >= 0:
                continue
            value = params[spec.kernel_param]
            if spec.kind == "float":
                owner, _, attr = _owner(module, spec.module_attr)
                setattr(owner, attr, value)
            else:
                tensors[spec.module_attr] = value
        args = forward_args(activations, self.live_arguments(params))  # number arguments at the values given
        if self.updates_state:
            return self._reference_with_updates(module, tensors, args)
        if not tensors:
            return module(*args)
        return torch.func.functional_call(module, tensors, tuple(args))

    def _reference_with_updates(
        self, module: torch.nn.Module, tensors: dict[str, Tensor], activations: Sequence[Any]
    ) -> tuple[Tensor, ...]:
        """The forward on private copies of the buffers it updates (neither the caller's tensors nor
        the module copy change), returning its outputs, then the updated buffers' new values."""
        for path in (*self.updated_attrs, *(p for p, _ in self.buffer_steps)):
            value = tensors.get(path)
            if value is None:
                owner, _, attr = _owner(module, path)
                value = getattr(owner, attr)
            tensors[path] = value.clone()
        out = torch.func.functional_call(module, tensors, tuple(activations))
        return (*_tensors(out), *(tensors[path] for path in self.updated_attrs))

    def params_dtype(self) -> str:
        for p in self.params:
            if p.kind == "tensor":
                return p.dtype
        return "float32"

    # --- shapes the verifier draws ---
    def case_shapes(self, device: str, live: Sequence[Sequence[int]] | None) -> tuple[list[list[int]], list[list[int]]]:
        """(correctness keys, stress keys): the live keys first, then every live call the target
        was built from (each input at its own shape), then unseen sizes along input 0's variable
        dims and along the free dims, all capped to what the device's verifier can hold."""
        cap = CPU_CASE_ELEMENTS if device == "cpu" else CUDA_CASE_ELEMENTS
        dims = self.variable_dims[0] if self.variable_dims else ()
        shapes: list[list[int]] = []

        def add(key: list[int]) -> None:
            key = self.fit(key, cap)
            if key not in shapes:
                shapes.append(key)

        seen = [list(map(int, s)) for s in live or []] + self.call_keys()
        for key in [k for k in seen if self._valid_key(k)] or [[int(d) for d in self.inputs[0].shape]]:
            add(key)
        base = self.shapes_for(shapes[0])
        first = list(base[0])
        for dim in dims:
            for size in (1 if first[dim] > 1 else 3, max(3, first[dim] // 2 + 1) | 1):
                add([size if d == dim else s for d, s in enumerate(first)])
        for group in self.free:
            size = base[group[0][0]][group[0][1]]
            for other in (1 if size > 1 else 3, max(3, size // 2 + 1) | 1):
                grown = [list(s) for s in self.shapes_for(first)]
                for index, d in group:
                    grown[index][d] = other
                add(self.case_key(grown))
        # One stress shape per variable dim (up to 4): that dim past the caps, the others at 1 (or,
        # where the module needs more, at their sizes above), so a capped grid and a capped tile are
        # both met whichever dim the kernel maps to programs.
        stress: list[list[int]] = []
        for dim in sorted(dims, key=lambda d: -first[d])[:4]:
            for others_at_one in (True, False):
                big = [1 if d in dims and others_at_one else first[d] for d in range(len(first))]
                big[dim] = STRESS_SIZE.get(device, STRESS_SIZE["cuda"])
                if self.largest_tensor(big) <= cap * 4 and big not in stress and self.accepts(big):
                    stress.append(big)
                    break
        # Sizes the module itself refuses (an instance norm over one element) are no test of a kernel.
        return [s for s in shapes if self.accepts(s)] or shapes[:1], stress

    def class_keys(self, device: str) -> dict[str, list[int]]:
        """The plan classes' keys along the dims the module lets change (input 0's keys, the other
        inputs following): `wide_rows`, the last dim (where it varies) at a width between tile
        sizes; `prefill_rows`, the outermost at a prefill row count with the last (a GEMM's K where
        it varies) at a size no tile divides; `large_tensor`, the outermost grown past a persistent
        loop's reach (on the CPU the last, where it varies). Each fitted to the device's case cap
        (the verdict says which ran reduced); a class whose dims the module fixes is left out."""
        dims = sorted(self.variable_dims[0]) if self.variable_dims else []
        if not dims:
            return {}
        first = [int(d) for d in self.inputs[0].shape]
        cap = CPU_CASE_ELEMENTS if device == "cpu" else CUDA_CASE_ELEMENTS
        inner, outer = dims[-1], dims[0]
        wide, rows, odd, large = OPEN_CLASS_SIZES[device]
        keys: dict[str, list[int]] = {}

        def sized(changes: dict[int, int]) -> list[int]:
            return [changes.get(d, 2 if d in dims else n) for d, n in enumerate(first)]

        last = len(first) - 1
        if inner == last:  # a reduction width the module lets change
            keys["wide_rows"] = sized({inner: wide})
        if outer != last:
            keys["prefill_rows"] = sized({outer: rows, **({inner: odd} if inner == last else {})})
        # On the CPU a long outer dim is a program per row of the interpreter: the stress shapes have it.
        if device != "cpu" or inner == last:
            keys["large_tensor"] = sized({outer if device != "cpu" else inner: large})
        fitted = {klass: self.fit(key, cap) for klass, key in keys.items()}
        return {klass: key for klass, key in fitted.items() if self.accepts(key)}

    def _valid_key(self, key: Sequence[int]) -> bool:
        return len(key) in (len(self.inputs[0].shape), sum(self.ranks)) and all(int(d) >= 1 for d in key)

    def fit(self, key: Sequence[int], cap: int) -> list[int]:
        """`key` with its largest variable sizes halved until every input and output holds at
        most `cap` elements. An input-0 key halves input 0's dims (the others follow); a key of
        every input halves a dim together with the dims of the other inputs that share its size
        (linked to it, or in its free group), so a size-1 dim of a live call stays 1."""
        key = [int(d) for d in key]
        dims = self.variable_dims[0] if self.variable_dims else ()
        if len(key) == len(self.inputs[0].shape):
            return self._within(shrink(key, dims, cap), dims, cap)
        largest = self.largest_tensor(key)
        while largest > cap:
            shapes = [list(s) for s in self.shapes_for(key)]
            groups = [
                [(0, d)] + [(i, own) for i in range(1, len(shapes)) for own, d0 in self.links[i] if d0 == d]
                for d in dims
            ]
            groups += [list(g) for g in self.free]
            movable = [[(i, d) for i, d in g if shapes[i][d] == shapes[g[0][0]][g[0][1]]] for g in groups]
            movable = [g for g in movable if g and shapes[g[0][0]][g[0][1]] > 1]
            if not movable:
                break
            group = max(movable, key=lambda g: shapes[g[0][0]][g[0][1]])
            for i, d in group:
                shapes[i][d] = halve(shapes[i][d])
            smaller = [d for s in shapes for d in s]
            if self.largest_tensor(smaller) >= largest:
                break  # the largest tensor does not follow these dims (a fixed weight): keep the key
            key, largest = smaller, self.largest_tensor(smaller)
        return key

    def largest_tensor(self, first: Sequence[int]) -> int:
        """Elements of the largest input or output when input 0 has shape `first`: a matmul's B
        and output follow dims input 0 does not show, and the verifier holds them all."""
        sizes = [numel(s) for s in self.shapes_for(first)]
        sizes += [numel(shape) for shape, _ in self.meta_outputs(tuple(int(d) for d in first)) or []]
        return max(sizes, default=0)

    def _within(self, shape: list[int], dims: Sequence[int], cap: int) -> list[int]:
        """`shape` with its largest variable dims halved until every input and output holds at most `cap`."""
        shape = list(shape)
        largest = self.largest_tensor(shape)
        while largest > cap:
            movable = [d for d in dims if shape[d] > 1]
            if not movable:
                break
            d = max(movable, key=lambda i: shape[i])
            smaller = [halve(n) if i == d else n for i, n in enumerate(shape)]
            if self.largest_tensor(smaller) >= largest:
                break  # the largest tensor does not follow input 0's dims (a fixed weight): keep the shape
            shape, largest = smaller, self.largest_tensor(smaller)
        return shape

    def accepts(self, first: Sequence[int]) -> bool:
        """Whether the module's forward runs when input 0 has shape `first` (meta device)."""
        return self.meta_outputs(tuple(int(d) for d in first)) is not None

    def output_bytes(self, first: Sequence[int], itemsize: int) -> int:
        """Bytes of the outputs when input 0 has shape `first` (integer outputs at 8 bytes)."""
        outs = self.meta_outputs(tuple(int(d) for d in first)) or []
        return sum(numel(shape) * (itemsize if floating else 8) for shape, floating in outs)

    def meta_outputs(self, first: tuple[int, ...]) -> list[tuple[tuple[int, ...], bool]] | None:
        cache = self._meta_cache
        if first not in cache:
            shapes = self.shapes_for(first)
            args = [torch.empty(s, dtype=_dtype(i.dtype), device="meta") for s, i in zip(shapes, self.inputs)]
            try:
                with torch.no_grad():
                    outs = _tensors(self.copy_for(torch.float32, "meta")(*forward_args(args, self.live_arguments())))
                cache[first] = [(tuple(o.shape), o.is_floating_point()) for o in outs]
                shapes_of = {p.kernel_param: tuple(p.shape) for p in self.params}
                cache[first] += [(shapes_of[kp], True) for kp in self.updated_buffers]
            except Exception:  # noqa: BLE001 - the module refuses these sizes
                cache[first] = None
        return cache[first]

    def library_kinds(self) -> frozenset[str]:
        """The library primitives (convolution, gemm, attention) the forward computes, found by
        running it on the meta device; what a candidate may call the library for (`library.py`)."""
        if self._library_kinds is None:  # one meta run per target
            shapes = self.shapes_for(tuple(self.inputs[0].shape))
            args = [torch.empty(s, dtype=_dtype(i.dtype), device="meta") for s, i in zip(shapes, self.inputs)]
            try:
                module = self.copy_for(torch.float32, "meta")
                kinds = kinds_in_forward(lambda: module(*forward_args(args, self.live_arguments())))
            except Exception:  # noqa: BLE001 - a forward meta cannot run permits no library call
                kinds = frozenset()
            self._library_kinds = kinds
        return self._library_kinds

    def shapes_for(self, key: Sequence[int]) -> list[tuple[int, ...]]:
        """Every input's shape for a case key: input 0's shape (the others follow, see
        `follow_shapes`), or every input's shape one after the other."""
        ranks = self.ranks
        if len(self.inputs) > 1 and len(key) == sum(ranks) and len(key) != ranks[0]:
            out, at = [], 0
            for rank in ranks:
                out.append(tuple(int(d) for d in key[at : at + rank]))
                at += rank
            return out
        return follow_shapes([i.shape for i in self.inputs], self.links, key)

    def trace_shapes(self, max_elements: int) -> list[tuple[int, ...]]:
        """Shapes to trace the computation at: the live ones, input 0's variable dims halved down
        to about `max_elements` and every variable dim of every input at least 2, so that a trace
        keeps it a size (a size-1 dim traces as a broadcast dim, baked)."""
        dims = self.variable_dims[0] if self.variable_dims else ()
        first = trace_sizes(self.inputs[0].shape, dims, max_elements)
        shapes = [list(s) for s in self.shapes_for(first)]
        for group in self.free:
            for index, d in group:
                shapes[index][d] = max(shapes[index][d], 2)
        return [tuple(s) for s in shapes]

    # --- persistence ---
    def to_payload(self) -> dict[str, Any]:
        """The target as JSON-safe data (the module pickled, base64): a profile hands it to the
        workers, which may not share the server's state folder."""
        buffer = io.BytesIO()
        torch.save(self.module.to("cpu"), buffer)
        return {"meta": self._meta(), "module_b64": base64.b64encode(buffer.getvalue()).decode()}

    def _meta(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "module_class": self.module_class,
            "inputs": [asdict(i) for i in self.inputs],
            "params": [asdict(p) for p in self.params],
            "links": [[list(pair) for pair in pairs] for pairs in self.links],
            "source_file": self.source_file,
            "source_module": self.source_module,
            "updated_buffers": list(self.updated_buffers),
            "buffer_steps": [list(pair) for pair in self.buffer_steps],
            "forward_returns_tuple": self.forward_returns_tuple,
            "free": [[list(pair) for pair in group] for group in self.free],
            "calls": [[list(shape) for shape in call] for call in self.calls],
        }

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            torch.save(self.module.to("cpu"), folder / "module.pt")
        except (AttributeError, TypeError, pickle.PicklingError) as exc:
            raise OpenTargetError(
                f"cannot save {self.module_class} for other processes (its class must be importable): {exc}"
            ) from exc
        (folder / "target.json").write_text(json.dumps(self._meta(), indent=1))  # last: marks it complete
        return folder
