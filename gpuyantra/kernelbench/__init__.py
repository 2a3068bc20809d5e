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
   and with the same output dtype. No family agrees -> the Model itself becomes an open target
   (`gpuyantra.ops.open`; numbers its forward takes besides tensors, `forward(self, A, s: float)`,
   are keyword parameters of the kernel's entry), or "unsupported" with the reason the open author
   gives where it cannot write one.
3. runs the optimize loop: the configured author writes `OUT/<problem>/candidate_<i>.py`, the
   verifier judges it; the loop stops on CPU at the ceiling reward +1 (speed is not judged there),
   on CUDA at the first candidate whose whole ModelNew beats the better of Model eager and
   torch.compile(Model) beyond the timings' spread (`judge`), when the author repeats itself, or
   after `max_iterations`.
4. writes `OUT/<problem>/ModelNew.py`: the problem's source verbatim, then
   `class ModelNew(Model)` (same `__init__` signature, same parameters and state) whose `forward`
   calls the best candidate's `entry` on the activations and the live attributes its ADAPTER
   names. The candidate is imported from the real `.py` file next to ModelNew.py (Triton reads
   kernel source with `inspect`), and kernelbench checks ModelNew against Model on 5 fresh input
   draws: against Model in float64 at the family's tolerance plus 16x Model's own float32 error per
   row (the verifier's rule), or against Model in float32 where Model cannot run in float64. On
   CUDA ModelNew, Model and torch.compile(Model) are timed (medians of `triton.testing.do_bench`);
   a correct ModelNew that does not win is `not_faster`, never `optimized`.
5. reports fast_0 / fast_1 / fast_2 as KernelBench defines them: the fraction of *all* problems
   whose ModelNew is correct and, for fast_p, more than p times faster than Model; fast_1 against
   torch.compile and against the better of both, and geometric-mean speedups. On CPU speed is
   not measured, so those are None.

A whole model (KernelBench level 3) whose forward holds several regions (a library anchor and the
fusable ops after it, or a chain of fusable ops) is not one open target: each region is one
(`regions`), written and verified costliest first (`region_loop`), and ModelNew runs the Model's
forward with each kept region's kernel in its place (`compose`); steps 4 and 5 judge it as above.

Verifier binding: the verifier imports `module_class` in its own process (its sandbox child never
imports it) and checks the ADAPTER's attributes on a meta-device instance built with tiny sizes. The
problem's module stays registered in sys.modules under its private name, so the candidate is
verified against the problem's own `Model` whenever that instance builds (`Model(64)`, `Model()`);
otherwise against the family's default module class, with a verification copy of the candidate
whose ADAPTER is that class's (`candidate_<i>.verify.py`, identical kernel code). Either way the
binding to the real `Model` is also checked here (steps 2 and 4).

The package's modules: `problems` (finding and loading problem files, building model and inputs),
`sizes` (the CPU size cap and reduced sizes), `bind` (binding by computation), `optimize` (the
write/verify loop), `model_new` (writing and checking ModelNew.py), `judge` (a candidate's ModelNew
checked and timed against eager and torch.compile), `results` (the result records, fast_p and
geometric means), `runner` (one problem, a whole run), `regions` (a whole model's forward in
regions, their live inputs and cost), `region_loop` (a kernel per region), `compose` (ModelNew
from the regions' kernels).
"""

from __future__ import annotations

from gpuyantra.kernelbench.bind import (
    FP64_TOLERANCE,
    PROBE_ELEMENTS,
    bind_family,
    bind_open_target,
    family_matches,
    probe_inputs,
)
from gpuyantra.kernelbench.model_new import (
    CHECK_DRAWS,
    COMPARE_CHUNK,
    check_model_new,
    compare_chunked,
    compare_to_float64,
    load_model_new,
    model_new_source,
    time_cuda_us,
)
from gpuyantra.kernelbench.optimize import (
    CEILING,
    DEFAULT_MAX_ITERATIONS,
    default_module_adapter,
    optimize,
    verification_target,
    verify_dtypes,
)
from gpuyantra.kernelbench.problems import (
    SEED,
    KernelBenchError,
    Problem,
    build_model,
    check_problem_module,
    find_problems,
    input_elements,
    load_module,
    make_inputs,
    parameter_elements,
    safe_name,
    to_device,
)
from gpuyantra.kernelbench.region_loop import REGION_BUDGET_S, plan_regions
from gpuyantra.kernelbench.regions import Partition, PartitionError, Region, partition, rank_by_cost
from gpuyantra.kernelbench.results import (
    STATUSES,
    Attempt,
    ProblemResult,
    RunResult,
    beats_best,
    fast_p,
    geomean_speedups,
)
from gpuyantra.kernelbench.runner import default_out, run, run_problem
from gpuyantra.kernelbench.sizes import (
    CONSTRAINT_MARGIN,
    CPU_MAX_ELEMENTS,
    MIN_REDUCED_DIM,
    REDUCED_ELEMENTS,
    REDUCED_OUTPUT_ELEMENTS,
    REDUCED_PARAMETERS,
    ModelReduction,
    dimension_values,
    plan_reduced_model,
    plan_reduced_sizes,
)

__all__ = [
    "CEILING",
    "CHECK_DRAWS",
    "COMPARE_CHUNK",
    "CONSTRAINT_MARGIN",
    "CPU_MAX_ELEMENTS",
    "DEFAULT_MAX_ITERATIONS",
    "FP64_TOLERANCE",
    "MIN_REDUCED_DIM",
    "PROBE_ELEMENTS",
    "REDUCED_ELEMENTS",
    "REDUCED_OUTPUT_ELEMENTS",
    "REDUCED_PARAMETERS",
    "REGION_BUDGET_S",
    "SEED",
    "STATUSES",
    "Attempt",
    "KernelBenchError",
    "ModelReduction",
    "Partition",
    "PartitionError",
    "Problem",
    "ProblemResult",
    "Region",
    "RunResult",
    "bind_family",
    "bind_open_target",
    "build_model",
    "check_model_new",
    "check_problem_module",
    "compare_chunked",
    "compare_to_float64",
    "default_module_adapter",
    "default_out",
    "dimension_values",
    "fast_p",
    "beats_best",
    "geomean_speedups",
    "family_matches",
    "find_problems",
    "input_elements",
    "load_model_new",
    "load_module",
    "make_inputs",
    "model_new_source",
    "optimize",
    "parameter_elements",
    "partition",
    "plan_regions",
    "plan_reduced_model",
    "plan_reduced_sizes",
    "probe_inputs",
    "rank_by_cost",
    "run",
    "run_problem",
    "safe_name",
    "time_cuda_us",
    "to_device",
    "verification_target",
    "verify_dtypes",
]
