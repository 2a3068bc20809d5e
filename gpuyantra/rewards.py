"""The verifier's reward ladder as everything outside the verifier reads it (docs/CONTRACTS.md section 4).

-1 wrong or cheating; +1 correct; +2 faster than eager; +3 faster than eager and torch.compile.
Speed is judged only on CUDA, so the most a verdict can score depends on where it was verified:
`ceiling(device)`. The verifier computes rewards (gpuyantra/verifier/verdict.py: compute_reward);
the workflow, the authors, the CLI and KernelBench only compare against these bounds.

Stdlib only: the campaign workflow imports it inside Temporal's sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

REWARD_MIN = -1  # wrong or cheating
REWARD_ACCEPTED = 1  # correct: the least reward the verifier accepts and the server swaps
REWARD_MAX = 3  # faster than eager and torch.compile

# The best reward a verdict can reach per verifying device. The interpreter (CPU) judges correctness
# only; a device not listed here is judged like CUDA. Read-only: one table for every reader.
CEILING: Mapping[str, int] = MappingProxyType({"cpu": REWARD_ACCEPTED, "cuda": REWARD_MAX})


def ceiling(device: str | None) -> int:
    """The best reward a verdict verified on `device` can get (+1 on "cpu", else +3)."""
    return CEILING.get(device or "", REWARD_MAX)
