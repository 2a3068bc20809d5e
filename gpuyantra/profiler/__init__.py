"""Profile a live model: where a served step's time goes, and which swap would shorten it.

`profile_model(model, run_probe, device)` runs a representative workload (a closure the server
builds from recent traffic, or a probe batch when idle) and returns the ranked optimization targets
of `POST /admin/profile` (docs/CONTRACTS.md section 5, ARCHITECTURE "Serving admin API").

What it measures, per phase (one phase per probe: "decode", "prefill", or "probe" for the
positional form):

* step time: median wall time of one probe call, unprofiled and without hooks (synchronized);
* device time, host time and launch counts per module class: `torch.profiler` (CPU activity
  always, CUDA activity on cuda) while forward pre/post hooks open a `record_function` range
  around every module call. A range's kernels are the kernels launched by the ops inside it but
  outside any nested module's range; host time is the range's wall time on the host minus nested
  ranges, scaled by unprofiled/profiled step time to remove the profiler's own overhead;
* GPU busy fraction: summed kernel time of a step / unprofiled wall time of a step. At batch-1
  decode of a 1.5B model on an H200 this is far below 1: the GPU waits for the host, and a
  faster kernel cannot help unless it also removes launches;
* shapes and dtypes: forward pre-hooks record the first activation each matched module sees
  (these feed the verifier's shapes);
* roofline: the op family's `bytes_moved`/`flops` on the observed shapes against the measured
  copy bandwidth and matmul rate of the device (`gpuyantra.hardware`).

Regime of a target: `launch-bound` when the GPU is idle most of the step (busy < 50%) and the
module's host time is at least its device time; otherwise `memory-bound` or `compute-bound` by
arithmetic intensity against the ridge point. On CPU there is no separate device: numbers are host
time, the regime comes from the roofline with the CPU constants, and speed is not judged.

Ranking (Amdahl): each target's cost on the critical path of a step (host-bound step:
max(host, device) time of the module; device-bound step: its device time) minus its estimated
cost after a swap (one Triton launch per call at the measured Triton call cost on the host; the
roofline floor at 80% efficiency on the device) is `est_gain_us`; `est_gain` is that as a fraction
of the step. In a launch-bound step a swap only helps by cutting launches (and host time), so a
module that already issues one launch per call ranks at or below zero whatever its kernel speed,
and its `why` says so. With several phases, the top-level ranking weighs each phase by how often a
request runs it (`weights`, default one prefill and `decode_steps` = 32 decode steps).

Modules: `model` (`profile_model`, phases -> one ranking), `phase` (one phase: timing, profiling,
per-class breakdown), `hooks` (labelled ranges and shape capture), `events` (attributing profiler
events to module calls, the profiler's own overhead), `targets` (per-target metrics, regime, gain).

Note on hot-swapped modules: `find_module_groups` re-checks module math on CPU; after a swap the
server should pass the groups it already knows through `groups=`.
"""

from gpuyantra.profiler.model import DEFAULT_DECODE_STEPS, profile_model
from gpuyantra.profiler.targets import IN_SITU_LAUNCH_FACTOR, estimate_gain

__all__ = ["DEFAULT_DECODE_STEPS", "IN_SITU_LAUNCH_FACTOR", "estimate_gain", "profile_model"]
