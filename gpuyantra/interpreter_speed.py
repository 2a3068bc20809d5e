"""What Triton's interpreter (CPU) costs a verification on every launch, removed where it repeats work:

- `tl.reduce` with a kernel's own combine ran a Python call per element: an ordered pairwise tree
  instead (`gpuyantra/interpreter_reduce.py`).
- Every call of a `@triton.jit` helper from inside a kernel patched the language modules again
  (`_patch_lang`: `inspect.getmembers` over `tl`, `tl.tensor`, `tl.math`, each builtin wrapped
  anew), although the launch running it had patched them already; a rope kernel's three helpers
  cost a seventh of its time there. Inside a launch, a helper whose language modules the launch
  patched now runs on those patches; a helper that sees other modules is patched as before. The
  launch's own patching and its restore at the end are untouched.

`install()` applies both (idempotent); each is skipped on a Triton whose interpreter lacks the
hooks it relies on, leaving that Triton's own behaviour."""

from __future__ import annotations

import inspect
import os
from typing import Any

from gpuyantra import interpreter_reduce

_INSTALLED = False


class _Launch:
    """A launch running now: the language modules patched for it (ids) and the scopes of helpers
    that saw other modules, restored when it ends."""

    def __init__(self) -> None:
        self.patched: frozenset[int] | None = None  # None until the launch patched its own
        self.helper_scopes: list[Any] = []


# One entry per launch running now (launches do not nest; the list only guards re-entry).
_LAUNCHES: list[_Launch] = []


class _LaunchScope:
    """The launch's own patching: on restore, the helpers' patches first (they were made over the
    launch's, so they record the launch's versions as the originals), then the launch's."""

    def __init__(self, scope: Any, launch: _Launch) -> None:
        self.scope, self.launch = scope, launch

    def restore(self) -> None:
        while self.launch.helper_scopes:
            self.launch.helper_scopes.pop().restore()
        self.scope.restore()


class _AlreadyPatched:
    """The scope a helper's call gets inside a launch: nothing was changed, nothing to restore."""

    def restore(self) -> None:
        return None


def install() -> bool:
    """Both speedups in this process's interpreter; False off the interpreter."""
    global _INSTALLED
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    interpreter_reduce.install()
    if not _INSTALLED:
        _INSTALLED = _patch_language_once_per_launch()
    return True


def _language_modules(fn: Any) -> frozenset[int]:
    """The Triton language modules `fn`'s globals hold (what `_patch_lang` patches for it)."""
    import triton.language as tl

    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and (v is tl or v is tl.core))


def _patch_language_once_per_launch() -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_lang = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or not isinstance(executor, type):
        return False
    launch = executor.__call__

    def launch_tracked(self: Any, *args: Any, **kwargs: Any) -> Any:
        _LAUNCHES.append(_Launch())
        try:
            return launch(self, *args, **kwargs)
        finally:
            _LAUNCHES.pop()

    def patch_lang_once(fn: Any) -> Any:
        langs = _language_modules(fn)
        running = _LAUNCHES[-1] if _LAUNCHES else None
        if running is None:
            return patch_lang(fn)  # outside any launch: as Triton does it
        if running.patched is None:
            running.patched = langs  # the launch's own patching: it restores it itself
            return _LaunchScope(patch_lang(fn), running)
        if langs <= running.patched:
            return _AlreadyPatched()
        scope = patch_lang(fn)  # a helper seeing another module (tl.core): patched once for the launch
        running.patched |= langs
        running.helper_scopes.append(scope)
        return _AlreadyPatched()

    executor.__call__ = launch_tracked  # type: ignore[method-assign]
    interpreter._patch_lang = patch_lang_once
    return True
