"""What a worker's Temporal round trips cost: by interpreter switch interval under busy threads, and
by the dev server's SQLite journal.

    python3 benchmarks/temporal_round_trips.py [--threads 6] [--burst-ms 3] [--duty 0.3]
        [--switch-ms 5,1] [--sqlite wal] [--rounds 6] [--repeats 2]

A Temporal dev server on loopback (`--sqlite`: `wal`, as `gpuyantra up` starts it, and/or
`default`, SQLite's own journal); in a process of its own a workflow worker and an activity worker
(as `gpuyantra worker all` runs them) and `--threads` threads that each hold the interpreter lock for
`--burst-ms` at a time, `--duty` of their time (a stand-in for verifications reading and judging
outputs in the worker); in another process a client starting six workflows at once, each one
activity that sleeps 1 s, `--rounds` times. Reported per round: the round's wall time beyond the 1 s
activity (the Temporal round trips). Server settings and switch intervals take turns, `--repeats`
times, a new server per setting and a new worker process per run. Prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow

WORKFLOW_QUEUE, ACTIVITY_QUEUE = "gil-workflows", "gil-activities"
ACTIVITY_S = 1.0
PARALLEL = 6


@workflow.defn(name="GilRoundTrip")
class GilRoundTrip:
    @workflow.run
    async def run(self, payload: dict) -> dict:
        return await workflow.execute_activity(
            "sleep_a_while", payload, task_queue=ACTIVITY_QUEUE, start_to_close_timeout=timedelta(seconds=60)
        )


@activity.defn(name="sleep_a_while")
def sleep_a_while(payload: dict) -> dict:
    time.sleep(ACTIVITY_S)
    return payload


def hold_the_lock(burst_s: float, duty: float, stop: threading.Event) -> None:
    """Spin in Python for `burst_s` (holding the interpreter lock), then sleep, `duty` of the time busy."""
    while not stop.is_set():
        until = time.perf_counter() + burst_s
        spins = 0
        while time.perf_counter() < until:
            spins += 1
        time.sleep(burst_s * (1 - duty) / duty)


async def client_rounds(address: str, rounds: int) -> list[float]:
    from temporalio.client import Client

    client = await Client.connect(address)
    beyond = []
    for r in range(rounds):
        started = time.perf_counter()
        await asyncio.gather(
            *(
                client.execute_workflow(
                    "GilRoundTrip", {"i": i}, id=f"gil-{r}-{i}-{time.time_ns()}", task_queue=WORKFLOW_QUEUE
                )
                for i in range(PARALLEL)
            )
        )
        beyond.append(round(time.perf_counter() - started - ACTIVITY_S, 3))
    return beyond


async def worker_run(address: str, threads: int, burst_s: float, duty: float, rounds: int) -> list[float]:
    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(address)
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as executor:
        async with (
            Worker(client, task_queue=WORKFLOW_QUEUE, workflows=[GilRoundTrip]),
            Worker(client, task_queue=ACTIVITY_QUEUE, activities=[sleep_a_while], activity_executor=executor),
        ):
            for _ in range(threads):
                threading.Thread(target=hold_the_lock, args=(burst_s, duty, stop), daemon=True).start()
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--client", address, "--rounds", str(rounds), stdout=subprocess.PIPE
                )
                out, _ = await proc.communicate()
            finally:
                stop.set()
    return json.loads(out)


def one_run(args: argparse.Namespace, switch_ms: float) -> dict:
    """A new worker process per run: its own switch interval, nothing warm from the last."""
    argv = [sys.executable, __file__, "--worker", args.address, "--switch-ms", str(switch_ms)]
    argv += ["--threads", str(args.threads), "--burst-ms", str(args.burst_ms), "--duty", str(args.duty)]
    argv += ["--rounds", str(args.rounds)]
    beyond = json.loads(subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True, timeout=600).stdout)
    return {
        "sqlite": args.sqlite_mode,
        "switch_ms": switch_ms,
        "threads": args.threads,
        "burst_ms": args.burst_ms,
        "duty": args.duty,
        "beyond_activity_s": beyond,
        "median_s": round(statistics.median(beyond), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=PARALLEL)
    parser.add_argument("--burst-ms", type=float, default=3.0)
    parser.add_argument("--duty", type=float, default=0.3)
    parser.add_argument("--switch-ms", default="5,1")
    parser.add_argument("--sqlite", default="wal", help="comma-separated: wal, default")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--worker", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 < args.duty < 1:
        parser.error("--duty must lie between 0 and 1")
    if args.client:
        print(json.dumps(asyncio.run(client_rounds(args.client, args.rounds))), flush=True)
        os._exit(0)  # past the SDK's threads, which can abort the interpreter's finalization
    if args.worker:
        sys.setswitchinterval(float(args.switch_ms) / 1000)
        beyond = asyncio.run(worker_run(args.worker, args.threads, args.burst_ms / 1000, args.duty, args.rounds))
        print(json.dumps(beyond), flush=True)
        os._exit(0)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for gpuyantra
    from gpuyantra.processes import free_port, start_temporal

    intervals = [float(v) for v in args.switch_ms.split(",")]
    modes = args.sqlite.split(",")
    if not set(modes) <= {"wal", "default"}:
        parser.error("--sqlite takes wal and/or default")
    for _ in range(args.repeats):
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix="gy-round-trips-") as folder:
                temporal = start_temporal(Path(folder), port=free_port(), headless=True, sqlite_wal=mode == "wal")
                try:
                    args.address, args.sqlite_mode = temporal.info["address"], mode
                    for switch_ms in intervals:
                        print(json.dumps(one_run(args, switch_ms)), flush=True)
                finally:
                    temporal.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
