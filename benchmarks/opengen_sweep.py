"""Sweep the open author over KernelBench problems on the CPU (Triton's interpreter).

For each problem file: build `Model(*get_init_inputs())` and `get_inputs()` with every size
shrunk (a size maps to its largest divisor under a small cap, so divisibility such as channels by
groups survives; equal sizes stay equal), write the open candidate, check it statically, run its
`entry` against the module's float64 forward at the shrunk shapes and at a second set of shrunk
shapes for the dims the module lets vary, in float32 (and float16 with --fp16).

    .venv/bin/python benchmarks/opengen_sweep.py [--level 1] [--only 23_Softmax,36_RMSNorm_] [--fp16]

Prints one line per problem (supported / unsupported: reason / incorrect / error) and the counts.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import inspect
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from gpuyantra.authors.opengen import OpenSpec, Unsupported, write_open_source  # noqa: E402
from gpuyantra.verifier.static import check_source  # noqa: E402

ROOT = Path("/work/shared/kernelbench")
CAPS = (16, 12, 20, 14, 18, 10, 22, 24, 13, 11)
OTHER_CAPS = (9, 7, 11, 13, 5, 15, 6, 17, 10, 19)
FACTORIES = {"rand", "randn", "randint", "ones", "zeros", "empty", "full", "rand_like", "randn_like"}
PER_PROBLEM_S = 240


def largest_divisor(size: int, cap: int) -> int:
    if size <= cap:
        return size
    return max(d for d in range(2, cap + 1) if size % d == 0) if any(size % d == 0 for d in range(2, cap + 1)) else cap


def size_map(sizes: Sequence[int], caps: Sequence[int], keep: set[int] = frozenset()) -> dict[int, int]:  # type: ignore[assignment]
    distinct = sorted({s for s in sizes if s > 2 and s not in keep}, reverse=True)
    return {s: largest_divisor(s, caps[i % len(caps)]) for i, s in enumerate(distinct)}


class Shrink(torch.overrides.TorchFunctionMode):
    """Rewrites the size arguments of tensor factories (and randint's bound) through `mapping`."""

    def __init__(self, mapping: dict[int, int]):
        super().__init__()
        self.mapping = mapping

    def _size(self, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return self.mapping.get(value, value)
        if isinstance(value, (tuple, list, torch.Size)):
            return (
                type(value)(self._size(v) for v in value)
                if not isinstance(value, torch.Size)
                else tuple(self._size(v) for v in value)
            )
        return value

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in FACTORIES and not name.endswith("_like"):
            if name == "randint":
                args = tuple(self._size(a) for a in args)
            elif name == "full":
                args = (self._size(args[0]), *args[1:])
            else:
                args = tuple(self._size(a) for a in args)
            if "size" in kwargs:
                kwargs["size"] = self._size(kwargs["size"])
            if "high" in kwargs:
                kwargs["high"] = self._size(kwargs["high"])
        return func(*args, **kwargs)


def load_problem(path: Path) -> ModuleType:
    name = f"kb_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def shapes_on_meta(problem: ModuleType) -> list[int]:
    with torch.device("meta"):
        inputs = problem.get_inputs()
    sizes = [int(s) for t in inputs if isinstance(t, torch.Tensor) for s in t.shape]
    sizes += [int(v) for v in _ints(problem.get_init_inputs())]
    return sizes


def _ints(values: Any) -> list[int]:
    out: list[int] = []
    for v in values if isinstance(values, (list, tuple)) else [values]:
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += _ints(v)
    return out


def _map_init(values: Any, mapping: dict[int, int]) -> Any:
    if isinstance(values, bool):
        return values
    if isinstance(values, int):
        return mapping.get(values, values)
    if isinstance(values, list):
        return [_map_init(v, mapping) for v in values]
    if isinstance(values, tuple):
        return tuple(_map_init(v, mapping) for v in values)
    return values


def build(problem: ModuleType, mapping: dict[int, int]) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    init = _map_init(problem.get_init_inputs(), mapping)
    model = problem.Model(*init).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    with Shrink(mapping):
        inputs = problem.get_inputs()
    return model, [t for t in inputs]


def input_names(model: torch.nn.Module, n: int) -> tuple[str, ...]:
    params = [
        p.name
        for p in inspect.signature(model.forward).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    names = [p if p.isidentifier() else f"x{i}" for i, p in enumerate(params[:n])]
    return tuple(names + [f"x{i}" for i in range(len(names), n)])


def bindings(model: torch.nn.Module) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    tensors = tuple(
        (path.replace(".", "_"), path)
        for path, t in list(model.named_parameters()) + list(model.named_buffers())
        if t.is_floating_point()
    )
    floats = []
    for prefix, sub in model.named_modules():
        for attr, value in vars(sub).items():
            if attr.startswith("_") or attr == "training" or isinstance(value, bool) or not isinstance(value, float):
                continue
            path = f"{prefix}.{attr}" if prefix else attr
            floats.append((path.replace(".", "_"), path))
    return tensors, tuple(floats)


def resolve(module: torch.nn.Module, path: str) -> Any:
    obj: Any = module
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def import_source(source: str, tag: str) -> ModuleType:
    folder = tempfile.mkdtemp(prefix="opengen_")
    path = Path(folder) / f"{tag}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(tag, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[tag] = module
    spec.loader.exec_module(module)
    return module


def compare(
    entry: Callable[..., Any],
    model: torch.nn.Module,
    inputs: list[torch.Tensor],
    kw: dict[str, Any],
    dtype: torch.dtype,
) -> str | None:
    """None when entry matches the float64 forward (and the native dtypes), else what differs."""
    cast = [t.to(dtype) if t.is_floating_point() else t for t in inputs]
    native_model = copy.deepcopy(model).to(dtype)
    native_kw = {
        k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in kw.items()
    }
    out = entry(*cast, **native_kw)
    with torch.no_grad():
        native = native_model(*cast)
        ref = copy.deepcopy(model).double()(*[t.double() if t.is_floating_point() else t for t in cast])
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    natives = list(native) if isinstance(native, (tuple, list)) else [native]
    refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    if len(outs) != len(refs):
        return f"{len(outs)} outputs, expected {len(refs)}"
    rtol, atol = (1e-4, 1e-5) if dtype == torch.float32 else (2e-2, 2e-3)
    for o, n, r in zip(outs, natives, refs):
        if tuple(o.shape) != tuple(r.shape) or o.dtype != n.dtype:
            return f"shape/dtype {tuple(o.shape)} {o.dtype}, expected {tuple(r.shape)} {n.dtype}"
        if not o.dtype.is_floating_point:
            if not torch.equal(o.long(), r.long()):
                return "integer outputs differ"
            continue
        scale = max(1.0, float(r.abs().max())) if r.numel() else 1.0
        err = (o.double() - r).abs()
        bad = err > atol * scale + rtol * r.abs()
        if bool(bad.any()):
            return f"max error {float(err.max()):.3g} (scale {scale:.3g})"
    return None


def sweep_one(path: Path, fp16: bool) -> tuple[str, str]:
    problem = load_problem(path)
    sizes = shapes_on_meta(problem)
    mapping = size_map(sizes, CAPS)
    model, inputs = build(problem, mapping)
    tp, fp = bindings(model)
    names = input_names(model, len(inputs))
    spec = OpenSpec(f"open.{path.stem.lower()}", model, names, tuple(inputs), tp, fp)
    try:
        source = write_open_source(spec)
    except Unsupported as exc:
        return "unsupported", str(exc)
    report = check_source(source, f"{path.stem}.py", None)
    if report.failures:
        return "incorrect", "static: " + "; ".join(f.message for f in report.failures)[:300]
    module = import_source(source, f"cand_{path.stem}")
    kw = {kp: resolve(model, attr) for kp, attr in tp + fp}
    dtypes = [torch.float32] + ([torch.float16] if fp16 else [])
    other = _other_inputs(problem, sizes, mapping, model, inputs)
    for dtype in dtypes:
        for ins in [inputs, *other]:
            problem_text = compare(module.entry, model, ins, kw, dtype)
            if problem_text:
                shape = [list(t.shape) for t in ins]
                return "incorrect", f"{dtype} at {shape}: {problem_text}"
    checked = f"{len(other) + 1} shape sets" + (", fp16" if fp16 else "")
    return "supported", checked


def _other_inputs(
    problem: ModuleType, sizes: list[int], mapping: dict[int, int], model: torch.nn.Module, inputs: list[torch.Tensor]
) -> list[list[torch.Tensor]]:
    """Inputs at other shrunk sizes for the sizes the model's own init does not fix."""
    fixed = set(_ints(problem.get_init_inputs()))
    second = size_map(sizes, OTHER_CAPS, keep=fixed)
    merged = {**mapping, **second}
    if merged == mapping:
        return []
    with Shrink(merged):
        torch.manual_seed(1)
        other = problem.get_inputs()
    try:
        with torch.no_grad():
            model(*other)
    except Exception:  # noqa: BLE001 - the model ties these sizes together: no second set
        return []
    if [t.shape for t in other] == [t.shape for t in inputs]:
        return []
    return [other]


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated problem stems")
    parser.add_argument("--fp16", action="store_true", help="also check float16")
    parser.add_argument("--verbose", action="store_true", help="tracebacks for errors")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    files = sorted((ROOT / f"level{args.level}").glob("*.py"), key=lambda p: int(p.stem.split("_")[0]))
    if args.only:
        wanted = set(args.only.split(","))
        files = [f for f in files if f.stem in wanted]
    counts: dict[str, int] = {}
    signal.signal(signal.SIGALRM, _alarm)
    start = time.time()
    for path in files:
        t0 = time.time()
        signal.alarm(PER_PROBLEM_S)
        try:
            status, detail = sweep_one(path, args.fp16)
        except _Timeout:
            status, detail = "error", f"timed out after {PER_PROBLEM_S}s"
        except Exception as exc:  # noqa: BLE001 - one problem's failure is reported, the sweep goes on
            status, detail = "error", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            if args.verbose:
                traceback.print_exc()
        finally:
            signal.alarm(0)
        counts[status] = counts.get(status, 0) + 1
        print(f"{path.stem:70s} {status:12s} {time.time() - t0:6.1f}s  {detail}", flush=True)
    total = sum(counts.values())
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"\n{total} problems in {time.time() - start:.0f}s: {summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
