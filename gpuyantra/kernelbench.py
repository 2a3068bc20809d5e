"""Run gpuyantra's optimize loop on KernelBench-format problems (docs/CONTRACTS.md section 3, `kernelbench`).

A KernelBench problem (ScalingIntelligence/KernelBench) is one `.py` file defining
`class Model(nn.Module)`, built as `Model(*get_init_inputs())` and called as `model(*get_inputs())`.
For each problem file this module:

1. loads it from disk (importlib, under a private module name), builds the model and its inputs
   (the same seed every time). On CPU, problems whose inputs exceed `max_elements` are skipped for
   size *before* their inputs are allocated (their shapes are read on the `meta` device); nothing in
   the problem is ever shrunk.
2. binds an op family **by computation**: for every registered family with as many activations as
   the problem has inputs, the family's parameters are read from the model's attributes
   (`family.default_adapter(model)`), and `family.reference(*inputs, **params)` must equal
   `model(*inputs)` on (a) a float64 copy with the model's own parameters and the problem's
   inputs, (b) a float64 copy with freshly randomized parameters (never weight = 1) and a second,
   differently scaled input draw, (c) the model as is, at its dtype, within the family's tolerance
   and with the same output dtype. No family agrees -> "unsupported", which is the honest answer
   for most KernelBench problems (matmuls, convolutions, fused graphs...).
3. runs the optimize loop: the configured author writes `OUT/<problem>/candidate_<i>.py`, the
   verifier judges it; the loop stops at the device's ceiling reward (+3 on CUDA, +1 on CPU where
   speed is not judged), when the author repeats itself, or after `max_iterations`.
4. writes `OUT/<problem>/ModelNew.py`: the problem's source verbatim, then
   `class ModelNew(Model)` (same `__init__` signature, same parameters and state) whose `forward`
   calls the best candidate's `entry` on the activations and the live attributes its ADAPTER
   names. The candidate is imported from the real `.py` file next to ModelNew.py (Triton reads
   kernel source with `inspect`), and kernelbench checks ModelNew against Model on 5 fresh input
   draws at the family's tolerance. On CUDA both are timed (median of `triton.testing.do_bench`).
5. reports fast_0 / fast_1 / fast_2 as KernelBench defines them: the fraction of *all* problems
   whose ModelNew is correct and, for fast_p, more than p times faster than Model. On CPU speed is
   not measured, so fast_1 / fast_2 are None.

Verifier binding: the verifier imports `module_class` in its own process (its sandbox child never
imports it) and checks the ADAPTER's attributes on a meta-device instance built with tiny sizes. The
problem's module stays registered in sys.modules under its private name, so the candidate is
verified against the problem's own `Model` whenever that instance builds (`Model(64)`, `Model()`);
otherwise against the family's default module class, with a verification copy of the candidate
whose ADAPTER is that class's (`candidate_<i>.verify.py`, identical kernel code). Either way the
binding to the real `Model` is also checked here (steps 2 and 4).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import inspect
import json
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from gpuyantra.candidate import import_file
from gpuyantra.ops import OpFamily, all_ops
from gpuyantra.ops.base import adapter_kwargs, as_tuple, import_class, numel, outputs_close
from gpuyantra.ops.open.spec import halve

# On CPU, kernels run in Triton's interpreter: inputs above this many elements are reduced (the
# same problem with its variable dims halved down to REDUCED_ELEMENTS per input), or skipped.
CPU_MAX_ELEMENTS = 4 * 1024 * 1024
REDUCED_ELEMENTS = 1 << 16
# Binding probes (float64 copies of model and inputs) run on at most this many elements of input 0.
PROBE_ELEMENTS = 1 << 20
DEFAULT_MAX_ITERATIONS = 4
FP64_TOLERANCE = (1e-8, 1e-6)  # (atol, rtol) for the float64 binding probes
CHECK_DRAWS = 5
SEED = 42
CEILING = {"cpu": 1, "cuda": 3}

STATUSES = ("optimized", "incorrect", "rejected", "unsupported", "skipped", "error")


class KernelBenchError(Exception):
    """PATH cannot be read or holds no problem files."""


@dataclass
class Attempt:
    iteration: int
    candidate: str
    strategy: dict[str, Any]
    reward: int
    accepted: bool
    failures: list[dict[str, str]] = field(default_factory=list)
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    timings: dict[str, float] = field(default_factory=dict)  # the verdict's seconds per layer


@dataclass
class ProblemResult:
    name: str
    path: str
    op: str | None = None
    status: str = "error"
    correct: bool = False
    speedup: float | None = None
    reward: int | None = None
    model_new: str | None = None
    reason: str = ""
    adapter: list[dict[str, str]] | None = None
    shapes: list[list[int]] = field(default_factory=list)
    dtype: str | None = None
    model_us: float | None = None
    model_new_us: float | None = None
    speedup_vs_best: float | None = None  # against the better of eager and torch.compile (CUDA)
    max_abs_err: float | None = None
    attempts: list[Attempt] = field(default_factory=list)
    verified_against: str | None = None
    reduced: str | None = None  # "live shape -> reduced shape" when run on reduced sizes
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per stage of the run

    @contextlib.contextmanager
    def phase(self, name: str) -> Any:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = round(self.phases.get(name, 0.0) + time.perf_counter() - started, 3)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        ordered = {
            key: data.pop(key)
            for key in ("name", "op", "status", "correct", "speedup", "reward", "model_new", "reason")
        }
        ordered.update(data)
        return ordered


@dataclass
class RunResult:
    device: str
    out: str
    problems: list[ProblemResult]
    fast_0: float | None
    fast_1: float | None
    fast_2: float | None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "problems": [p.to_dict() for p in self.problems],
            "fast_0": self.fast_0,
            "fast_1": self.fast_1,
            "fast_2": self.fast_2,
            "out": self.out,
            "note": self.note,
        }


@dataclass
class Problem:
    """A loaded problem file: its module, model, inputs (on the run's device)."""

    module: ModuleType
    model: torch.nn.Module
    inputs: list[Any]


# ---------------------------------------------------------------------------------------------
# Finding and loading problems


def find_problems(path: str | Path) -> list[tuple[str, Path]]:
    """(name, file) for PATH: one `.py` file, or every `.py` file under a folder (sorted)."""
    path = Path(path)
    if not path.exists():
        raise KernelBenchError(f"{path} does not exist")
    if path.is_file():
        if path.suffix != ".py":
            raise KernelBenchError(f"{path} is not a .py file")
        return [(path.stem, path)]
    if not path.is_dir():
        raise KernelBenchError(f"{path} is neither a file nor a folder")
    try:
        files = sorted(
            p
            for p in path.rglob("*.py")
            if p.is_file()
            and p.name != "__init__.py"
            and not any(part.startswith((".", "__pycache__")) for part in p.relative_to(path).parts)
        )
    except OSError as exc:
        raise KernelBenchError(f"cannot read {path}: {exc}") from exc
    if not files:
        raise KernelBenchError(f"{path} holds no .py problem files")
    return [(p.relative_to(path).with_suffix("").as_posix(), p) for p in files]


def safe_name(name: str) -> str:
    """A folder path for a problem name: path parts kept, odd characters replaced."""
    parts = [re.sub(r"[^A-Za-z0-9_.-]", "_", part).lstrip(".") or "_" for part in name.split("/")]
    return "/".join(parts)


def load_module(file: Path) -> ModuleType:
    """Import the problem file under a private name (registered in sys.modules while it runs)."""
    source = file.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    module_name = f"gpuyantra_kernelbench_{re.sub(r'[^A-Za-z0-9_]', '_', file.stem)}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    return import_file(file, module_name)


def check_problem_module(module: ModuleType) -> str | None:
    """Why the module is not a KernelBench problem, or None when it is one."""
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(module, n)]
    if missing:
        return f"not a KernelBench problem: defines no {', '.join(missing)}"
    if not (inspect.isclass(module.Model) and issubclass(module.Model, torch.nn.Module)):
        return "not a KernelBench problem: Model is not an nn.Module subclass"
    return None


def input_elements(module: ModuleType) -> int | None:
    """Elements of get_inputs()'s tensors, from a call on the meta device (nothing allocated);
    None when get_inputs cannot run there."""
    try:
        with torch.device("meta"):
            inputs = list(module.get_inputs())
    except Exception:  # noqa: BLE001 - e.g. numpy-made inputs: the caller measures the real ones
        return None
    return sum(t.numel() for t in inputs if isinstance(t, torch.Tensor))


def parameter_elements(module: ModuleType) -> int | None:
    """Elements of Model's parameters and buffers, built on the meta device; None when it cannot be."""
    try:
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs())
    except Exception:  # noqa: BLE001 - the caller measures the real model
        return None
    return sum(t.numel() for t in [*model.parameters(), *model.buffers()])


def to_device(value: Any, device: str) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def make_inputs(
    module: ModuleType, device: str, seed: int, sizes: dict[tuple[int, ...], tuple[int, ...]] | None = None
) -> list[Any]:
    """The problem's own get_inputs(); with `sizes`, its factories draw the reduced shapes.

    On CUDA the factories draw on the GPU itself (`torch.device` as the default): a KernelBench
    input of a billion elements takes seconds to draw on the host and copy over, and the problem is
    drawn several times (inputs, ModelNew checks, timing)."""
    torch.manual_seed(seed)
    where = torch.device(device) if device != "cpu" else contextlib.nullcontext()
    if not sizes:
        with where:
            return [to_device(v, device) for v in module.get_inputs()]
    from gpuyantra.ops.open import ShrinkFactories

    with ShrinkFactories(sizes), where:
        return [to_device(v, device) for v in module.get_inputs()]


def plan_reduced_sizes(
    module: ModuleType, model: torch.nn.Module, cap: int
) -> tuple[dict[tuple[int, ...], tuple[int, ...]] | None, str]:
    """({live shape: reduced shape}, why) for a problem whose inputs are too large for the CPU
    interpreter: the dims the Model accepts changing are halved until each input holds at most
    `cap` elements. (None, why not) when that cannot be done."""
    from gpuyantra.ops.open import OpenInput, dim_links, reduced_shapes

    try:
        with torch.device("meta"):
            meta_inputs = list(module.get_inputs())
    except Exception as exc:  # noqa: BLE001
        return None, f"get_inputs() cannot run on the meta device to read its shapes ({type(exc).__name__})"
    if not meta_inputs or not all(isinstance(t, torch.Tensor) for t in meta_inputs):
        return None, "the problem has non-tensor inputs"
    specs = [OpenInput(f"x{i}", tuple(t.shape), str(t.dtype).replace("torch.", "")) for i, t in enumerate(meta_inputs)]
    links = dim_links(model, specs)
    live = [s.shape for s in specs]
    shapes = reduced_shapes(live, links, cap)
    if shapes is None:
        dims = [[own for own, _ in pairs] for pairs in links]
        return None, f"its fixed dims alone exceed {cap:,} elements (variable dims per input: {dims})"
    shapes = _same_live_same_reduced(live, shapes, links, cap)
    sizes = {tuple(a): tuple(b) for a, b in zip(live, shapes) if tuple(a) != tuple(b)}
    return sizes, ", ".join(f"{list(a)} -> {list(b)}" for a, b in sizes.items())


def _same_live_same_reduced(
    live: Sequence[Sequence[int]],
    shapes: Sequence[Sequence[int]],
    links: Sequence[Sequence[tuple[int, int]]],
    cap: int,
) -> list[tuple[int, ...]]:
    """The factories are resized by the shape they were asked for, so inputs drawn with the same
    live shape (a square matmul's A and B) get one reduced shape: when the per-input reductions
    differ, every variable dim of the group is halved together until each holds at most `cap`."""
    out = [tuple(int(d) for d in s) for s in shapes]
    for shape in {tuple(s) for s in live}:
        group = [i for i, s in enumerate(live) if tuple(s) == shape]
        if len({out[i] for i in group}) <= 1:
            continue
        dims = sorted({own for i in group for own, _ in links[i]} | {d for i in group for d in _moved(live[i], out[i])})
        common = [int(d) for d in shape]
        while numel(common) > cap and any(common[d] > 1 for d in dims):
            common = [halve(n) if d in dims else n for d, n in enumerate(common)]
        for i in group:
            out[i] = tuple(common)
    return out


def _moved(live: Sequence[int], reduced: Sequence[int]) -> list[int]:
    return [d for d, (a, b) in enumerate(zip(live, reduced)) if a != b]


def build_model(module: ModuleType, cls: type, device: str, seed: int = SEED) -> torch.nn.Module:
    torch.manual_seed(seed)
    return cls(*module.get_init_inputs()).to(device)


# ---------------------------------------------------------------------------------------------
# Binding an op family by computation


def _double(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64)
    return value


def _agrees(
    model: torch.nn.Module,
    family: OpFamily,
    adapter: list[dict[str, str]],
    inputs: Sequence[Any],
    atol: float,
    rtol: float,
) -> bool:
    try:
        with torch.no_grad():
            got = model(*inputs)
            want = family.reference(*inputs, **adapter_kwargs(model, adapter))
    except Exception:  # noqa: BLE001 - the family's math does not run on these inputs: no match
        return False
    got_t, want_t = as_tuple(got), as_tuple(want)
    if len(got_t) != len(want_t) or any(
        not isinstance(g, torch.Tensor) or not isinstance(w, torch.Tensor) or g.dtype != w.dtype
        for g, w in zip(got_t, want_t)
    ):
        return False
    return outputs_close(got, want, atol=atol, rtol=rtol)


def family_matches(
    model: torch.nn.Module,
    family: OpFamily,
    adapter: list[dict[str, str]],
    inputs: Sequence[torch.Tensor],
    seed: int = SEED,
) -> bool:
    """True when `model(*inputs)` computes `family`'s reference with the adapter's attributes."""
    from gpuyantra.binding import randomize_parameters

    # (a) float64, the model's own parameters, the problem's inputs.
    try:
        own = copy.deepcopy(model).to(torch.float64)
    except Exception:  # noqa: BLE001 - a model that cannot be copied cannot be probed
        return False
    inputs64 = [_double(x) for x in inputs]
    if not _agrees(own, family, adapter, inputs64, *FP64_TOLERANCE):
        return False
    # (b) float64, randomized parameters (away from 0 and 1), a second input draw scaled differently.
    randomize_parameters(own, torch.Generator().manual_seed(seed + 1))
    generator = torch.Generator().manual_seed(seed + 2)
    redraw = [
        torch.randn(x.shape, generator=generator, dtype=torch.float64).mul_(3.0).add_(0.25).to(x.device)
        for x in inputs64
    ]
    if not _agrees(own, family, adapter, redraw, *FP64_TOLERANCE):
        return False
    # (c) the model as it is, at its dtype: output dtype and rounding must match the family's.
    dtype = inputs[0].dtype
    atol, rtol = family.tolerance(dtype)
    return _agrees(model, family, adapter, inputs, 2 * atol, 2 * rtol)


def probe_inputs(model: torch.nn.Module, inputs: Sequence[Any], max_elements: int = PROBE_ELEMENTS) -> list[Any]:
    """The problem's inputs cut to their first rows when large (every input whose dim 0 is input 0's
    is cut alike), if the Model still runs on them; else the inputs as they are."""
    from gpuyantra.ops.open import leading_rows

    small = leading_rows(inputs, max_elements)
    if small is inputs:
        return list(inputs)
    try:
        with torch.no_grad():
            model(*small)
    except Exception:  # noqa: BLE001 - dim 0 is not free: bind on the full inputs
        return list(inputs)
    return list(small)


def bind_open_target(
    model: torch.nn.Module, inputs: Sequence[Any], file: Path, module: ModuleType, result: ProblemResult
) -> tuple[OpFamily, list[dict[str, str]]] | None:
    """An open target whose reference is the problem's own Model, registered (and saved) for the
    verifier; None (with the reason in `result`) when the Model cannot be one."""
    from gpuyantra.ops.open import OpenTargetError, build_open_target, register_open

    try:
        target = build_open_target(
            model, inputs, name_hint=file.stem, source_file=str(file.resolve()), source_module=module.__name__
        )
        family = register_open(target)
    except OpenTargetError as exc:
        result.status, result.reason = "unsupported", f"unsupported: {exc}"
        return None
    return family, target.adapter


def bind_family(
    model: torch.nn.Module, inputs: Sequence[Any], families: Sequence[OpFamily] | None = None
) -> tuple[OpFamily, list[dict[str, str]]] | None:
    """The first registered family the model computes (and its ADAPTER), or None."""
    if not inputs or not all(isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs):
        return None
    for family in families if families is not None else all_ops():
        if len(family.activations) != len(inputs):
            continue
        try:
            adapter = family.default_adapter(model)
        except LookupError:
            continue
        if family_matches(model, family, adapter, inputs):
            return family, adapter
    return None


# ---------------------------------------------------------------------------------------------
# Writing and checking ModelNew.py


def _forward_params(model_cls: type[torch.nn.Module], n_inputs: int) -> list[str] | None:
    """Model.forward's argument names when they are plain positional names, else None."""
    try:
        params = list(inspect.signature(model_cls.forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if len(params) != n_inputs or any(
        p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD or not p.name.isidentifier() or p.name.startswith("_gy_")
        for p in params
    ):
        return None
    return [p.name for p in params]


def model_new_source(
    problem_source: str,
    problem_path: Path,
    candidate_file: Path,
    op: str,
    adapter: list[dict[str, str]],
    forward_args: list[str] | None,
    reward: int | None,
) -> str:
    """ModelNew.py: the problem's source verbatim, then ModelNew(Model) calling the kernel's entry."""
    candidate_source = candidate_file.read_bytes()
    digest = hashlib.sha256(candidate_source).hexdigest()[:16]
    args = ", ".join(forward_args) if forward_args else "*inputs"
    call_args = ", ".join(forward_args) if forward_args else "*inputs"
    kwargs = "".join(f", {b['kernel_param']}=self.{b['module_attr']}" for b in adapter)
    adapter_text = ", ".join(f"{b['kernel_param']} <- self.{b['module_attr']}" for b in adapter) or "none"
    header = (
        f"# ModelNew for the KernelBench problem {problem_path.name}, written by `gpuyantra kernelbench`.\n"
        f"# op family: {op}; kernel: {candidate_file.name} (a gpuyantra candidate file, loaded from disk next\n"
        f"# to this file); verifier reward: {reward if reward is not None else 'n/a'}.\n"
        "# The problem's source follows verbatim (Model, get_inputs, get_init_inputs). ModelNew subclasses\n"
        "# Model: same __init__ signature, parameters and state; its forward calls the kernel.\n"
        f"# ---- problem source: {problem_path.name} ----\n"
    )
    footer = f'''
# ---- end of problem source ----

import importlib.util as _gy_importlib_util
import os as _gy_os
import sys as _gy_sys

import torch as _gy_torch

_GY_CANDIDATE_FILE = {candidate_file.name!r}
_GY_CANDIDATE_PATH = {str(candidate_file.resolve())!r}  # where it was written, if this file moved alone
_GY_CANDIDATE_DIGEST = {digest!r}


def _gy_load_kernel():
    """Import the candidate kernel file (a real .py file: Triton reads kernel source with inspect)."""
    here = globals().get("__file__")
    paths = [_gy_os.path.join(_gy_os.path.dirname(_gy_os.path.abspath(here)), _GY_CANDIDATE_FILE)] if here else []
    paths.append(_GY_CANDIDATE_PATH)
    path = next((p for p in paths if _gy_os.path.isfile(p)), None)
    if path is None:
        raise FileNotFoundError(f"kernel file {{_GY_CANDIDATE_FILE}} not found in {{paths}}")
    if not _gy_torch.cuda.is_available():
        _gy_os.environ.setdefault("TRITON_INTERPRET", "1")  # no GPU: Triton kernels run in its interpreter
    name = f"gpuyantra_kernelbench_kernel_{{_GY_CANDIDATE_DIGEST}}"
    module = _gy_sys.modules.get(name)
    if module is None:
        spec = _gy_importlib_util.spec_from_file_location(name, path)
        module = _gy_importlib_util.module_from_spec(spec)
        _gy_sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            _gy_sys.modules.pop(name, None)
            raise
    return module


_gy_kernel = _gy_load_kernel()


class ModelNew(Model):
    """Model with its forward computed by the gpuyantra {op} Triton kernel."""

    def forward(self, {args}):
        # the kernel's ADAPTER, bound to this module's live attributes: {adapter_text}
        return _gy_kernel.entry({call_args}{kwargs})
'''
    body = problem_source if problem_source.endswith("\n") else problem_source + "\n"
    return header + body + footer


def load_model_new(path: Path) -> ModuleType:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    name = f"gpuyantra_kernelbench_modelnew_{re.sub(r'[^A-Za-z0-9_]', '_', path.parent.name)}_{digest}"
    return import_file(path, name)


def check_model_new(
    problem_module: ModuleType,
    model_new_path: Path,
    family: OpFamily,
    device: str,
    draws: int = CHECK_DRAWS,
    sizes: dict[tuple[int, ...], tuple[int, ...]] | None = None,
) -> tuple[bool, str, float | None, tuple[torch.nn.Module, torch.nn.Module]]:
    """(correct, reason, max_abs_err, (model, model_new)): ModelNew vs Model on `draws` input draws."""
    new_module = load_model_new(model_new_path)
    model = build_model(problem_module, problem_module.Model, device)
    model_new = build_model(problem_module, new_module.ModelNew, device)
    own, new = model.state_dict(), model_new.state_dict()
    if list(own) != list(new) or any(own[k].shape != new[k].shape or not torch.equal(own[k], new[k]) for k in own):
        return False, "ModelNew's parameters/state differ from Model's", None, (model, model_new)
    worst = 0.0
    for draw in range(draws):
        inputs = make_inputs(problem_module, device, SEED + 1000 + draw, sizes)
        with torch.no_grad():
            want = model(*inputs)
            got = model_new(*inputs)
        want_t, got_t = as_tuple(want), as_tuple(got)
        if len(want_t) != len(got_t) or any(g.shape != w.shape or g.dtype != w.dtype for g, w in zip(got_t, want_t)):
            return (
                False,
                (f"draw {draw}: ModelNew returned {_describe(got)} where Model returns {_describe(want)}"),
                None,
                (model, model_new),
            )
        atol, rtol = family.tolerance(want_t[0].dtype)
        close = True
        for g, w in zip(got_t, want_t):
            err, within = compare_chunked(g, w, atol, rtol) if isinstance(g, torch.Tensor) else (0.0, g == w)
            worst, close = max(worst, err), close and bool(within)
        del want, got, want_t, got_t, inputs
        if not close:
            return (
                False,
                (
                    f"draw {draw}: ModelNew differs from Model beyond the {family.name} tolerance "
                    f"(atol {atol:g}, rtol {rtol:g}; max abs err {worst:.3g})"
                ),
                worst,
                (model, model_new),
            )
    return True, f"ModelNew matches Model on {draws} input draws (max abs err {worst:.3g})", worst, (model, model_new)


COMPARE_CHUNK = 2**24  # elements compared in float64 at once: a multi-GB output is never copied whole


def compare_chunked(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> tuple[float, bool]:
    """(max abs error, every element within atol + rtol·|want|, NaN where NaN), in float64 chunks."""
    flat_got, flat_want = got.reshape(-1), want.reshape(-1)
    worst, close = 0.0, True
    for start in range(0, flat_got.numel(), COMPARE_CHUNK):
        g = flat_got[start : start + COMPARE_CHUNK].double()
        w = flat_want[start : start + COMPARE_CHUNK].double()
        worst = max(worst, float((g - w).abs().nan_to_num(float("inf")).max()))
        close = close and torch.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    return worst, close


def _describe(value: Any) -> str:
    return ", ".join(
        f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" if isinstance(t, torch.Tensor) else type(t).__name__
        for t in as_tuple(value)
    )


def time_cuda_us(fn: Callable[[], Any]) -> float:
    """Median time of `fn` in microseconds (triton.testing.do_bench: CUDA events, cache flushed)."""
    import triton.testing

    with torch.no_grad():
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    return float(ms) * 1000.0


# ---------------------------------------------------------------------------------------------
# The optimize loop


def _verifier() -> Callable[..., Any]:
    from gpuyantra.verifier import verify

    return verify


def _verification_copy(source: str, adapter: list[dict[str, str]]) -> str:
    """The candidate's source with its ADAPTER replaced (kernel code unchanged)."""
    text = "ADAPTER = [\n" + "".join(f"    {json.dumps(b)},\n" for b in adapter) + "]\n"
    replaced, count = re.subn(r"^ADAPTER\s*=\s*\[.*?^\]\n", lambda _: text, source, count=1, flags=re.S | re.M)
    if count == 0:  # one-line or unusual ADAPTER: append an override (the last assignment wins)
        replaced = source + ("" if source.endswith("\n") else "\n") + f"ADAPTER = {json.dumps(adapter)}\n"
    return replaced


def default_module_adapter(family: OpFamily) -> list[dict[str, str]] | None:
    try:
        return family.default_adapter(import_class(family.default_module))
    except (LookupError, ValueError):
        return None


def verify_dtypes(dtype: torch.dtype, device: str) -> list[str] | None:
    name = str(dtype).replace("torch.", "")
    if device == "cpu" and name not in ("float32", "float16"):
        return None  # the interpreter's bfloat16 is unreliable: let the verifier choose
    return [name]


def verification_target(
    family: OpFamily, adapter: list[dict[str, str]], model_cls: type, dotted: str
) -> tuple[str | None, list[dict[str, str]] | None, str]:
    """(module_class for verify, ADAPTER for a verification copy or None, a note saying which).

    The verifier imports module_class in its own (parent) process and checks the ADAPTER's
    attributes on a meta-device instance it builds with tiny sizes (`Model(64)`, `Model()`...).
    When that works for the problem's Model (registered in sys.modules under `dotted`), the
    candidate is verified against it as is; otherwise against the family's default module, with a
    copy of the candidate whose ADAPTER is that module's (same kernel code)."""
    from gpuyantra.ops.meta import meta_instance

    if family.open_target is not None:
        return None, None, f"verified against the problem's own Model (open target {family.name})"
    meta = meta_instance(model_cls)
    if meta is not None and all(hasattr(meta, b["module_attr"]) for b in adapter):
        return dotted, None, f"verified against the problem's Model ({dotted})"
    verify_adapter = default_module_adapter(family)
    note = (
        f"verified against {family.default_module} (the verifier cannot build the problem's Model "
        f"on the meta device); the Model binding is checked by kernelbench"
    )
    return None, (verify_adapter if verify_adapter is not None and verify_adapter != adapter else None), note


def optimize(
    family: OpFamily,
    adapter: list[dict[str, str]],
    model_cls: type,
    dotted: str,
    shapes: list[list[int]],
    dtype: torch.dtype,
    device: str,
    folder: Path,
    max_iterations: int,
    log: Callable[[str], None],
) -> tuple[list[Attempt], Attempt | None, str, str]:
    """Write, verify, repeat. Returns (attempts, best accepted attempt or None, why the loop stopped,
    what the candidates were verified against)."""
    from gpuyantra.authors import Attempt as AuthorAttempt
    from gpuyantra.authors import WriteRequest, get_author
    from gpuyantra.hardware import hardware_class

    verify = _verifier()
    author = get_author()
    hardware = hardware_class(device)
    module_class, verify_adapter, verified_against = verification_target(family, adapter, model_cls, dotted)
    ceiling = CEILING.get(device, 3)
    dtypes = verify_dtypes(dtype, device)
    attempts: list[Attempt] = []
    history: list[AuthorAttempt] = []
    best: Attempt | None = None
    stop = f"--max-iterations {max_iterations} reached"
    for iteration in range(1, max_iterations + 1):
        request = WriteRequest(
            op=family.name,
            module_class=model_cls.__name__,
            adapter=adapter,
            shapes=shapes,
            dtype=str(dtype).replace("torch.", ""),
            hardware=hardware,
            history=history,
            iteration=iteration,
        )
        try:
            written = author.write(request)
        except Exception as exc:  # noqa: BLE001 - an author that cannot write this problem ends its loop, not the run
            why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            stop = f"the {getattr(author, 'name', 'configured')} author cannot write {family.name}: {why}"
            break
        if any(a.strategy == written.strategy for a in attempts):
            stop = f"the author's strategies are exhausted after {len(attempts)} candidates"
            break
        path = folder / f"candidate_{iteration}.py"
        path.write_text(written.source)
        verify_path = path
        if verify_adapter is not None:
            verify_path = folder / f"candidate_{iteration}.verify.py"
            verify_path.write_text(_verification_copy(written.source, verify_adapter))
        verdict = verify(verify_path, device=device, module_class=module_class, shapes=shapes, dtypes=dtypes)
        failures = [f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in verdict.failures]
        attempt = Attempt(
            iteration=iteration,
            candidate=str(path),
            strategy=dict(written.strategy),
            reward=int(verdict.reward),
            accepted=bool(verdict.accepted),
            failures=failures,
            speedup_vs_eager=verdict.speedup_vs_eager,
            speedup_vs_compile=verdict.speedup_vs_compile,
            timings=dict(getattr(verdict, "timings", None) or {}),
        )
        attempts.append(attempt)
        history.append(
            AuthorAttempt(
                strategy=dict(written.strategy),
                reward=attempt.reward,
                failures=failures,
                kernel_us=getattr(verdict, "kernel_us", None),
                floor_us=getattr(verdict, "floor_us", None),
            )
        )
        first = f" ({failures[0]['layer']}/{failures[0]['rule']}: {failures[0]['message'][:160]})" if failures else ""
        log(f"  candidate {iteration}: reward {attempt.reward:+d}{first}")
        if attempt.accepted and (best is None or _rank(attempt) > _rank(best)):
            best = attempt
        if attempt.reward >= ceiling:
            stop = f"reached the {device} ceiling reward {ceiling:+d}"
            break
    return attempts, best, stop, verified_against


def _rank(attempt: Attempt) -> tuple[int, float]:
    return attempt.reward, attempt.speedup_vs_eager or 0.0


# ---------------------------------------------------------------------------------------------
# One problem, a whole run


def run_problem(
    name: str,
    file: Path,
    device: str,
    out: Path,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    max_elements: int | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> ProblemResult:
    started = time.perf_counter()
    result = ProblemResult(name=name, path=str(file))
    try:
        # Problem code may print: keep stdout for the report.
        with contextlib.redirect_stdout(sys.stderr):
            _run_problem(result, file, device, out, max_iterations, max_elements, log)
    except Exception as exc:  # noqa: BLE001 - one broken problem must not stop the run
        result.status, result.correct = "error", False
        result.reason = f"{type(exc).__name__}: {exc}"
        log("".join(traceback.format_exception(exc)).rstrip())
    finally:
        if device == "cuda":  # the next problem (or a shard beside this one) gets the memory back
            gc.collect()
            torch.cuda.empty_cache()
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def _run_problem(
    result: ProblemResult,
    file: Path,
    device: str,
    out: Path,
    max_iterations: int,
    max_elements: int | None,
    log: Callable[[str], None],
) -> None:
    # 1. load
    try:
        module = load_module(file)
    except SyntaxError as exc:
        result.reason = f"cannot load the problem: SyntaxError: {exc.msg} (line {exc.lineno})"
        return
    except BaseException as exc:  # noqa: BLE001 - SystemExit and friends from problem code included
        if isinstance(exc, KeyboardInterrupt):
            raise
        result.reason = f"cannot load the problem: {type(exc).__name__}: {exc}"
        return
    why_not = check_problem_module(module)
    if why_not:
        result.reason = why_not
        return
    sizes: dict[tuple[int, ...], tuple[int, ...]] | None = None
    elements: int | None = None
    params: int | None = None
    if max_elements is not None:
        elements, params = input_elements(module), parameter_elements(module)
        if params is not None and params > max_elements:
            result.status = "skipped"
            result.reason = (
                f"skipped for size: the Model's parameters hold {params:,} elements, over the "
                f"{max_elements:,} cap on {device} (kernels run in Triton's interpreter there); "
                "run on --device cuda or raise --max-elements"
            )
            return
    try:
        model = build_model(module, module.Model, device)
    except Exception as exc:  # noqa: BLE001
        result.reason = f"cannot build the problem's Model: {type(exc).__name__}: {exc}"
        return
    if max_elements is not None and elements is not None and elements + (params or 0) > max_elements:
        # Too large for the interpreter: the same problem at reduced sizes, drawn by its own get_inputs().
        sizes, how = plan_reduced_sizes(module, model, REDUCED_ELEMENTS)
        if sizes is None:
            result.status = "skipped"
            result.reason = (
                f"skipped for size: inputs hold {elements:,} elements, over the {max_elements:,} cap on "
                f"{device}, and they cannot be reduced: {how}; run on --device cuda or raise --max-elements"
            )
            return
        result.reduced = how
        log(f"  {result.name}: inputs reduced for the {device} interpreter: {how}")
    try:
        with result.phase("inputs"):
            inputs = make_inputs(module, device, SEED, sizes)
    except Exception as exc:  # noqa: BLE001
        result.reason = f"cannot build the problem's inputs: {type(exc).__name__}: {exc}"
        return
    if max_elements is not None:
        total = sum(t.numel() for t in inputs if isinstance(t, torch.Tensor))
        total += sum(p.numel() for p in model.parameters())
        if total > max_elements:
            result.status = "skipped"
            result.reason = (
                f"skipped for size: inputs and parameters hold {total:,} elements, over the "
                f"{max_elements:,} cap on {device}; run on --device cuda or raise --max-elements"
            )
            return
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    result.shapes = [list(t.shape) for t in tensors]
    result.dtype = str(tensors[0].dtype).replace("torch.", "") if tensors else None
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as exc:  # noqa: BLE001
        if result.reduced:  # a size the meta device let through and the real op refuses
            result.status = "skipped"
            result.reason = (
                f"skipped for size: over the {max_elements:,} cap on {device}, and the Model refuses its "
                f"reduced inputs ({result.reduced}): {type(exc).__name__}: {exc}; run on --device cuda"
            )
            return
        result.reason = f"the problem's Model does not run on its inputs: {type(exc).__name__}: {exc}"
        return

    # 2. bind by computation: a registered family first, else an open target (the Model itself)
    with result.phase("bind"):
        probe = probe_inputs(model, inputs)  # binding needs values, not the problem's full size
        bound = bind_family(model, probe) or bind_open_target(model, inputs, file, module, result)
    if bound is None:
        return
    family, adapter = bound
    result.op, result.adapter = family.name, adapter
    log(f"  {result.name}: computes {family.name} (ADAPTER {adapter})")

    # 3. optimize
    folder = out / safe_name(result.name)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in [*folder.glob("candidate_*.py"), folder / "ModelNew.py"]:
        stale.unlink(missing_ok=True)  # files of an earlier run of this problem
    shapes, dtype, n_inputs = [list(inputs[0].shape)], inputs[0].dtype, len(inputs)
    # The verifier's sandbox draws its own inputs: give the device memory back before it runs
    # (KernelBench inputs reach several GB each).
    del inputs, probe
    if device == "cuda":
        torch.cuda.empty_cache()
    try:
        with result.phase("optimize"):
            attempts, best, stop, verified_against = optimize(
                family,
                adapter,
                module.Model,
                f"{module.__name__}.Model",
                shapes,
                dtype,
                device,
                folder,
                max_iterations,
                log,
            )
    except ImportError as exc:
        result.reason = f"the verifier is not available: {exc}"
        return
    result.attempts, result.verified_against = attempts, verified_against
    if not attempts:
        result.status, result.reason = "unsupported", f"unsupported: {stop}"
        return
    if best is None:
        result.status = "rejected"
        result.reward = max((a.reward for a in attempts), default=None)
        last = attempts[-1].failures if attempts else []
        why = "; ".join(f"{f['layer']}/{f['rule']}: {f['message']}" for f in last[:2])
        result.reason = f"no candidate passed verification in {len(attempts)} iteration(s); stopped: {stop}" + (
            f" ({why})" if why else ""
        )
        return
    result.reward = best.reward

    # 4. ModelNew.py, checked against Model
    model_new_path = folder / "ModelNew.py"
    model_new_path.write_text(
        model_new_source(
            file.read_text(),
            file,
            Path(best.candidate),
            family.name,
            adapter,
            _forward_params(module.Model, n_inputs),
            best.reward,
        )
    )
    result.model_new = str(model_new_path)
    try:
        with result.phase("check_model_new"):
            correct, why, worst, (model, model_new) = check_model_new(
                module, model_new_path, family, device, sizes=sizes
            )
    except Exception as exc:  # noqa: BLE001 - a ModelNew that does not import or run is not correct
        result.status, result.correct = "incorrect", False
        result.reason = f"ModelNew.py failed against Model: {type(exc).__name__}: {exc}"
        return
    result.correct, result.max_abs_err = correct, worst
    if not correct:
        result.status, result.reason = "incorrect", why
        return
    result.status = "optimized"
    result.reason = f"candidate_{best.iteration}.py, reward {best.reward:+d}; {why}"
    if result.reduced:
        result.reason += f"; verified on reduced sizes of the problem ({result.reduced})"
    if device != "cuda":
        result.reason += "; speed not measured on CPU"
        return
    try:
        with result.phase("time_model_new"):
            timing_inputs = make_inputs(module, device, SEED)
            result.model_us = time_cuda_us(lambda: model(*timing_inputs))
            result.model_new_us = time_cuda_us(lambda: model_new(*timing_inputs))
    except Exception as exc:  # noqa: BLE001 - correct, but the timing itself failed: say so
        result.reason += f"; timing failed: {type(exc).__name__}: {exc}"
        return
    result.speedup = result.model_us / result.model_new_us if result.model_new_us > 0 else None
    result.reason += (
        f"; Model {result.model_us:.1f} us, ModelNew {result.model_new_us:.1f} us (median of triton.testing.do_bench)"
    )
    # Against the better of eager and torch.compile: the verifier timed torch.compile of the same
    # computation at the same shapes beside the kernel (no second compile here).
    ratios = [r for r in (result.speedup, best.speedup_vs_compile) if r is not None]
    result.speedup_vs_best = min(ratios) if ratios else None
    if best.speedup_vs_compile is not None:
        result.reason += f"; {best.speedup_vs_compile:.2f}x torch.compile (verifier)"


def fast_p(results: Sequence[ProblemResult], p: float, device: str) -> float | None:
    """KernelBench's fast_p: share of all problems with a correct ModelNew more than p times as fast."""
    if not results:
        return None
    if p == 0:
        return sum(1 for r in results if r.correct) / len(results)
    if device != "cuda":
        return None
    return sum(1 for r in results if r.correct and r.speedup is not None and r.speedup > p) / len(results)


def default_out() -> Path:
    """Where a run writes when no folder is given: `kernelbench/` in the state folder, not the working directory."""
    from gpuyantra.config import state_dir

    return state_dir() / "kernelbench"


def run(
    path: str | Path,
    device: str = "cpu",
    out: str | Path | None = None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    max_elements: int | None = -1,
    log: Callable[[str], None] = lambda _: None,
    on_result: Callable[[ProblemResult], None] = lambda _: None,
) -> RunResult:
    """Every problem under PATH. `max_elements=-1` means the device default (CPU_MAX_ELEMENTS on CPU,
    no cap on CUDA); None means no cap. `out=None`: the state folder's `kernelbench/`.
    Raises KernelBenchError when PATH holds no problems."""
    problems = find_problems(path)
    if max_elements == -1:
        max_elements = CPU_MAX_ELEMENTS if device == "cpu" else None
    out = Path(out).resolve() if out is not None else default_out()
    out.mkdir(parents=True, exist_ok=True)
    results: list[ProblemResult] = []
    for name, file in problems:
        log(f"[{len(results) + 1}/{len(problems)}] {name}")
        result = run_problem(name, file, device, out, max_iterations, max_elements, log)
        results.append(result)
        on_result(result)
        _summary(results, device, out)  # after every problem: an interrupted run keeps what it did
    return _summary(results, device, out)


def _summary(results: list[ProblemResult], device: str, out: Path) -> RunResult:
    """The run so far, also written to OUT/kernelbench.json."""
    note = "fast_p: share of all problems whose ModelNew is correct and more than p times faster than Model"
    if device != "cuda":
        note += "; speed is not measured on CPU (Triton's interpreter), so fast_1 and fast_2 are null"
    run_result = RunResult(
        device=device,
        out=str(out),
        problems=list(results),
        fast_0=fast_p(results, 0, device),
        fast_1=fast_p(results, 1, device),
        fast_2=fast_p(results, 2, device),
        note=note,
    )
    (out / "kernelbench.json").write_text(json.dumps(run_result.to_dict(), indent=2, default=str) + "\n")
    return run_result
