#!/usr/bin/env python3
"""Time every op family against eager, torch.compile, Liger-Kernel and the memory roofline.

For each family x shape (decode 1xH, prefill 4096xH, large 32768x4096) x dtype (bf16, fp16) it
times, as wall time per call in a back-to-back loop (so Python launch overhead counts):

* eager            - the family reference (what the transformers module computes)
* compile          - torch.compile(reference)                       (default mode)
* compile-ro       - torch.compile(reference, mode="reduce-overhead") (CUDA graphs)
* liger            - Liger-Kernel's op, where liger_kernel is installed
* template         - the family's template kernel at its default strategy
* author           - the offline author's best kernel: TemplateAuthor's search driven by this
                     script's measurements (the same feedback the verifier gives: failures,
                     kernel_us, floor_us), up to --author-iters candidates per (family, shape);
                     the other dtype reuses the strategy found first
* floor            - bytes the op must move / measured device copy bandwidth

Prints a table and writes it as markdown and JSON (--out DIR or --out FILE.md/.json). A family or
method that fails prints an error cell and the run goes on. Runs on torch >= 2.4 / triton >= 3.0;
made for a CUDA machine (on CPU it runs tiny shapes in Triton's interpreter, as a smoke test).

    python benchmarks/ops_bench.py --out /tmp/ops_bench
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="ops_bench", help="output directory, or a .md/.json file path (both are written)")
    p.add_argument("--ops", default="", help="comma-separated families (default: all)")
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--shapes", default="decode,prefill,large")
    p.add_argument("--hidden", type=int, default=4096, help="H of the decode and prefill shapes")
    p.add_argument("--author-iters", type=int, default=8, help="candidates the author may write per (family, shape)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    p.add_argument(
        "--budget-s",
        type=float,
        default=330.0,
        help="past this many seconds, compile baselines and author iterations are skipped",
    )
    p.add_argument("--device", default=None, help="cuda (default when available) or cpu (interpreter smoke test)")
    return p.parse_args(argv)


ARGS = _parse_args() if __name__ == "__main__" else None
DEVICE = ARGS.device if ARGS and ARGS.device else None
if DEVICE is None:
    import torch as _t

    DEVICE = "cuda" if _t.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from gpuyantra.authors.base import Attempt, WriteRequest  # noqa: E402
from gpuyantra.authors.template import TemplateAuthor, default_strategy, render  # noqa: E402
from gpuyantra.candidate import load_candidate  # noqa: E402
from gpuyantra.ops import all_ops  # noqa: E402
from gpuyantra.ops.base import as_tuple, outputs_close  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
START = time.perf_counter()


def elapsed() -> float:
    return time.perf_counter() - START


# ------------------------------------------------------------------------------------------ shapes


def shape_specs(op: str, names: list[str], hidden: int, cpu: bool) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, rows, hidden) per benchmark shape. rope's rows are (B, Hq, S) with head dim 128, so
    its tokens x Hq x D match the other families' rows x H (Hq = H / 128, Hk = Hq / 4)."""
    if cpu:
        table = {"decode": ((1,), 64), "prefill": ((16,), 64), "large": ((64,), 256)}
        rope = {"decode": ((1, 4, 1), 16), "prefill": ((1, 4, 16), 16), "large": ((1, 8, 32), 32)}
    else:
        table = {"decode": ((1,), hidden), "prefill": ((4096,), hidden), "large": ((32768,), 4096)}
        rope = {
            "decode": ((1, hidden // 128, 1), 128),
            "prefill": ((1, hidden // 128, 4096), 128),
            "large": ((1, 32, 32768), 128),
        }
    source = rope if op == "rope" else table
    return [(name, *source[name]) for name in names if name in source]


# ------------------------------------------------------------------------------------------ timing


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def time_call(fn, min_total_ms: float = 40.0, repeats: int = 7) -> float:
    """Median wall microseconds per call of back-to-back calls (launch overhead included)."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    n = int(min(2000, max(3, (min_total_ms / 1e3) / repeats / one)))
    results = []
    for _ in range(repeats):
        if DEVICE == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            results.append(start.elapsed_time(end) * 1e3 / n)
        else:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            results.append((time.perf_counter() - t0) * 1e6 / n)
    return statistics.median(results)


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    numel = (1 << 28) if DEVICE == "cuda" else (1 << 20)
    src = torch.empty(numel, dtype=torch.float32, device=DEVICE).uniform_()
    dst = torch.empty_like(src)
    us = time_call(lambda: dst.copy_(src), min_total_ms=50.0)
    return 2 * src.numel() * src.element_size() / (us * 1e-6)


# ------------------------------------------------------------------------------------------ baselines


def liger_fn(op: str, params: dict):
    """Liger-Kernel's implementation of `op`, or None (not installed / no such op)."""
    try:
        if op == "rms_norm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            return lambda x: LigerRMSNormFunction.apply(x, params["weight"], params["eps"], 0.0, "llama")
        if op == "gemma_rms_norm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            return lambda x: LigerRMSNormFunction.apply(x, params["weight"], params["eps"], 1.0, "gemma")
        if op == "layer_norm":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            return lambda x: LigerLayerNormFunction.apply(x, params["weight"], params["bias"], params["eps"])
        if op == "silu_mul":
            from liger_kernel.ops.swiglu import LigerSiLUMulFunction

            return lambda g, u: LigerSiLUMulFunction.apply(g, u)
        if op == "gelu_tanh_mul":
            from liger_kernel.ops.geglu import LigerGELUMulFunction

            return lambda g, u: LigerGELUMulFunction.apply(g, u)
        if op == "rope":
            from liger_kernel.transformers.rope import liger_rotary_pos_emb

            return lambda q, k, c, s: liger_rotary_pos_emb(q, k, c, s)
        if op == "add_rms_norm":
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

            return lambda x, r: LigerFusedAddRMSNormFunction.apply(
                x, r, params["weight"], params["eps"], 0.0, "llama", False
            )
        if op == "softmax":
            from liger_kernel.ops.softmax import LigerSoftmaxFunction

            return lambda x: LigerSoftmaxFunction.apply(x)
    except Exception:  # noqa: BLE001 - not installed, or this Liger version lacks the op
        return None
    return None


_COMPILED: dict[tuple[str, str], object] = {}


def compiled(family, mode: str):
    key = (family.name, mode)
    if key not in _COMPILED:
        kwargs = {"dynamic": False}
        if mode != "default":
            kwargs["mode"] = mode
        _COMPILED[key] = torch.compile(family.reference, **kwargs)
    return _COMPILED[key]


# ------------------------------------------------------------------------------------------ candidates

WORKDIR = Path(tempfile.mkdtemp(prefix="gpuyantra_bench_"))


def load_strategy(op: str, strategy: dict, adapter: list):
    source = render(op, strategy, adapter)
    path = WORKDIR / f"{op}_{abs(hash(source)) & 0xFFFFFFFF:08x}.py"
    path.write_text(source)
    return load_candidate(path)


def template_adapter(op: str) -> list:
    import ast

    from gpuyantra.authors.template import template_source

    src = template_source(op)
    start = src.index("ADAPTER = [") + len("ADAPTER = ")
    end = src.index("]\n", start) + 1
    return ast.literal_eval(src[start:end])


def check(family, out, acts, params, dtype) -> str | None:
    """None when `out` matches the float64 reference within the family's tolerance, else why not."""
    up = lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
    want = family.reference(*[up(a) for a in acts], **{k: up(v) for k, v in params.items()})
    atol, rtol = family.tolerance(dtype)
    if not outputs_close(out, want, atol, rtol):
        err = max((o.double() - w).abs().max().item() for o, w in zip(as_tuple(out), as_tuple(want)))
        return f"mismatch vs float64 reference: max abs err {err:.3g}"
    if any(o.dtype != w.dtype and w.dtype != torch.float64 for o, w in zip(as_tuple(out), as_tuple(want))):
        return "wrong output dtype"
    return None


def reward_for(kernel_us: float, eager_us: float | None, compile_us: float | None) -> int:
    faster_eager = eager_us is not None and kernel_us < eager_us / 1.05
    faster_compile = compile_us is not None and kernel_us < compile_us / 1.05
    return 3 if faster_eager and faster_compile else (2 if faster_eager else 1)


def evaluate(family, strategy, adapter, acts, params, dtype, eager_us, compile_us, floor_us) -> Attempt:
    try:
        cand = load_strategy(family.name, strategy, adapter)
        out = cand.entry(*acts, **params)
        sync()
        problem = check(family, out, acts, params, dtype)
        if problem:
            return Attempt(
                strategy=strategy,
                reward=-1,
                failures=[{"layer": "correctness", "rule": "mismatch", "message": problem}],
            )
        us = time_call(lambda: cand.entry(*acts, **params))
        return Attempt(strategy=strategy, reward=reward_for(us, eager_us, compile_us), kernel_us=us, floor_us=floor_us)
    except Exception as exc:  # noqa: BLE001 - a failing candidate is feedback, not a crash
        return Attempt(
            strategy=strategy,
            reward=-1,
            failures=[{"layer": "sandbox", "rule": type(exc).__name__, "message": str(exc)[:300]}],
        )


# ------------------------------------------------------------------------------------------ the run


def bench_cell(family, shape_name, rows, hidden, dtype_name, args, bw, reuse: dict) -> dict:
    dtype = DTYPES[dtype_name]
    cell = {"op": family.name, "shape": shape_name, "dtype": dtype_name}
    gen = torch.Generator(device=DEVICE).manual_seed(1234)
    acts = family.make_activations(rows, hidden, dtype, DEVICE, gen)
    params = family.make_params(hidden, dtype, DEVICE, gen)
    first_shape = list(acts[0].shape)
    cell["input_shape"] = first_shape
    floor_bytes = family.bytes_moved(first_shape, dtype)
    floor_us = floor_bytes / bw * 1e6
    cell["floor_bytes"] = floor_bytes
    cell["floor_us"] = floor_us
    times: dict[str, float | str] = {}

    def run(name, fn):
        try:
            times[name] = time_call(lambda: fn(*acts, **params))
        except Exception as exc:  # noqa: BLE001
            times[name] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"

    run("eager", family.reference)
    over_budget = elapsed() > args.budget_s
    if not args.no_compile and DEVICE == "cuda" and not over_budget:
        run("compile", compiled(family, "default"))
        run("compile-ro", compiled(family, "reduce-overhead"))
    elif not args.no_compile and DEVICE == "cuda":
        times["compile"] = times["compile-ro"] = "skipped (time budget)"
    lig = liger_fn(family.name, params)
    if lig is not None:
        try:
            lig_out = lig(*acts)
            times["liger"] = time_call(lambda: lig(*acts)) if lig_out is not None else "n/a"
        except Exception as exc:  # noqa: BLE001
            times["liger"] = f"error: {type(exc).__name__}"

    eager_us = times["eager"] if isinstance(times.get("eager"), float) else None
    compile_candidates = [times[k] for k in ("compile", "compile-ro") if isinstance(times.get(k), float)]
    compile_us = min(compile_candidates) if compile_candidates else None
    adapter = template_adapter(family.name)

    default = evaluate(
        family, default_strategy(family.name), adapter, acts, params, dtype, eager_us, compile_us, floor_us
    )
    times["template"] = default.kernel_us if default.kernel_us is not None else "error: " + _why(default)

    # The author's search, fed with this script's measurements.
    key = (family.name, shape_name)
    history: list[Attempt] = []
    author = TemplateAuthor()
    trail = []
    if key in reuse:
        attempt = evaluate(family, reuse[key], adapter, acts, params, dtype, eager_us, compile_us, floor_us)
        history.append(attempt)
        trail.append(
            {
                "strategy": attempt.strategy,
                "kernel_us": attempt.kernel_us,
                "note": "strategy found in the first dtype",
                "failures": attempt.failures,
            }
        )
    iters = args.author_iters if key not in reuse else min(2, args.author_iters)
    for i in range(iters):
        if elapsed() > args.budget_s and history:
            trail.append({"note": "stopped: time budget"})
            break
        request = WriteRequest(
            op=family.name,
            module_class=family.default_module,
            adapter=adapter,
            shapes=[first_shape],
            dtype=str(dtype).replace("torch.", ""),
            hardware=DEVICE,
            history=list(history),
            iteration=i,
        )
        plan = author.plan(request)
        if plan.converged:
            trail.append({"note": plan.reason})
            break
        attempt = evaluate(family, plan.strategy, adapter, acts, params, dtype, eager_us, compile_us, floor_us)
        history.append(attempt)
        trail.append(
            {
                "strategy": plan.strategy,
                "kernel_us": attempt.kernel_us,
                "note": plan.reason,
                "failures": attempt.failures,
            }
        )
    measured = [a for a in history if a.kernel_us is not None]
    if measured:
        best = min(measured, key=lambda a: a.kernel_us)
        times["author"] = best.kernel_us
        cell["author_strategy"] = best.strategy
        reuse.setdefault(key, best.strategy)
    else:
        times["author"] = "error: " + (_why(history[-1]) if history else "no candidate")
    cell["author_trail"] = trail
    cell["times_us"] = times
    cell.update(_verdict(cell, shape_name))
    return cell


def _why(attempt: Attempt) -> str:
    return "; ".join(f"{f.get('layer')}: {f.get('message')}" for f in attempt.failures)[:200]


def _verdict(cell: dict, shape_name: str) -> dict:
    times = cell["times_us"]
    ours = times.get("author")
    if not isinstance(ours, float):
        return {"pct_copy_bw": None, "targets": "no kernel"}
    baselines = [times[k] for k in ("eager", "compile", "compile-ro", "liger") if isinstance(times.get(k), float)]
    best_base = min(baselines) if baselines else math.inf
    pct = 100.0 * cell["floor_us"] / ours
    notes = []
    notes.append("beats baselines" if ours <= best_base * 1.0 else f"SLOWER than best baseline ({best_base:.1f})")
    if shape_name == "large":
        notes.append("≥95% BW" if pct >= 95.0 else f"BW {pct:.0f}% < 95%")
    if shape_name == "decode":
        notes.append("≤5 µs" if ours <= 5.0 else f"{ours:.1f} µs > 5 µs")
    return {"pct_copy_bw": pct, "targets": ", ".join(notes)}


COLUMNS = ["eager", "compile", "compile-ro", "liger", "template", "author"]


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.1f}" if v >= 10 else f"{v:.2f}"
    return "—" if v is None else str(v)[:40]


def to_markdown(report: dict) -> str:
    lines = [
        f"# ops_bench — {report['device_name']}",
        "",
        f"torch {report['torch']}, triton {report['triton']}, copy bandwidth "
        f"{report['copy_bw_tbs']:.2f} TB/s (read + write), wall µs per call (launch included).",
        "",
        "| op | shape | dtype | " + " | ".join(COLUMNS) + " | floor | % copy BW | targets |",
        "|---" * (len(COLUMNS) + 6) + "|",
    ]
    for c in report["cells"]:
        if "error" in c:
            lines.append(
                f"| {c['op']} | {c['shape']} | {c['dtype']} | error: {c['error'][:100]} |" + " |" * (len(COLUMNS) + 2)
            )
            continue
        t = c["times_us"]
        pct = c.get("pct_copy_bw")
        lines.append(
            f"| {c['op']} | {c['shape']} {'x'.join(map(str, c['input_shape']))} | {c['dtype']} | "
            + " | ".join(_fmt(t.get(k)) for k in COLUMNS)
            + f" | {_fmt(c['floor_us'])} | {'' if pct is None else f'{pct:.0f}%'} | {c.get('targets', '')} |"
        )
    lines += ["", "Author strategies (best per cell):", ""]
    for c in report["cells"]:
        if c.get("author_strategy") is not None:
            lines.append(f"- {c['op']} {c['shape']} {c['dtype']}: `{json.dumps(c['author_strategy'])}`")
    lines.append("")
    lines.append(f"total {report['seconds']:.0f} s")
    return "\n".join(lines) + "\n"


def out_paths(out: str) -> tuple[Path, Path]:
    path = Path(out)
    if path.suffix in (".md", ".json"):
        return path.with_suffix(".md"), path.with_suffix(".json")
    return path / "ops_bench.md", path / "ops_bench.json"


def main(args) -> int:
    import triton

    cpu = DEVICE == "cpu"
    if DEVICE == "cuda":
        try:
            import torch._dynamo as dynamo

            dynamo.config.cache_size_limit = max(getattr(dynamo.config, "cache_size_limit", 8), 64)
            if hasattr(dynamo.config, "recompile_limit"):
                dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, 64)
        except Exception:  # noqa: BLE001
            pass
    wanted = [o for o in args.ops.split(",") if o]
    families = [f for f in all_ops() if not wanted or f.name in wanted]
    shapes = [s for s in args.shapes.split(",") if s]
    dtypes = [d for d in args.dtypes.split(",") if d]
    if cpu:
        dtypes = ["fp32" if d == "bf16" else d for d in dtypes]  # the interpreter has no bf16
    bw = copy_bandwidth()
    report = {
        "device": DEVICE,
        "device_name": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "copy_bw_tbs": bw / 1e12,
        "args": vars(args),
        "cells": [],
    }
    print(f"# {report['device_name']}: copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    reuse: dict = {}
    for family in families:
        for shape_name, rows, hidden in shape_specs(family.name, shapes, args.hidden, cpu):
            for dtype_name in dtypes:
                try:
                    cell = bench_cell(family, shape_name, rows, hidden, dtype_name, args, bw, reuse)
                except Exception as exc:  # noqa: BLE001 - one family failing must not abort the run
                    cell = {
                        "op": family.name,
                        "shape": shape_name,
                        "dtype": dtype_name,
                        "error": f"{type(exc).__name__}: {exc}",
                        "trace": traceback.format_exc()[-2000:],
                    }
                report["cells"].append(cell)
                _print_cell(cell)
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
    report["seconds"] = elapsed()
    md_path, json_path = out_paths(args.out)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md = to_markdown(report)
    md_path.write_text(md)
    json_path.write_text(json.dumps(report, indent=1, default=str))
    print()
    print(md)
    print(f"wrote {md_path} and {json_path}")
    return 0


def _print_cell(cell: dict) -> None:
    if "error" in cell:
        print(f"{cell['op']:>14} {cell['shape']:>8} {cell['dtype']:>5}  ERROR {cell['error'][:160]}", flush=True)
        return
    t = cell["times_us"]
    cols = "  ".join(f"{k}={_fmt(t.get(k))}" for k in COLUMNS if k in t)
    pct = cell.get("pct_copy_bw")
    print(
        f"{cell['op']:>14} {cell['shape']:>8} {cell['dtype']:>5}  {cols}  floor={_fmt(cell['floor_us'])}"
        f"  bw={'' if pct is None else f'{pct:.0f}%'}  [{cell.get('targets')}]  t={elapsed():.0f}s",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main(ARGS))
