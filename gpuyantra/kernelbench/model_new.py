"""Writing `ModelNew.py` (the problem's source, then `class ModelNew(Model)` calling the best
candidate's entry), checking it against Model on fresh input draws, and timing both on CUDA."""

from __future__ import annotations

import copy
import hashlib
import inspect
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from gpuyantra.candidate import import_file
from gpuyantra.kernelbench.problems import SEED, build_model, make_inputs
from gpuyantra.ops import OpFamily
from gpuyantra.ops.base import as_tuple

CHECK_DRAWS = 5


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


def attribute_code(owner: str, dotted: str) -> str:
    """Python reading `dotted` from `owner`: `self.net.weight`, and `getattr(self.net, '0').weight` for an
    index of nn.Sequential / nn.ModuleList (a whole model's layers), which is no attribute name."""
    code = owner
    for part in dotted.split("."):
        code = f"{code}.{part}" if part.isidentifier() else f"getattr({code}, {part!r})"
    return code


def model_new_source(
    problem_source: str,
    problem_path: Path,
    candidate_file: Path,
    op: str,
    adapter: list[dict[str, str]],
    forward_args: list[str] | None,
    reward: int | None,
    updated_buffers: Sequence[str] = (),
    buffer_steps: Sequence[tuple[str, int]] = (),
    forward_returns_tuple: bool = False,
    arguments: Sequence[tuple[int, str]] = (),
) -> str:
    """ModelNew.py: the problem's source verbatim, then ModelNew(Model) calling the kernel's entry.
    `updated_buffers` are the module attrs of the floating buffers the forward writes new values into,
    whose values the entry returns after the forward's outputs; `buffer_steps` the integer buffers
    the forward advances by a fixed step: ModelNew writes both into its own buffers, as Model does.
    `arguments`: (position, kernel param) of the numbers the forward takes (`forward(self, A, s)`),
    which ModelNew passes to entry by keyword, the tensors positionally."""
    candidate_source = candidate_file.read_bytes()
    digest = hashlib.sha256(candidate_source).hexdigest()[:16]
    args = ", ".join(forward_args) if forward_args else "*inputs"
    at = dict(arguments)
    names = list(forward_args) if forward_args else []
    if forward_args:
        call_args = ", ".join(n for i, n in enumerate(names) if i not in at)
    else:
        call_args = f"*[v for i, v in enumerate(inputs) if i not in {sorted(at)}]" if at else "*inputs"
    kwargs = "".join(f", {kp}={names[i] if names else f'inputs[{i}]'}" for i, kp in sorted(at.items()))
    kwargs += "".join(f", {b['kernel_param']}={attribute_code('self', b['module_attr'])}" for b in adapter)
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
    if updated_buffers or buffer_steps:
        footer = footer.replace(
            f"        return _gy_kernel.entry({call_args}{kwargs})\n",
            _forward_with_updates(
                f"_gy_kernel.entry({call_args}{kwargs})", updated_buffers, buffer_steps, forward_returns_tuple
            ),
        )
    body = problem_source if problem_source.endswith("\n") else problem_source + "\n"
    return header + body + footer


def _forward_with_updates(
    call: str, updated: Sequence[str], steps: Sequence[tuple[str, int]], returns_tuple: bool
) -> str:
    """The body of a forward whose Model writes into its own buffers (a training-mode BatchNorm's
    running statistics): the entry returns the forward's outputs, then the buffers' new values."""
    lines = [f"        _gy_out = {call}\n"]
    if updated:
        lines.append(
            "        # the kernel also returns the new values of the buffers Model's forward updates:\n"
            f"        # {', '.join(f'self.{a}' for a in updated)}\n"
            f"        _gy_new = _gy_out[len(_gy_out) - {len(updated)} :]\n"
            f"        _gy_out = tuple(_gy_out[: len(_gy_out) - {len(updated)}])\n"
        )
    lines.append("        with _gy_torch.no_grad():\n")
    lines += [f"            {attribute_code('self', attr)}.copy_(_gy_new[{k}])\n" for k, attr in enumerate(updated)]
    lines += [
        f"            {attribute_code('self', attr)}.add_({step})  # as Model's forward advances it\n"
        for attr, step in steps
    ]
    if updated:
        lines.append(f"        return _gy_out{'' if returns_tuple else '[0] if len(_gy_out) == 1 else _gy_out'}\n")
    else:
        lines.append("        return _gy_out\n")
    return "".join(lines)


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
    init: Sequence[Any] | None = None,
) -> tuple[bool, str, float | None, tuple[torch.nn.Module, torch.nn.Module]]:
    """(correct, reason, max_abs_err, (model, model_new)): ModelNew vs Model on `draws` input draws
    (at the reduced input `sizes` and init inputs `init` when given).

    Outputs are judged as the verifier judges them: against a float64 copy of Model on the same
    inputs (upcast), within atol + rtol·|Model in float64| plus CONDITIONING_SLACK x the per-row RMS
    error of Model's own float32 output there (IEEE float32, no TF32). Two float32 computations of
    ill-conditioned math (a GEMM then a normalization) differ by more than the tolerance whichever
    is right; this bound holds ModelNew to what float32 can do on the draw, and to the tolerance where
    the math is well-conditioned. Where no float64 copy of Model runs (an op without float64
    support, too large for memory), outputs are compared with Model's float32 ones at the
    tolerance, and the reason says so. Buffers Model's forward updates are compared at the tolerance."""
    from gpuyantra.verifier.cases import ieee_float32
    from gpuyantra.verifier.judge import CONDITIONING_SLACK

    new_module = load_model_new(model_new_path)
    model = build_model(problem_module, problem_module.Model, device, init=init)
    model_new = build_model(problem_module, new_module.ModelNew, device, init=init)
    own, new = model.state_dict(), model_new.state_dict()
    if list(own) != list(new) or any(own[k].shape != new[k].shape or not torch.equal(own[k], new[k]) for k in own):
        return False, "ModelNew's parameters/state differ from Model's", None, (model, model_new)
    # Made before any call, so its buffers (a training-mode BatchNorm's statistics) follow Model's.
    model64, no64 = _float64_copy(model, device)
    worst = 0.0
    for draw in range(draws):
        inputs = make_inputs(problem_module, device, SEED + 1000 + draw, sizes)
        with torch.no_grad(), ieee_float32():
            want = model(*inputs)
        with torch.no_grad(), ieee_float32():  # a library convolution in ModelNew: IEEE, as Model's and the verifier's
            got = model_new(*inputs)
        # The buffers after the call (a training-mode BatchNorm's running statistics): ModelNew keeps
        # Model's state semantics.
        own, new = dict(model.named_buffers()), dict(model_new.named_buffers())
        state_tol = family.tolerance(next((v.dtype for v in own.values() if v.is_floating_point()), torch.float32))
        for key, value in own.items():
            err, within = (
                compare_chunked(new[key], value, *state_tol)
                if value.is_floating_point()
                else (0.0, torch.equal(new[key], value))
            )
            if not within:
                return (
                    False,
                    f"draw {draw}: ModelNew's {key} differs from Model's after the call (max abs err {err:.3g})",
                    err,
                    (model, model_new),
                )
        want_t, got_t = as_tuple(want), as_tuple(got)
        if len(want_t) != len(got_t) or any(g.shape != w.shape or g.dtype != w.dtype for g, w in zip(got_t, want_t)):
            return (
                False,
                (f"draw {draw}: ModelNew returned {_describe(got)} where Model returns {_describe(want)}"),
                None,
                (model, model_new),
            )
        want64_t: tuple[Any, ...] | None = None
        if model64 is not None:
            want64_t, why = _float64_outputs(model64, inputs, want_t, device)
            if want64_t is None:
                model64, no64 = None, why
        atol, rtol = family.tolerance(want_t[0].dtype)
        close = True
        for k, (g, w) in enumerate(zip(got_t, want_t)):
            if not isinstance(g, torch.Tensor):
                err, within = 0.0, g == w
            elif want64_t is not None and g.is_floating_point():
                err, within = compare_to_float64(g, w, want64_t[k], atol, rtol, CONDITIONING_SLACK)
            else:
                err, within = compare_chunked(g, w, atol, rtol)
            worst, close = max(worst, err), close and bool(within)
        del want, got, want_t, got_t, want64_t, inputs
        if device == "cuda":  # the next draw's float64 copies need the memory this one held
            torch.cuda.empty_cache()
        if not close:
            against = (
                f"of Model in float64 plus {CONDITIONING_SLACK:g}x Model's own float32 error"
                if model64 is not None
                else f"of Model in float32: {no64}"
            )
            return (
                False,
                (
                    f"draw {draw}: ModelNew differs from Model beyond the {family.name} tolerance "
                    f"(atol {atol:g}, rtol {rtol:g} {against}; max abs err {worst:.3g})"
                ),
                worst,
                (model, model_new),
            )
    against = "against Model in float64" if model64 is not None else f"against Model in float32: {no64}"
    return (
        True,
        f"ModelNew matches Model on {draws} input draws (max abs err {worst:.3g} {against})",
        worst,
        (model, model_new),
    )


# Model runs in float64 only where its inputs and outputs in float64, this many times over (the
# forward's intermediates), fit in the device's free memory (and its float64 parameters, twice).
FLOAT64_HEADROOM = 4


def _float64_copy(model: torch.nn.Module, device: str) -> tuple[torch.nn.Module | None, str]:
    """(a float64 copy of `model`, "") or (None, why there is none)."""
    size = sum(t.numel() * 8 for t in [*model.parameters(), *model.buffers()] if t.is_floating_point())
    free = _free_bytes(device)
    if free is not None and 2 * size > free:
        return None, f"a float64 copy of its parameters ({size / 2**30:.1f} GiB) does not fit in memory"
    try:
        copy64 = copy.deepcopy(model).to(torch.float64)
    except Exception as exc:  # noqa: BLE001 - a module that does not copy or convert: compare in float32
        return None, f"no float64 copy of Model ({type(exc).__name__}: {str(exc)[:120]})"
    for p in copy64.parameters():
        p.requires_grad_(False)
    return copy64, ""


def _float64_outputs(
    model64: torch.nn.Module, inputs: Sequence[Any], want: tuple[Any, ...], device: str
) -> tuple[tuple[Any, ...] | None, str]:
    """(Model's outputs in float64 on `inputs` upcast, "") or (None, why they cannot be had)."""
    floating = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
    need = sum(t.numel() * 8 for t in floating)
    need += sum(t.numel() * 8 for t in want if isinstance(t, torch.Tensor) and t.is_floating_point())
    free = _free_bytes(device)
    if free is not None and FLOAT64_HEADROOM * need > free:
        return None, f"Model in float64 needs about {FLOAT64_HEADROOM * need / 2**30:.1f} GiB, more than is free"
    wide = [t.to(torch.float64) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    try:
        with torch.no_grad():
            out = as_tuple(model64(*wide))
    except Exception as exc:  # noqa: BLE001 - an op without float64 support, out of memory: compare in float32
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        return None, f"Model does not run in float64 ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]})"
    finally:
        del wide
    if len(out) != len(want) or any(
        isinstance(w, torch.Tensor)
        and (not isinstance(o, torch.Tensor) or o.shape != w.shape or o.is_floating_point() != w.is_floating_point())
        for o, w in zip(out, want)
    ):
        return None, "Model in float64 returns other outputs than in float32"
    return out, ""


def _free_bytes(device: str) -> int | None:
    """Memory free for new tensors on `device` (CUDA: the device's free memory and what the caching
    allocator holds unused; CPU: MemAvailable), or None when it cannot be read."""
    try:
        if device.startswith("cuda"):
            index = torch.device(device).index
            index = torch.cuda.current_device() if index is None else index
            free, _ = torch.cuda.mem_get_info(index)
            return int(free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index))
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, RuntimeError, ValueError):
        return None
    return None


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


def compare_to_float64(
    got: torch.Tensor, want32: torch.Tensor, want64: torch.Tensor, atol: float, rtol: float, slack: float
) -> tuple[float, bool]:
    """(max abs error against `want64`, every element within atol + rtol·|want64| + slack x the
    per-row RMS of (want32 - want64)), the verifier's rule (rows along the last dim; non-finite
    errors of want32 count 0). Elements whose float64 value the output dtype cannot hold (NaN,
    overflow) are compared with want32 as `compare_chunked` does. In float64 chunks of whole rows
    (a row longer than a chunk in column pieces): a multi-GB output is never copied whole."""
    width = int(got.shape[-1]) if got.dim() else 1
    rows = got.numel() // width if width else 0
    g2, w32, w64 = (t.reshape(rows, width) for t in (got, want32, want64))
    block_rows = max(1, COMPARE_CHUNK // max(width, 1))
    block_cols = min(max(width, 1), COMPARE_CHUNK)

    def blocks() -> Iterator[tuple[slice, slice]]:
        for r in range(0, rows, block_rows):
            for c in range(0, width, block_cols):
                yield slice(r, r + block_rows), slice(c, c + block_cols)

    # Pass 1: the float32 computation's per-row mean square error.
    square = torch.zeros(rows, dtype=torch.float64, device=got.device)
    for rs, cs in blocks():
        err32 = (w32[rs, cs].double() - w64[rs, cs].double()).abs()
        err32 = torch.where(torch.isfinite(err32), err32, torch.zeros_like(err32))
        square[rs] += err32.pow(2).sum(dim=-1)
    allowance = slack * (square / max(width, 1)).sqrt()
    del square
    # Pass 2: every element against the float64 value.
    worst, close = 0.0, True
    for rs, cs in blocks():
        g, w = g2[rs, cs].double(), w64[rs, cs].double()
        representable = torch.isfinite(w.to(got.dtype)) if got.dtype != torch.float64 else torch.isfinite(w)
        err = torch.where(representable, (g - w).abs(), torch.zeros_like(w))
        allowed = atol + rtol * w.abs() + allowance[rs].unsqueeze(-1)
        worst = max(worst, float(err.nan_to_num(float("inf")).max())) if err.numel() else worst
        close = close and bool((err <= allowed).all())
        if not bool(representable.all()):
            odd = ~representable
            close = close and torch.allclose(g[odd], w32[rs, cs].double()[odd], rtol=rtol, atol=atol, equal_nan=True)
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
