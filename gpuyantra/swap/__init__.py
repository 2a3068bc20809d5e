"""The swap engine: hot-swap a verified candidate kernel into a live model, all modules or none.

A swap
1. copies the candidate into the state folder (`<state_dir>/swaps/<swap_id>.py`) and loads it from
   there with `load_candidate` (a real file that stays on disk: Triton re-reads kernel source when it
   specializes for new shapes);
2. finds every module that computes the candidate's op family (`find_module_groups`, a numeric check,
   never a class name alone), optionally restricted to one module class, and checks each module has
   the attributes the candidate's `ADAPTER` reads;
3. for each module: computes the original forward on random inputs of the live shapes with the live
   weights, binds `family.replacement_forward(module, entry, ADAPTER)` (wrapped in a fallback guard)
   with `types.MethodType`, computes the new forward on the same inputs and compares them within
   `family.tolerance(dtype)`;
4. runs the `before_commit` hook (the serving engine re-captures CUDA graphs there and checks parity
   on the graph path);
5. commits: the record becomes active and the manifest is written. If anything in 1-4 fails or
   raises, every module gets back exactly the forward it had before, and the record is kept in the
   history as `rolled_back` with the reason.

The caller is responsible for running `swap`/`rollback` while no forward pass is in flight (the
serving engine does it between forward passes, on its single model thread); this module never
exposes a partly bound set of modules to a concurrent forward because it never runs beside one.

While serving, a swapped module whose kernel raises falls back to the original forward for that
call, marks its swap as faulted (all its modules then use the original forward) and queues the
swap for rollback; `handle_faults()` (called between forward passes) performs that rollback.

A newer swap that binds modules an active swap holds supersedes it on those modules; rolling back
the newer swap restores the original forward (not the superseded kernel).

Modules: `records` (records, errors, manifest), `guards` (the guarded forwards and wrappers),
`parity` (the checks), `core` (state, the bind -> check -> commit skeleton, the `Binder` protocol),
`modules` and `functions` (the two kinds of binding, `ModuleBinder` and `FunctionBinder`: strategies
the engine owns), `engine` (`SwapEngine`). Function-site discovery is
`gpuyantra.function_sites`.

Manifest: `<state_dir>/swaps/manifest.json` holds every record (history, with status). `reapply()`
re-binds the records still `committed` for this model after re-checking parity, keeping their ids.
"""

from gpuyantra.swap.engine import SwapEngine
from gpuyantra.swap.guards import swapped_function_id, swapped_id
from gpuyantra.swap.records import (
    CandidateLoadError,
    NotActiveError,
    ParityError,
    SwapError,
    SwapRecord,
    SwapRejected,
    UnknownSwapError,
)

__all__ = [
    "CandidateLoadError",
    "NotActiveError",
    "ParityError",
    "SwapEngine",
    "SwapError",
    "SwapRecord",
    "SwapRejected",
    "UnknownSwapError",
    "swapped_function_id",
    "swapped_id",
]
