#!/usr/bin/env python3
"""Shared memory a candidate's kernels need on a CUDA GPU, found on any machine (no GPU needed).

The candidate's `entry` runs once on CPU tensors (a KernelBench-format problem's Model, its
`get_init_inputs()` and `get_inputs()`) in a child process where Triton's interpreter records each
kernel launch instead of running it: argument types, constexprs and launch options. This process
then compiles each distinct launch for the target architecture with Triton's own compiler (its
bundled ptxas; no driver) and reads the kernel's metadata.

    .venv/bin/python benchmarks/kernel_resources.py CANDIDATE.py --problem PROBLEM.py
    .venv/bin/python benchmarks/kernel_resources.py CANDIDATE.py --problem PROBLEM.py --set _k0:BLOCK_M=64,BLOCK_N=64

The launches are those the candidate's host code plans on a CPU; where its plan differs on a GPU
(an open-author product: larger tiles in the interpreter), `--set KERNEL:NAME=VALUE,...` replaces
constexprs or launch options (num_warps, num_stages) before compiling. Exit status 1 when a kernel
needs more shared memory than `--limit` (default: an H100/H200 block's 232448 bytes).
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
H100_SHARED_BYTES = 232448
_POINTER_TYPES = {
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float64": "fp64",
    "int64": "i64",
    "int32": "i32",
    "int8": "i8",
    "uint8": "u8",
    "bool": "i1",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("candidate", help="the candidate .py file (OP, ADAPTER, entry)")
    p.add_argument("--problem", required=True, help="a KernelBench-format problem: Model, get_inputs, get_init_inputs")
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (default 90)")
    p.add_argument("--limit", type=int, default=H100_SHARED_BYTES, help="shared memory a block may use, bytes")
    p.add_argument("--set", action="append", default=[], help="KERNEL:NAME=VALUE,... before compiling (repeatable)")
    p.add_argument("--json", action="store_true", help="print the launches as one JSON list")
    p.add_argument("--record", help=argparse.SUPPRESS)  # the child: write the recorded launches here
    args = p.parse_args(argv)
    try:
        args.overrides = overrides(args.set)
    except ValueError as exc:
        p.error(str(exc))
    return args


def overrides(items: list[str]) -> dict[str, dict[str, int]]:
    """`["_k0:BLOCK_M=64,num_stages=1"]` -> {"_k0": {"BLOCK_M": 64, "num_stages": 1}}."""
    out: dict[str, dict[str, int]] = {}
    for item in items:
        kernel, _, pairs = item.partition(":")
        if not kernel or not pairs:
            raise ValueError(f"--set {item!r}: expected KERNEL:NAME=VALUE,...")
        for pair in pairs.split(","):
            name, _, value = pair.partition("=")
            if not name or not value.lstrip("-").isdigit():
                raise ValueError(f"--set {item!r}: {pair!r} is not NAME=INTEGER")
            out.setdefault(kernel, {})[name] = int(value)
    return out


# ------------------------------------------------------------------ the child: record the launches
def record(candidate: str, problem: str, out: str) -> None:
    import torch
    import triton.runtime.interpreter as interpreter

    from gpuyantra.candidate import load_candidate
    from gpuyantra.kernelbench.problems import load_module

    launches: list[dict[str, Any]] = []

    def type_of(value: Any) -> str | None:
        if isinstance(value, torch.Tensor):
            return "*" + _POINTER_TYPES[str(value.dtype).replace("torch.", "")]
        if isinstance(value, bool):
            return "i1"
        if isinstance(value, int):
            return "i64" if abs(value) >= 2**31 else "i32"
        if isinstance(value, float):
            return "fp32"
        return None

    def recorded(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> None:
        values = dict(zip(self.arg_names, args))
        values.update({k: v for k, v in kwargs.items() if k in self.arg_names})
        launches.append(
            {
                "kernel": self.fn.__name__,
                "args": {
                    k: [type_of(v), None if isinstance(v, torch.Tensor) else v]
                    for k, v in values.items()
                    if type_of(v) is not None or v is None or isinstance(v, (str, int, float))
                },
                "options": {k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages")},
            }
        )

    interpreter.InterpretedFunction.run = recorded  # launches are recorded, not run
    module = load_module(Path(problem))
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    inputs = module.get_inputs()
    cand = load_candidate(candidate)
    bound = {b["kernel_param"]: operator.attrgetter(b["module_attr"])(model) for b in cand.adapter}
    try:
        cand.entry(*inputs, **bound)
    except Exception as exc:  # noqa: BLE001 - kernels did not run: later host code may trip on that
        print(f"entry stopped after {len(launches)} launch(es): {type(exc).__name__}: {exc}", file=sys.stderr)
    Path(out).write_text(json.dumps(launches, default=str))


# ------------------------------------------------------------------ this process: compile them
def compile_launches(
    candidate: str, launches: list[dict[str, Any]], arch: int, changes: dict[str, dict[str, int]]
) -> list[dict[str, Any]]:
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location("gy_candidate_compiled", candidate)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results: list[dict[str, Any]] = []
    seen: set[str] = set()
    for launch in launches:
        fn = getattr(module, launch["kernel"])
        signature: dict[str, str] = {}
        constexprs: dict[str, Any] = {}
        options = dict(launch["options"])
        for param in fn.params:
            kind, value = launch["args"].get(param.name, [None, None])
            if param.is_constexpr or kind is None:
                signature[param.name], constexprs[param.name] = "constexpr", value
            else:
                signature[param.name] = kind
        for name, value in changes.get(launch["kernel"], {}).items():
            (constexprs if name in constexprs else options)[name] = value
        key = json.dumps([launch["kernel"], constexprs, options], sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        entry = {
            "kernel": launch["kernel"],
            "options": options,
            "constexprs": {k: v for k, v in constexprs.items() if isinstance(v, int)},
        }
        try:
            compiled = triton.compile(
                ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                target=GPUTarget("cuda", arch, 32),
                options=options,
            )
            entry["shared_bytes"] = int(compiled.metadata.shared)
        except Exception as exc:  # noqa: BLE001 - reported per kernel
            entry["error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
        results.append(entry)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.record:
        record(args.candidate, args.problem, args.record)
        return 0
    os.environ.pop("TRITON_INTERPRET", None)  # this process compiles: real JIT functions
    out = Path(args.candidate).with_suffix(".launches.json")
    child = [sys.executable, __file__, args.candidate, "--problem", args.problem, "--record", str(out)]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(child, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not out.exists():
        print(f"recording the launches failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
        return 2
    launches = json.loads(out.read_text())
    out.unlink()
    results = compile_launches(args.candidate, launches, args.arch, args.overrides)
    over = [r for r in results if r.get("shared_bytes", 0) > args.limit or "error" in r]
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            need = f"{r['shared_bytes']} B" if "shared_bytes" in r else r["error"]
            print(f"{r['kernel']}: shared {need}  options {r['options']}  constexprs {r['constexprs']}")
        print(f"{len(results)} distinct launch(es); {len(over)} over the {args.limit} B limit or not compiled")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
