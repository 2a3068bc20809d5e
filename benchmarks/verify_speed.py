"""How long a GPU verdict takes: cold (no cached baselines, no warm child), warm, and six at once.

    python3 benchmarks/verify_speed.py --out $OUT/verify_speed.json [--candidate gpuyantra/kernels/rms_norm.py]
    python3 benchmarks/verify_speed.py --judge-only [--device cpu] --out judge.json
    python3 benchmarks/verify_speed.py --templates rms_norm,softmax --round parallel --out cold.json

`--templates`: several templates (gpuyantra/kernels/<name>.py, each at its family's default shapes),
with no cached baselines (give each round its own state folder and compiler caches): one after
another (`--round sequential`: each one's cold wall time) or all at once (`--round parallel`).

`--parallel-rounds N`: the round of six N times (each after `--spare-wait-s`); the summary has
each round's wall time, their median and its ratio to the warm median. Warm runs and rounds where a
verification waited for its spare to finish starting are counted and left out of the medians (the
spare's start is not the verdict's time), unless nothing else is left.

`--judge-only`: the parent's side of a verdict alone (no child, no GPU lock, any machine): the
outputs of one verification's plan (the module's own math, saved in chunks as the child saves them)
loaded and judged from one thread, then from `--parallel` threads of this process at once.

As a GPU worker runs it: one process, `keep_warm=True` (the next verification finds its sandbox child
started), one warm spare per concurrent verification for the round of six (as a worker with six GPU
slots keeps from its start) and the state folder's cached torch.compile baselines. Prints and writes wall seconds and
each verdict's `timings`, reward and speedups; the concurrent round checks that speedups stay within
the noise of the single runs (timing phases hold one GPU-wide lock).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one(path: str, shapes: list[list[int]] | None, dtype: str) -> dict:
    from gpuyantra.verifier import run_verification

    started = time.perf_counter()
    verdict = run_verification(path, device="cuda", shapes=shapes, dtypes=[dtype], keep_warm=True)
    return {
        "wall_s": round(time.perf_counter() - started, 2),
        "reward": verdict.reward,
        "speedup_vs_eager": verdict.speedup_vs_eager,
        "speedup_vs_compile": verdict.speedup_vs_compile,
        "failures": [f.rule for f in verdict.failures],
        "timings": verdict.timings,
        "cached": [row.get("cached") for row in verdict.bench],
        "bench_seconds": [row.get("seconds") for row in verdict.bench],  # each shape's parts of the timing turn
    }


def templates_round(names: list[str], dtype: str, parallel: bool, spare_wait_s: float) -> dict:
    """Cold verdicts of the named templates at their default shapes, one after another or all at once,
    each from a warm sandbox child (as a GPU worker keeps them)."""
    from gpuyantra.verifier.sandbox import keep_spare, set_spare_count

    paths = [str(ROOT / "gpuyantra" / "kernels" / f"{name}.py") for name in names]
    set_spare_count(len(names) if parallel else 1)
    keep_spare("cuda")
    time.sleep(spare_wait_s)
    started = time.perf_counter()
    if parallel:
        with ThreadPoolExecutor(len(paths)) as pool:
            rows = list(pool.map(lambda path: one(path, None, dtype), paths))
    else:
        rows = [one(path, None, dtype) for path in paths]
    wall = round(time.perf_counter() - started, 2)
    for name, row in zip(names, rows):
        print(name, {k: row[k] for k in ("wall_s", "reward", "speedup_vs_eager", "failures")}, flush=True)
    return {"round": "parallel" if parallel else "sequential", "wall_s": wall, "templates": dict(zip(names, rows))}


def judge_only(device: str, shapes: list[list[int]], dtype: str, seeds: int, parallel: int) -> dict:
    """Seconds to load and judge one verification's outputs: alone, then `parallel` at once."""
    import itertools
    import os
    import tempfile
    import threading

    import gpuyantra.verifier.cases as case_plan
    from gpuyantra.ops import get_op
    from gpuyantra.verifier.child import OutputSink
    from gpuyantra.verifier.judge import OutputValues, References
    from gpuyantra.verifier.sandbox import OutputReader, output_budget

    family = get_op("rms_norm")
    specs: list[dict[str, Any]] = [
        {"name": "weight", "kind": "tensor", "shape": ["H"]},
        {"name": "eps", "kind": "float", "value": 1e-6},
    ]
    hidden = [list(s) for s in case_plan.HIDDEN_SHAPES[device] if list(s) not in shapes]
    cases = case_plan.plan(device, shapes + hidden, [dtype], case_plan.SEEDS[:seeds], recheck=device == "cuda")
    source = Path(tempfile.mkdtemp(prefix="judge-only-"))
    sink = OutputSink(str(source), 2**40, chunk_per_group=device == "cuda")
    for _, group in itertools.groupby(cases, key=lambda c: (c.phase, c.dtype, c.shape)):
        for case in group:
            activations, params = case_plan.make_case(family, case, specs, device)
            sink.add(case.id, [(0, family.reference(*activations, **params))])
        sink.end_group()
    sink.flush()

    def judged(rows: list[dict]) -> None:
        folder = Path(tempfile.mkdtemp(dir=source.parent))
        for chunk in source.iterdir():
            os.link(chunk, folder / chunk.name)  # the reader deletes what it has read
        values = OutputValues(family, cases, References(family, specs, device))
        reader = OutputReader(folder, output_budget(), values.consume)
        reader.read_ready()
        bad = [v.findings for v in values.values.values() if v.findings]
        assert not bad and not reader.error and len(values.values) == len(cases), (bad[:1], reader.error)
        rows.append(
            {
                "load_outputs": round(reader.load_seconds, 3),
                "judge_outputs": round(reader.consume_seconds, 3),
                "judge_outputs_cpu": round(reader.consume_cpu_seconds, 3),
            }
        )
        folder.rmdir()

    mib = sum(f.stat().st_size for f in source.iterdir()) / 2**20
    report: dict = {"device": device, "cases": len(cases), "chunks": sink.written, "output_mib": round(mib)}
    for n in (1, parallel):
        rows: list[dict] = []
        threads = [threading.Thread(target=judged, args=(rows,)) for _ in range(n)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        report[f"at_once_{n}"] = {"wall_s": round(time.perf_counter() - started, 2), "verifications": rows}
        print(n, "at once", report[f"at_once_{n}"], flush=True)
    for chunk in source.iterdir():
        chunk.unlink()
    source.rmdir()
    return report


SPARE_READY_S = 0.1  # a warm spare hands its job over at once; longer, it was still starting


def spare_was_ready(verdict: dict) -> bool:
    return (verdict.get("timings") or {}).get("sandbox_child_start", 0.0) <= SPARE_READY_S


def parallel_round(candidate: str, shapes: list[list[int]], dtype: str, parallel: int) -> dict:
    """`parallel` verifications at once from as many threads, each from a warm spare."""
    started, cpu = time.perf_counter(), time.process_time()  # all this process's threads, not its children
    with ThreadPoolExecutor(parallel) as pool:
        verdicts = list(pool.map(lambda _: one(candidate, shapes, dtype), range(parallel)))
    wall = round(time.perf_counter() - started, 2)
    # Near the wall time: this process's threads (judging, the sandboxes' readers) take turns on one core.
    parent_cpu = round(time.process_time() - cpu, 2)
    for row in verdicts:
        print("parallel", row, flush=True)
    print("parallel round", wall, "s, parent CPU", parent_cpu, "s", flush=True)
    return {"wall_s": wall, "parent_cpu_s": parent_cpu, "verdicts": verdicts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--candidate", default=str(ROOT / "gpuyantra" / "kernels" / "rms_norm.py"))
    parser.add_argument("--shapes", default="1x1536,4096x1536")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--spare-wait-s", type=float, default=20.0, help="spares starting, as at a worker start")
    parser.add_argument("--parallel-rounds", type=int, default=1, help="rounds of --parallel at once")
    parser.add_argument(
        "--between-s", type=float, default=0.0, help="pause before each warm run (its spare child starting)"
    )
    parser.add_argument("--judge-only", action="store_true", help="the parent's loading and judging alone")
    parser.add_argument("--templates", default="", help="comma-separated template names: cold verdicts of each")
    parser.add_argument("--round", choices=["sequential", "parallel"], default="parallel", help="with --templates")
    parser.add_argument("--device", default="cuda", help="--judge-only: where references are computed")
    parser.add_argument("--judge-seeds", type=int, default=5, help="--judge-only: seeds of the plan (1-5)")
    args = parser.parse_args()
    shapes = [[int(d) for d in s.split("x")] for s in args.shapes.split(",")]
    if args.judge_only:
        judged = judge_only(args.device, shapes, args.dtype, args.judge_seeds, args.parallel)
        args.out.write_text(json.dumps(judged, indent=1))
        return 0
    from gpuyantra.config import state_dir
    from gpuyantra.triton_env import prepare

    prepare("cuda")
    (state_dir() / "verifier" / "baselines.json").unlink(missing_ok=True)
    if args.templates:
        names = args.templates.split(",")
        args.out.write_text(json.dumps(templates_round(names, args.dtype, args.round == "parallel", args.spare_wait_s)))
        return 0
    report: dict = {"candidate": args.candidate, "shapes": shapes, "dtype": args.dtype}

    def save() -> None:
        args.out.write_text(json.dumps(report, indent=1))

    report["cold"] = one(args.candidate, shapes, args.dtype)
    print("cold", report["cold"], flush=True)
    save()
    report["warm"] = []
    for _ in range(args.warm_runs):
        time.sleep(args.between_s)
        report["warm"].append(one(args.candidate, shapes, args.dtype))
        print("warm", report["warm"][-1], flush=True)
        save()
    # As a GPU worker with that many slots: one warm spare per concurrent verification, started
    # before the round (the worker starts them with itself).
    from gpuyantra.verifier.sandbox import keep_spare, set_spare_count

    set_spare_count(args.parallel)
    report["parallel_rounds"] = []
    for _ in range(args.parallel_rounds):
        keep_spare("cuda")
        time.sleep(args.spare_wait_s)
        report["parallel_rounds"].append(parallel_round(args.candidate, shapes, args.dtype, args.parallel))
        save()
    # The first round under the names earlier reports used.
    first = report["parallel_rounds"][0]
    report["parallel"], report["parallel_wall_s"] = first["verdicts"], first["wall_s"]
    report["parallel_parent_cpu_s"] = first["parent_cpu_s"]
    # A verdict whose spare was still starting (`sandbox_child_start`) measured the spare's start, not
    # the verdict: such runs and rounds are counted, and left out of the medians where others remain.
    ready_warm = [r for r in report["warm"] if spare_was_ready(r)]
    ready_rounds = [r for r in report["parallel_rounds"] if all(spare_was_ready(v) for v in r["verdicts"])]
    warm = [r["wall_s"] for r in ready_warm or report["warm"]]
    walls = [r["wall_s"] for r in ready_rounds or report["parallel_rounds"]]
    speedups = [v["speedup_vs_eager"] for rnd in report["parallel_rounds"] for v in rnd["verdicts"]]
    report["summary"] = {
        "cold_s": report["cold"]["wall_s"],
        "warm_median_s": statistics.median(warm) if warm else None,
        "parallel_wall_s": report["parallel_wall_s"],
        "parallel_walls_s": [r["wall_s"] for r in report["parallel_rounds"]],
        "parallel_median_s": statistics.median(walls),
        "parallel_over_warm": round(statistics.median(walls) / statistics.median(warm), 2) if warm else None,
        "warm_spare_not_ready": len(report["warm"]) - len(ready_warm),
        "rounds_spare_not_ready": len(report["parallel_rounds"]) - len(ready_rounds),
        "parallel_parent_cpu_s": report["parallel_parent_cpu_s"],
        "single_speedups_vs_eager": [r["speedup_vs_eager"] for r in report["warm"]],
        "parallel_speedups_vs_eager": [r["speedup_vs_eager"] for r in first["verdicts"]],
        "parallel_speedups_range": [min(speedups), max(speedups)],
    }
    print("summary", report["summary"], flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
