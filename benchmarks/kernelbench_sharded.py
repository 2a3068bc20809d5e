"""Run `gpuyantra kernelbench` over many problems in parallel shards and print one table.

Each shard is a separate process (its own verifier sandboxes); on one GPU the verifier's timing lock
keeps timed phases from overlapping, so shards share the device without skewing each other's
numbers. Problems are dealt round-robin so slow and fast ones mix. `--gpus N` deals the shards over
N GPUs of the host (CUDA_VISIBLE_DEVICES per shard), each GPU with its own state folder, so its
timing lock orders only the shards on that GPU.

    python benchmarks/kernelbench_sharded.py PROBLEM_DIR --device cuda --shards 4 --out OUT [--only 19,23,24]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


def problem_numbers(text: str) -> set[int]:
    """`1-4,9,12-13` -> {1, 2, 3, 4, 9, 12, 13}."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def problem_files(folder: Path, only: set[int] | None, order: str = "slow-last") -> list[Path]:
    files = sorted(
        folder.glob("*.py"), key=lambda p: int(re.match(r"(\d+)", p.name).group(1)) if p.name[0].isdigit() else 0
    )
    files = [f for f in files if only is None or (f.name.split("_")[0].isdigit() and int(f.name.split("_")[0]) in only)]
    if order == "number":  # a run stopped at its deadline leaves a sample of every kind
        return files
    # Convolutions and matmuls last: a run stopped at its deadline loses the slowest problems.
    return sorted(files, key=lambda f: ("conv" in f.name.lower(), "mul" in f.name.lower() or "gemm" in f.name.lower()))


def shard_env(shard: int, gpus: int, out: Path) -> dict[str, str]:
    """The shard's environment: with `gpus` > 1, GPU shard % gpus alone and that GPU's state folder."""
    env = dict(os.environ)
    if gpus > 1:
        # The GPUs this process may use: its own CUDA_VISIBLE_DEVICES when set, else 0..gpus-1.
        visible = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()] or [
            str(g) for g in range(gpus)
        ]
        gpu = visible[shard % min(gpus, len(visible))]
        env["CUDA_VISIBLE_DEVICES"] = gpu
        env["GPUYANTRA_STATE_DIR"] = str(out / f"state-gpu{gpu}")
    return env


def run_shards(
    files: list[Path], args: argparse.Namespace, shards: int, deadline: float, tag: str = "shard"
) -> list[dict]:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for shard in range(shards):
        mine = files[shard::shards]
        if not mine:
            continue
        cmd = [
            sys.executable,
            "-m",
            "gpuyantra.cli",
            "kernelbench",
            *(str(f.resolve()) for f in mine),  # run in this order
            "--device",
            args.device,
            "--out",
            str(out / f"{tag}{shard}" / "out"),
            "--max-iterations",
            str(args.max_iterations),
            "--json",
        ]
        log = open(out / f"{tag}{shard}.log", "w")
        env = shard_env(shard, args.gpus, out)
        procs.append((shard, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)))
    for shard, proc in procs:
        try:
            proc.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            print(f"{tag} {shard}: past --deadline-s, stopped; keeping the problems it finished", file=sys.stderr)
            proc.kill()
            proc.communicate()
    results = []
    for shard, _ in procs:
        # Written after every problem, so a stopped shard still reports what it finished.
        summary = out / f"{tag}{shard}" / "out" / "kernelbench.json"
        if summary.exists():
            results += json.loads(summary.read_text())["problems"]
    return results


def table(results: list[dict], device: str) -> str:
    lines = [f"{'problem':58s} {'status':11s} {'eager_us':>10s} {'new_us':>10s} {'speedup':>8s}  reason"]
    for r in sorted(results, key=lambda r: int(r["name"].split("_")[0]) if r["name"][0].isdigit() else 0):
        sp = f"{r['speedup']:.2f}" if r.get("speedup") else "-"
        mu = f"{r['model_us']:.1f}" if r.get("model_us") else "-"
        nu = f"{r['model_new_us']:.1f}" if r.get("model_new_us") else "-"
        lines.append(f"{r['name'][:58]:58s} {r['status']:11s} {mu:>10s} {nu:>10s} {sp:>8s}  {r['reason'][:150]}")
    n = len(results) or 1
    correct = sum(1 for r in results if r.get("correct"))
    fast1 = sum(1 for r in results if r.get("correct") and (r.get("speedup") or 0) > 1)
    fast1_best = sum(1 for r in results if r.get("correct") and (r.get("speedup_vs_best") or 0) > 1)
    lines.append(
        f"problems {len(results)}  fast_0 {correct / n:.2f}  fast_1 {fast1 / n:.2f} (vs eager)"
        f"  fast_1 {fast1_best / n:.2f} (vs the better of eager and torch.compile)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=1, help="deal the shards over this many GPUs of the host")
    parser.add_argument("--max-iterations", type=int, default=2)
    parser.add_argument("--out", default="kb_out")
    parser.add_argument("--only", default="", help="problem numbers and ranges, comma separated: 1-18,93,96")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="stop the shards after this long")
    parser.add_argument(
        "--order",
        choices=["slow-last", "number"],
        default="slow-last",
        help="slow-last: convolutions and matmuls last; number: in problem order",
    )
    args = parser.parse_args()
    only = problem_numbers(args.only) or None
    files = problem_files(Path(args.folder), only, args.order)
    started = time.time()
    deadline = started + args.deadline_s
    results = run_shards(files, args, args.shards, deadline)
    # Shards share the GPU's memory: a problem that ran out of it beside another shard runs again
    # alone, while time is left.
    oom = [r for r in results if "out of memory" in r.get("reason", "").lower()]
    if oom and args.shards > 1 and deadline - time.time() > 60:
        by_name = {f.stem: f for f in files}
        again = run_shards([by_name[r["name"]] for r in oom if r["name"] in by_name], args, 1, deadline, "alone")
        redone = {r["name"]: r for r in again}
        results = [redone.get(r["name"], r) for r in results]
        print(f"ran {len(again)} of {len(oom)} out-of-memory problems again alone", file=sys.stderr)
    Path(args.out, "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(table(results, args.device))
    print(f"wall {time.time() - started:.0f} s, {args.shards} shards")


if __name__ == "__main__":
    main()
