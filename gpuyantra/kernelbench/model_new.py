"""Writing `ModelNew.py` (the problem's source, then `class ModelNew(Model)` calling the best
candidate's entry), checking it against Model on fresh input draws, and timing both on CUDA."""

from __future__ import annotations

import hashlib
import inspect
import re
from collections.abc import Callable, Sequence
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
) -> str:
    """ModelNew.py: the problem's source verbatim, then ModelNew(Model) calling the kernel's entry.
    `updated_buffers` are the module attrs of the floating buffers the forward writes new values into,
    whose values the entry returns after the forward's outputs; `buffer_steps` the integer buffers
    the forward advances by a fixed step: ModelNew writes both into its own buffers, as Model does."""
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
    lines += [f"            self.{attr}.copy_(_gy_new[{k}])\n" for k, attr in enumerate(updated)]
    lines += [f"            self.{attr}.add_({step})  # as Model's forward advances it\n" for attr, step in steps]
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
    (at the reduced input `sizes` and init inputs `init` when given)."""
    new_module = load_model_new(model_new_path)
    model = build_model(problem_module, problem_module.Model, device, init=init)
    model_new = build_model(problem_module, new_module.ModelNew, device, init=init)
    own, new = model.state_dict(), model_new.state_dict()
    if list(own) != list(new) or any(own[k].shape != new[k].shape or not torch.equal(own[k], new[k]) for k in own):
        return False, "ModelNew's parameters/state differ from Model's", None, (model, model_new)
    worst = 0.0
    for draw in range(draws):
        inputs = make_inputs(problem_module, device, SEED + 1000 + draw, sizes)
        with torch.no_grad():
            want = model(*inputs)
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
