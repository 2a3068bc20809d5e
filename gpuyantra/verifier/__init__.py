"""The trust anchor: `verify(path, ...) -> Verdict` runs every layer on one candidate kernel file.

Layers, in order (docs/verifier.md has the rule table): static (AST) -> contract (meta-device
module instance) -> sandbox (separate limited process) -> correctness (judged in the parent against
a float64 reference) -> benchmark (CUDA only). The reward is computed in the parent.

The names below are imported on first use: the sandbox child (`python -m gpuyantra.verifier.child`)
imports this package first and isolates itself (`isolation`) before torch is imported and starts
threads of its own, which the isolation of the thread that takes it would not cover.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuyantra.verifier.core import run_verification, verify
    from gpuyantra.verifier.verdict import Failure, Verdict, compute_reward

__all__ = ["Failure", "Verdict", "compute_reward", "run_verification", "verify"]

_HOMES = {
    "run_verification": "core",
    "verify": "core",
    "Failure": "verdict",
    "Verdict": "verdict",
    "compute_reward": "verdict",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(f"gpuyantra.verifier.{_HOMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
