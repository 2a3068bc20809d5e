"""How long `gpuyantra verify FILE` takes as a user runs it: a new process for every verdict.

    python3 benchmarks/verify_cli_speed.py --out $OUT/cli [--templates rms_norm,softmax]
        [--warm-runs 2] [--parallel 6] [--parallel-rounds 2] [--parallel-templates rms_norm]
        [--where here|worker]

Each template (gpuyantra/kernels/<name>.py, the CLI's default shapes and dtypes on CUDA) gets a state
folder and compiler caches of its own, empty at first: one cold run (no cached baselines, no Triton or
inductor cache), then `--warm-runs` runs with what the cold run left. Then, for each of
`--parallel-templates`, `--parallel-rounds` rounds of `--parallel` processes started at once (each
after `--between-s` idle seconds) over that template's warm state folder (its GPU locks are shared
by them, as by every verification of one machine): the round's wall time (start to the last exit)
against the template's warm median, and each verdict's speedups against the single runs'.

`--where worker`: the same through this machine's GPU worker (`gpuyantra verify --where worker`):
the script starts a Temporal dev server and `gpuyantra worker all` on one fresh state folder (as
`gpuyantra up` does), waits until they poll, and every run uses them. The worker's state folder and
compiler caches are shared by all templates, so a template's first run ("cold") finds no baselines
of its own but the worker's children warm; the worker's start is reported apart (`worker_start_s`).

`--profile "gil,idle"` (with `--where worker`): py-spy samples the worker and its children (the
sandbox children included) over the rounds, one mode per round in turn, the first round unprofiled
as the reference: `gil` the threads holding the GIL, `idle` every thread, waiting or not. Raw
collapsed stacks (`<out>/pyspy-<template>-<round>-<mode>.txt`, one line per stack and its count).

Writes `<out>/cli_speed.json` after every run (a run cut short keeps what it measured) and prints one
line per run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = sorted(p.stem for p in (ROOT / "gpuyantra" / "kernels").glob("*.py") if p.stem != "__init__")


WORKER_ENV: dict[str, str] = {}  # --where worker: the worker's state folder and Temporal address


def _env(folder: Path) -> dict[str, str]:
    """The state folder and compiler caches of one template's runs (the worker's, with a worker)."""
    env = dict(os.environ)
    if WORKER_ENV:
        env.update(WORKER_ENV)
        return env
    env["GPUYANTRA_STATE_DIR"] = str(folder / "state")
    env["TRITON_CACHE_DIR"] = str(folder / "triton")
    env["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "inductor")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _start(template: str, folder: Path, device: str | None, where: str | None = "") -> subprocess.Popen:
    """`where` "" picks the script's mode (here, or worker when it started one); None leaves it out."""
    argv = [sys.executable, "-m", "gpuyantra.cli", "verify", str(ROOT / "gpuyantra" / "kernels" / f"{template}.py")]
    argv += ["--json"] + (["--device", device] if device else [])
    if where is not None:
        argv += ["--where", where or ("worker" if WORKER_ENV else "here")]
    return subprocess.Popen(argv, env=_env(folder), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen, started: float, timeout_s: float) -> dict[str, Any]:
    try:
        stdout, stderr = process.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - started)))
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
    row: dict[str, Any] = {"wall_s": round(time.perf_counter() - started, 2), "rc": process.returncode}
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        row["error"] = (stderr.strip().splitlines() or ["no output"])[-1][:300]
        return row
    verdict = json.loads(lines[-1])
    timings = verdict.get("timings") or {}
    row.update(
        verified_by=verdict.get("verified_by"),
        reward=verdict.get("reward"),
        verdict_s=verdict.get("seconds"),
        speedup_vs_eager=verdict.get("speedup_vs_eager"),
        speedup_vs_compile=verdict.get("speedup_vs_compile"),
        failures=[f.get("rule") for f in verdict.get("failures", [])],
        timings=timings,
    )
    return row


def run_auto(template: str, folder: Path, timeout_s: float) -> dict[str, Any]:
    """`gpuyantra verify FILE --json` with no --device and no --where, as a user types it."""
    started = time.perf_counter()
    return _finish(_start(template, folder, None, None), started, timeout_s)


def run_one(template: str, folder: Path, device: str, timeout_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    return _finish(_start(template, folder, device), started, timeout_s)


def run_round(template: str, folder: Path, device: str, count: int, timeout_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    processes = [_start(template, folder, device) for _ in range(count)]
    # Each command's wall ends when it does: finished one after another, a wall would be the longest so far.
    with ThreadPoolExecutor(max_workers=count) as pool:
        rows = list(pool.map(lambda process: _finish(process, started, timeout_s), processes))
    return {"wall_s": round(time.perf_counter() - started, 2), "runs": rows}


PYSPY_MODES = {"gil": ["--gil"], "idle": ["--idle"]}


def start_profile(pid: int, mode: str, path: Path) -> subprocess.Popen:
    """py-spy sampling `pid` and its children without pausing them, until stopped (SIGINT)."""
    argv = ["py-spy", "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "--rate", "200"]
    argv += [*PYSPY_MODES[mode], "--format", "raw", "--output", str(path)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)  # attached before the round starts
    return process


def stop_profile(process: subprocess.Popen) -> str:
    process.send_signal(2)
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
    return (err or "")[-500:]


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for template, runs in report["templates"].items():
        warm = [r["wall_s"] for r in runs.get("warm", []) if r.get("rc") == 0]
        cold = runs.get("cold") or {}
        summary[template] = {
            "cold_s": cold.get("wall_s"),
            "cold_rc": cold.get("rc"),
            "warm_median_s": round(statistics.median(warm), 2) if warm else None,
            "single_speedups": [r.get("speedup_vs_eager") for r in [cold, *runs.get("warm", [])]],
        }
        rounds = report["rounds"].get(template, [])
        if rounds and warm:
            walls = [r["wall_s"] for r in rounds]
            summary[template].update(
                round_walls_s=walls,
                round_over_one=[round(w / statistics.median(warm), 2) for w in walls],
                round_speedups=[[r.get("speedup_vs_eager") for r in rnd["runs"]] for rnd in rounds],
                round_all_accepted=all(r.get("rc") == 0 for rnd in rounds for r in rnd["runs"]),
                # The verifications' CPU in the process that judged them (a worker's interpreter lock)
                # and each command's time around its verdict, per round.
                round_parent_cpu_s=[round(sum(_parent_cpu(r) for r in rnd["runs"]), 3) for rnd in rounds],
                round_path_s=[[_path_s(r) for r in rnd["runs"]] for rnd in rounds],
            )
        summary[template]["single_path_s"] = [_path_s(r) for r in [cold, *runs.get("warm", [])]]
    return summary


PARENT_CPU_KEYS = ("parent_cpu", "load_outputs_cpu", "judge_outputs_cpu")


def _parent_cpu(run: dict[str, Any]) -> float:
    timings = run.get("timings") or {}
    return sum(float(timings.get(key) or 0.0) for key in PARENT_CPU_KEYS)


def _path_s(run: dict[str, Any]) -> float | None:
    """The command's wall time beyond its verdict's: process start, Temporal's round trips, exit."""
    wall, verdict = run.get("wall_s"), run.get("verdict_s")
    return round(wall - verdict, 2) if isinstance(wall, (int, float)) and isinstance(verdict, (int, float)) else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for cli_speed.json")
    parser.add_argument("--templates", default=",".join(TEMPLATES), help="comma-separated template names")
    parser.add_argument("--warm-runs", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=6, help="processes started at once in a round")
    parser.add_argument("--parallel-rounds", type=int, default=2)
    parser.add_argument("--parallel-templates", default="rms_norm", help="templates whose rounds are run")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke run of the script")
    parser.add_argument("--between-s", type=float, default=0.0, help="idle seconds before each round")
    parser.add_argument("--where", default="here", choices=["here", "worker"], help="where `gpuyantra verify` verifies")
    parser.add_argument("--timeout-s", type=float, default=180.0, help="limit of one run or one round")
    parser.add_argument("--profile", default="", help="py-spy modes over the rounds after the first: gil,idle")
    args = parser.parse_args()
    modes = [m.strip() for m in args.profile.split(",") if m.strip()]
    if set(modes) - set(PYSPY_MODES) or (modes and args.where != "worker"):
        parser.error(f"--profile takes {', '.join(PYSPY_MODES)} and needs --where worker")
    names = [n.strip() for n in args.templates.split(",") if n.strip()]
    unknown = sorted(set(names) - set(TEMPLATES))
    if unknown:
        parser.error(f"unknown templates {unknown}; choose from {', '.join(TEMPLATES)}")
    parallel = [n.strip() for n in args.parallel_templates.split(",") if n.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gy-cli-speed-"))
    report: dict[str, Any] = {"argv": sys.argv[1:], "templates": {}, "rounds": {}}
    managed = start_worker(work / "worker-state", report) if args.where == "worker" else []

    def save() -> None:
        report["summary"] = summarize(report)
        (out / "cli_speed.json").write_text(json.dumps(report, indent=1))

    # The templates with rounds first, each round right after its template's single runs.
    for template in sorted(names, key=lambda name: name not in parallel):
        runs: dict[str, Any] = report["templates"].setdefault(template, {"warm": []})
        runs["cold"] = run_one(template, work / template, args.device, args.timeout_s)
        print(template, "cold", runs["cold"], flush=True)
        save()
        for _ in range(args.warm_runs):
            runs["warm"].append(run_one(template, work / template, args.device, args.timeout_s))
            print(template, "warm", runs["warm"][-1], flush=True)
            save()
        for index in range(args.parallel_rounds if template in parallel else 0):
            time.sleep(args.between_s)  # the worker's spare children started for the last runs get ready
            mode = modes[(index - 1) % len(modes)] if modes and index > 0 else None
            path = out / f"pyspy-{template}-{index}-{mode}.txt"
            profiler = start_profile(managed[1].process.pid, mode, path) if mode else None
            rnd = run_round(template, work / template, args.device, args.parallel, args.timeout_s)
            if profiler is not None:
                rnd["profile"] = {"mode": mode, "file": path.name, "py_spy": stop_profile(profiler)}
            report["rounds"].setdefault(template, []).append(rnd)
            walls = [r.get("wall_s") for r in rnd["runs"]]
            print(template, f"{args.parallel} at once", rnd["wall_s"], walls, flush=True)
            save()
    if managed:  # what a plain `gpuyantra verify FILE` picks with the worker up (--where auto)
        report["auto"] = run_auto(names[0], work / names[0], args.timeout_s)
        print("auto", report["auto"].get("verified_by"), report["auto"].get("wall_s"), flush=True)
    save()
    print(json.dumps(report["summary"], indent=1))
    for process in reversed(managed):
        process.stop()
    return 0


def start_worker(state: Path, report: dict[str, Any]) -> list:
    """A Temporal dev server and `gpuyantra worker all` on `state`, as `gpuyantra up` starts them."""
    sys.path.insert(0, str(ROOT))
    from gpuyantra.processes import free_port, start_temporal
    from gpuyantra.processes import start_worker as start_worker_process

    state.mkdir(parents=True)
    started = time.perf_counter()
    temporal = start_temporal(state, port=free_port(), headless=True)
    address = temporal.info["address"]
    worker = start_worker_process("all", address, state, {"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    report["worker_start_s"] = round(time.perf_counter() - started, 2)
    WORKER_ENV.update(GPUYANTRA_STATE_DIR=str(state), TEMPORAL_ADDRESS=address)
    print("worker polling after", report["worker_start_s"], "s", flush=True)
    return [temporal, worker]


if __name__ == "__main__":
    sys.exit(main())
