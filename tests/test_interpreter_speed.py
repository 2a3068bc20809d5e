"""The interpreter patches its language modules once per launch (gpuyantra/interpreter_speed.py):
a kernel's helpers run on the launch's patches, results are unchanged, and after the launch every
language module holds exactly what it held before."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from gpuyantra import interpreter_speed

HELPER_CALLS = 16


@triton.jit
def _scaled(x, s):
    return x * s


@triton.jit
def _blocks(n, BLOCK: tl.constexpr):
    return tl.cdiv(n, BLOCK)  # a helper from triton.language.standard, whose globals see tl.core


@triton.jit
def _helpers_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, CALLS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    acc = x * 0.0
    for _ in tl.static_range(CALLS):
        acc += _scaled(x, 0.5)
    acc += _blocks(n, BLOCK).to(tl.float32)
    tl.store(y_ptr + offs, acc, mask=mask)


def launch(x: torch.Tensor, calls: int = HELPER_CALLS) -> torch.Tensor:
    y = torch.empty_like(x)
    _helpers_kernel[(1,)](x, y, x.numel(), BLOCK=32, CALLS=calls)
    return y


def language_attributes() -> dict[tuple[str, str], object]:
    modules = {"tl": tl, "tl.core": tl.core, "tl.math": tl.math, "tl.tensor": tl.tensor}
    return {(m, name): getattr(obj, name) for m, obj in modules.items() for name in dir(obj)}


def test_results_are_unchanged_and_the_language_is_restored_after_each_launch() -> None:
    assert interpreter_speed.install()
    x = torch.randn(20)
    before = language_attributes()
    y = launch(x)
    torch.testing.assert_close(y, x * 0.5 * HELPER_CALLS + 1.0)
    after = language_attributes()
    changed = [key for key in before if before[key] != after.get(key)]
    assert changed == [], changed[:5]


def test_a_launch_patches_the_language_a_fixed_number_of_times_however_many_helper_calls(monkeypatch) -> None:
    assert interpreter_speed.install()
    patched: list[str] = []
    original = interpreter._patch_builtin

    def counting(pkg, *args):
        patched.append(getattr(pkg, "__name__", str(pkg)))
        return original(pkg, *args)

    monkeypatch.setattr(interpreter, "_patch_builtin", counting)
    launch(torch.randn(20), calls=2)
    with_two_calls = list(patched)
    patched.clear()
    launch(torch.randn(20), calls=HELPER_CALLS)
    # The launch's own patching and tl.core's once (for cdiv), whatever the helper calls; before,
    # all of it again at every helper call.
    assert patched == with_two_calls, (len(patched), len(with_two_calls))
