"""The trust anchor: `verify(path, ...) -> Verdict` runs every layer on one candidate kernel file.

Layers, in order (docs/verifier.md has the rule table): static (AST) -> contract (meta-device
module instance) -> sandbox (separate limited process) -> correctness (judged in the parent against
a float64 reference) -> benchmark (CUDA only). The reward is computed in the parent.
"""

from gpuyantra.verifier.core import run_verification, verify
from gpuyantra.verifier.verdict import Failure, Verdict, compute_reward

__all__ = ["Failure", "Verdict", "compute_reward", "run_verification", "verify"]
