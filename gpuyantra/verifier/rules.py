"""Every rule the verifier enforces: its layer, the exploit class it stops, and what it checks.

`docs/verifier.md` carries the same table; `tests/verifier/test_rules.py` keeps the two in step and
checks that every rule a failure names is listed here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    layer: str
    exploit: str
    checks: str


RULES: dict[str, Rule] = {
    # --- static: the AST, before anything runs ---------------------------------------------------
    "unreadable": Rule("static", "unreadable or non-UTF-8 candidate file", "the file can be read and decoded"),
    "syntax-error": Rule("static", "a file that does not parse", "the file parses as Python"),
    "source-encoding": Rule(
        "static",
        "code hidden from the checker by bytes Python reads differently: a coding declaration "
        "(raw_unicode_escape turns \\u000a into a line break), a byte-order mark, NUL, form feed, lone CR",
        "the file is plain UTF-8: no other coding declaration, no BOM, no control characters but tab and line ends",
    ),
    "import-not-allowed": Rule(
        "static",
        "escaping the sandbox through os, sys, ctypes, subprocess, "
        "importlib, torch submodules (F.rms_norm), relative imports",
        "imports only torch, triton, triton.language(.*), math, typing",
    ),
    "torch-compute": Rule(
        "static",
        "library call dressed up as a kernel (KernelBench, Sakana): torch "
        "ops however aliased (getattr, from-imports, torch.ops, stored references), "
        "tensor methods, the @ operator, arithmetic on tensors",
        "host code uses torch only to allocate and to read metadata",
    ),
    "torch-compile": Rule(
        "static",
        "handing the op to torch.compile / TorchScript / CUDA graphs instead of writing a kernel",
        "no torch.compile, torch.jit, torch._dynamo, torch.fx, torch.export, CUDA graph capture",
    ),
    "concurrency": Rule(
        "static",
        "side streams and async work the timer does not see (CUDA-L1), threads, processes",
        "no streams, events, synchronization tricks, multiprocessing, async code",
    ),
    "native-code": Rule(
        "static",
        "inline CUDA/C++ or custom ops instead of Triton",
        "no torch.utils.cpp_extension, torch.library, jiterator",
    ),
    "private-api": Rule(
        "static",
        "reaching into torch._C / triton internals to disable checks",
        "no underscore-prefixed attributes of torch or triton",
    ),
    "introspection": Rule(
        "static",
        "reading the harness through frames, globals, gc, dunders, computed getattr names, kernel internals",
        "no frame/global/dunder access, getattr/hasattr only with literal names",
    ),
    "dynamic-code": Rule(
        "static",
        "hiding code from the checker with eval/exec/compile/__import__",
        "no eval, exec, compile, __import__, type(name, bases, dict)",
    ),
    "file-io": Rule(
        "static", "reading cached answers from disk, writing the harness's result file", "no open, input, breakpoint"
    ),
    "monkeypatch": Rule(
        "static",
        "patching torch / triton / math / builtins so the harness measures or compares wrongly",
        "no assignment, setattr or del on imported modules or their attributes",
    ),
    "process-exit": Rule(
        "static",
        "exiting before the verdict so a wrapper reads a stale success",
        "no exit, quit, SystemExit, KeyboardInterrupt, BaseException",
    ),
    "try-except": Rule("static", "try/except fallback to the reference (Kevin-32B)", "no try statements anywhere"),
    "guarded-fallback": Rule(
        "static",
        "shape- or dtype-guarded identities and fallbacks (KernelBench-Verified)",
        "no return or launch skip under a test of shape, dtype, device, strides or sizes",
    ),
    "kernel-not-launched": Rule(
        "static",
        "decoy @triton.jit kernel defined but never launched",
        "every kernel is launched from entry (or called by a launched kernel) and entry launches on every path",
    ),
    "return-not-from-kernel": Rule(
        "static",
        "returning the input or a torch result next to a decoy launch",
        "every returned tensor is a fresh buffer that a kernel launch wrote",
    ),
    "kernel-host-code": Rule(
        "static",
        "host Python smuggled into a @triton.jit body (runs as "
        "plain Python in the interpreter), kernels called directly",
        "kernel bodies use only triton, math, constants and other kernels",
    ),
    "mutable-state": Rule(
        "static",
        "result caching across calls (CUDA-L1), module-level buffers returned twice",
        "no global/nonlocal, no stores into module-level or "
        "closure objects, no attribute stores, no mutable defaults, no classes",
    ),
    "import-time-code": Rule(
        "static",
        "work done at import (warming a cache, running entry) or decorators that wrap entry",
        "module level holds only imports, definitions and constant assignments",
    ),
    # --- contract ----------------------------------------------------------------------------------
    "unknown-op": Rule(
        "contract",
        "claiming an op family the registry does not have",
        "OP is a string literal naming a registered family",
    ),
    "adapter-invalid": Rule(
        "contract",
        "an ADAPTER computed at import, unreadable statically",
        "ADAPTER is a literal list of {kernel_param, module_attr}",
    ),
    "adapter-params": Rule(
        "contract",
        "binding a made-up or partial parameter set",
        "ADAPTER binds exactly the family's parameters, once each",
    ),
    "adapter-attr": Rule(
        "contract",
        "a deployment bridge naming attributes the module lacks",
        "each module_attr exists on a meta-device instance with the right kind",
    ),
    "module-class": Rule(
        "contract", "an unknown or unbuildable module class", "the module class imports and builds on the meta device"
    ),
    "entry-signature": Rule(
        "contract",
        "an entry the swap engine cannot call (wrong arity, missing keywords, rebound entry)",
        "def entry(*activations, *, params) matches the family",
    ),
    # --- sandbox -----------------------------------------------------------------------------------
    "timeout": Rule("sandbox", "hanging the worker", "wall-clock limit; the process group is killed"),
    "cpu-limit": Rule("sandbox", "burning the worker's CPU", "RLIMIT_CPU"),
    "memory-limit": Rule(
        "sandbox",
        "exhausting the worker's memory",
        "RLIMIT_AS on CPU, resident memory of the process group polled on every device",
    ),
    "crash": Rule(
        "sandbox", "crashing the worker (segfault, abort)", "the child dies alone; the signal or exit code is reported"
    ),
    "early-exit": Rule(
        "sandbox",
        "exiting cleanly before the harness writes its measurements, printing a fake reward",
        "the verdict needs the harness's own results file",
    ),
    "forked-process": Rule(
        "sandbox", "leaving processes behind", "no process of the child's group may outlive it; stragglers are killed"
    ),
    "output-limit": Rule(
        "sandbox",
        "one call's outputs too large to hand to the parent for judgement",
        "each call's outputs fit the output budget (1 GiB); outputs of all calls pass in chunks of it",
    ),
    "import-failed": Rule("sandbox", "a file that does not import", "the module imports"),
    "runtime-mismatch": Rule(
        "sandbox",
        "OP, ADAPTER or entry changed at import time versus the source the static layer read",
        "runtime values equal the literals",
    ),
    "device-unavailable": Rule(
        "sandbox", "(environment) the requested device is missing", "CUDA is available when --device cuda"
    ),
    "internal-error": Rule(
        "sandbox", "(verifier bug) never accept on an internal error", "an exception inside the verifier rejects"
    ),
    # --- correctness -------------------------------------------------------------------------------
    "entry-raised": Rule(
        "correctness", "a kernel that fails on shapes the harness did not show it", "entry returns on every case"
    ),
    "wrong-values": Rule(
        "correctness",
        "wrong math, all-positive-input hacks, identity-weight hacks, stale results",
        "every element within per-dtype atol/rtol of a float64 "
        "reference, over seeds x shapes x 4 distributions x random parameters, "
        "plus 16x the per-row error of the reference computed in float32 on the case "
        "(for a family that rounds in its dtype, e.g. rope: or 2x eager's own 16-bit error per element)",
    ),
    "nan-output": Rule(
        "correctness",
        "unwritten output elements (stale memory, Sakana)",
        "outputs are poisoned with NaN first; no non-finite value where the reference is finite",
    ),
    "unstable-numerics": Rule(
        "correctness",
        "math that overflows or cancels on the values real models "
        "produce: sums of squares kept in 16-bit, one-pass variance E[x^2]-E[x]^2, "
        "sigmoid as e^g/(1+e^g), softmax without a max shift",
        "the same comparison on activation-like inputs: rows offset far from zero, "
        "outliers near the top of the dtype's safe range, gates past exp's overflow; "
        "tolerance plus 16x the per-row error of the reference computed in float32 there "
        "(for a family that rounds in its dtype: or 2x eager's own 16-bit error per element)",
    ),
    "hardcoded-constant": Rule(
        "correctness",
        "constants baked into the kernel that it should read from the module (eps = 1e-6 instead of the bound value)",
        "every bound scalar drawn per seed around its live value (eps: live/10 to "
        "live x100) on all seeds but the first; outputs judged as for wrong-values",
    ),
    "shape-cap": Rule(
        "correctness",
        "work skipped beyond the shapes that were tried: a grid capped at N programs, one tile capped at N columns",
        "shapes past common caps (CUDA: 70001 rows, 20011 columns; CPU: 1031 rows, "
        "16411 columns): every element written and correct",
    ),
    "unseen-shape": Rule(
        "correctness",
        "kernels right on the shapes tried and wrong at the widths, row counts and ranks a served model "
        "runs: a wide-row or prefill path of its own, K not a multiple of the tile, a rank-4 input collapsed",
        "the plan classes (docs/verifier.md): non-power-of-two widths between tile sizes in every dtype, "
        "prefill row counts, rank-4 inputs: every element correct",
    ),
    "input-layout": Rule(
        "correctness",
        "kernels that assume fresh contiguous inputs where live modules pass strided views "
        "(x.chunk(2, -1), h[:, -1:, :])",
        "activations as slices of a wider buffer at an offset: outputs correct (copying to contiguous is fine)",
    ),
    "optional-parameter": Rule(
        "correctness",
        "kernels right with one state of an optional input only: bias=None projections, partial rotary",
        "optional tensors as None where the live state is unknown; rope with a rotary dim below the head dim",
    ),
    "output-type": Rule(
        "correctness",
        "tensor subclasses, lazy objects, wrong arity",
        "a plain torch.Tensor, or a tuple of them as the reference returns",
    ),
    "output-dtype": Rule("correctness", "returning float32 for a float16 op", "dtype equals the reference's"),
    "output-shape": Rule("correctness", "returning a flattened or broadcast result", "shape equals the reference's"),
    "output-device": Rule("correctness", "computing on the host", "device equals the input's"),
    "output-aliases-input": Rule(
        "correctness",
        "returning the input or a view of it or of a parameter",
        "output storage overlaps no input or parameter",
    ),
    "output-reused": Rule(
        "correctness",
        "one cached buffer returned for every call",
        "outputs of distinct calls share no storage and stay correct",
    ),
    "input-mutated": Rule(
        "correctness",
        "scribbling on inputs or weights",
        "inputs and parameters are bit-identical to clones after each call",
    ),
    "no-kernel-launch": Rule(
        "correctness",
        "launching only on some calls, or never",
        "one of the candidate's own kernels launches on every call",
    ),
    "host-torch-op": Rule(
        "correctness",
        "torch compute that slipped past the static layer",
        "a dispatch recorder sees no aten compute op outside kernel launches",
    ),
    "stream-changed": Rule(
        "correctness", "leaving work on a side stream", "the current stream is the default stream after each call"
    ),
    # --- benchmark ---------------------------------------------------------------------------------
    "implausible-speed": Rule(
        "benchmark",
        "timing a kernel that did not do the work (caching, side streams, skipped launches)",
        "kernel time is not below the bytes moved over measured copy bandwidth",
    ),
    "benchmark-failed": Rule("benchmark", "a kernel that breaks under timing", "the timed runs complete"),
}


def layer_of(rule: str) -> str:
    return RULES[rule].layer
