#!/usr/bin/env python3
"""Scale-out on a machine with two GPUs: verification off the serving GPU, two campaigns at once.

1. `one-server`: a Temporal dev server, a CPU worker, one GPU worker per GPU (`gpuyantra worker gpu
   --device cuda:0` and `--device cuda:1`), `gpuyantra serve` on GPU 0 alone. Steady load (C
   clients streaming greedy completions without pause) runs the whole time; served tokens/s is
   counted per window before the campaign, during it and after it. The campaign's verifications
   must have started on GPU 1's worker (the workflow history's `verify_candidate` tasks: task queue
   and worker identity, which names the device's UUID), and served tokens/s during the campaign is
   compared with before (the spread of the windows before is the noise).
2. `two-servers`: a second server on GPU 1, then one campaign against each at once; both must
   deploy, and each one's verifications run on the other server's GPU (the one its server does not use).
3. `kernelbench` (with --kernelbench DIR): `benchmarks/kernelbench_sharded.py DIR --gpus 1` and
   `--gpus 2` over the same problems, timed.

Output in --out: `scale_out.json` (written after every part), `logs/`, the campaigns' results and
histories. Each part is bounded by its own limit; the GPU machine's commands stop at 10 minutes, so run
the parts in separate calls when the model is large:

    # device run, kind nvidia-h100-x2 (or nvidia-h200-x2), carry [".whl"]:
    source benchmarks/device_prelude.sh && python3 benchmarks/scale_out_bench.py --out $OUT/so --parts one-server
    source benchmarks/device_prelude.sh && python3 benchmarks/scale_out_bench.py --out $OUT/so --parts two-servers

Exit status 0 when every check of the parts run held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuyantra.processes import Managed, free_port, start_server, start_temporal, start_worker  # noqa: E402

PARTS = ("one-server", "two-servers", "kernelbench")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--parts", default="one-server,two-servers", help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--model", default="qwen2.5-1.5b", help="served preset (random weights)")
    p.add_argument("--ops", default="rms_norm,silu_mul", help="the campaigns' --ops")
    p.add_argument("--max-iterations", type=int, default=2)
    p.add_argument("--clients", type=int, default=4, help="concurrent streaming clients of the steady load")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--window-s", type=float, default=5.0, help="served tokens/s is counted per window")
    p.add_argument("--before-s", type=float, default=40.0, help="steady load measured before the campaign")
    p.add_argument("--campaign-timeout", type=float, default=420.0)
    p.add_argument("--kernelbench", type=Path, default=None, help="KernelBench problem folder (part kernelbench)")
    p.add_argument("--kb-only", default="19,23,24,33,34", help="problems of the KernelBench part")
    p.add_argument("--kb-timeout", type=float, default=280.0)
    return p.parse_args(argv)


def gpu_uuids() -> list[str]:
    """`GPU-...` of each visible GPU, as workers and servers name them (gpuyantra/hardware.py)."""
    from gpuyantra.hardware import gpu_uuid, visible_cuda_devices

    return [gpu_uuid(device) or device for device in visible_cuda_devices()]


class SteadyLoad:
    """C clients streaming greedy completions back to back; each token's arrival time is kept."""

    def __init__(self, url: str, clients: int, max_tokens: int) -> None:
        self.url, self.clients, self.max_tokens = url, clients, max_tokens
        self.arrivals: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _client(self, index: int) -> None:
        body = {"prompt": f"Client {index} tells a long story:", "max_tokens": self.max_tokens, "stream": True}
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                try:
                    with client.stream("POST", f"{self.url}/v1/completions", json=body) as response:
                        for line in response.iter_lines():
                            if line.startswith("data: {"):
                                with self._lock:
                                    self.arrivals.append(time.monotonic())
                except httpx.HTTPError as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.5)

    def windows(self, start: float, end: float, width: float) -> list[float]:
        """Tokens/s in each whole window of `width` seconds between `start` and `end`."""
        with self._lock:
            stamps = list(self.arrivals)
        count = int((end - start) // width)
        return [
            sum(1 for t in stamps if start + i * width <= t < start + (i + 1) * width) / width for i in range(count)
        ]


def figures(windows: list[float]) -> dict[str, Any]:
    if not windows:
        return {"windows": 0}
    median = statistics.median(windows)
    return {
        "windows": len(windows),
        "tokens_per_s": median,
        "min": min(windows),
        "max": max(windows),
        "relative_spread": (max(windows) - min(windows)) / median if median else None,
    }


async def verify_tasks(address: str, workflow_id: str) -> list[dict[str, str]]:
    """Each `verify_candidate` task of the campaign: the task queue it was scheduled on and the
    identity of the worker that started it (`<pid>@<host> gpuyantra-gpu <kind> <device>`)."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client

    client = await Client.connect(address)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    tasks = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            task = scheduled[event.activity_task_started_event_attributes.scheduled_event_id]
            if task.activity_type.name == "verify_candidate":
                identity = event.activity_task_started_event_attributes.identity
                tasks.append({"queue": task.task_queue.name, "identity": identity, "device": identity.split(" ")[-1]})
    return tasks


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.state = self.out / "state"
        self.token = secrets.token_urlsafe(16)
        self.result: dict[str, Any] = {"checks": {}, "gpus": gpu_uuids()}
        self.processes: list[Managed] = []
        self.address = ""
        # One attestation key for the workers and both servers (each server has its own state folder).
        os.environ.update(
            GPUYANTRA_STATE_DIR=str(self.state),
            GPUYANTRA_ADMIN_TOKEN=self.token,
            GPUYANTRA_ATTESTATION_KEY=secrets.token_hex(32),
            PYTHONUNBUFFERED="1",
        )

    def save(self) -> None:
        (self.out / "scale_out.json").write_text(json.dumps(self.result, indent=2, default=str))

    def check(self, name: str, ok: bool, detail: Any) -> None:
        self.result["checks"][name] = {"ok": bool(ok), "detail": detail}
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
        self.save()

    def start_stack(self) -> None:
        """Temporal, a CPU worker and one GPU worker per GPU (the servers trust every local port)."""
        temporal = start_temporal(self.state, port=free_port(), headless=True)
        self.processes.append(temporal)
        self.address = temporal.info["address"]
        self.processes.append(start_worker("cpu", self.address, self.state))
        for index in range(len(self.result["gpus"])):
            worker = start_worker(
                "gpu", self.address, self.state, extra_args=["--device", f"cuda:{index}"], name=f"worker-gpu{index}"
            )
            self.processes.append(worker)

    def serve(self, gpu: int) -> str:
        """`gpuyantra serve` on one GPU alone; registered with the workers' state folder (trusted)."""
        port = free_port()
        server = start_server(
            self.args.model,
            self.state / f"server-gpu{gpu}",
            port,
            self.token,
            device="cuda",
            extra_args=["--cuda-graphs"],
            env={"CUDA_VISIBLE_DEVICES": str(gpu)},
            timeout_s=300,
        )
        self.processes.append(server)
        servers = self.state / "servers"
        servers.mkdir(parents=True, exist_ok=True)
        (servers / f"gpu{gpu}.json").write_text(json.dumps({"url": server.info["url"]}))
        return server.info["url"]

    def optimize(self, url: str, label: str) -> subprocess.Popen:
        argv = [sys.executable, "-m", "gpuyantra.cli", "optimize", "--server", url, "--ops", self.args.ops]
        argv += ["--max-iterations", str(self.args.max_iterations), "--temporal", self.address, "--wait", "--json"]
        with (
            open(self.out / f"campaign-{label}.json", "w") as out,
            open(self.out / f"campaign-{label}.log", "w") as log,
        ):
            return subprocess.Popen(argv, stdout=out, stderr=log)  # the child keeps its own copies

    def finish(self, process: subprocess.Popen, label: str) -> dict[str, Any]:
        try:
            process.wait(timeout=self.args.campaign_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            return {"error": f"campaign {label} ran past {self.args.campaign_timeout:.0f} s"}
        text = (self.out / f"campaign-{label}.json").read_text().strip()
        try:
            return json.loads(text[text.rfind("\n{") + 1 :] if "\n{" in text else text)
        except ValueError:
            return {"error": f"campaign {label} printed no result (exit {process.returncode})"}

    def one_server(self) -> None:
        url = self.serve(0)
        gpus = self.result["gpus"]
        with SteadyLoad(url, self.args.clients, self.args.max_tokens) as load:
            time.sleep(5)  # the clients' first requests (graph capture of their batch) are no sample
            start = time.monotonic()
            time.sleep(self.args.before_s)
            began = time.monotonic()
            campaign = self.finish(self.optimize(url, "one-server"), "one-server")
            ended = time.monotonic()
            time.sleep(self.args.before_s / 2)
            after_end = time.monotonic()
        before = figures(load.windows(start, began, self.args.window_s))
        during = figures(load.windows(began, ended, self.args.window_s))
        after = figures(load.windows(ended, after_end, self.args.window_s))
        tasks = (
            asyncio.run(verify_tasks(self.address, campaign.get("workflow_id", "")))
            if "workflow_id" in campaign
            else []
        )
        self.result["one_server"] = {
            "server": url,
            "served": {"before": before, "during": during, "after": after},
            "load_errors": load.errors[:5],
            "verify_tasks": tasks,
            "deployed": [d.get("op") for d in campaign.get("deployed", [])],
            "campaign_error": campaign.get("error"),
        }
        self.check("campaign ran", "workflow_id" in campaign, campaign.get("error") or campaign.get("workflow_id"))
        on_gpu1 = bool(tasks) and all(task["device"] == gpus[1] for task in tasks)
        self.check("verifications on GPU 1", on_gpu1, sorted({task["device"] for task in tasks}))
        noise = before.get("relative_spread") or 0.0
        drop = (
            1 - during["tokens_per_s"] / before["tokens_per_s"]
            if before.get("tokens_per_s") and during.get("tokens_per_s")
            else None
        )
        self.check(
            "served tokens/s during the campaign within noise",
            drop is not None and drop <= max(noise, 0.03),
            {"drop": drop, "noise": noise, "before": before, "during": during},
        )

    def two_servers(self) -> None:
        urls = [self.result.get("one_server", {}).get("server") or self.serve(0), self.serve(1)]
        gpus = self.result["gpus"]
        started = time.monotonic()
        running = [self.optimize(url, f"server-gpu{i}") for i, url in enumerate(urls)]
        campaigns = [self.finish(p, f"server-gpu{i}") for i, p in enumerate(running)]
        record: dict[str, Any] = {"seconds": time.monotonic() - started, "campaigns": []}
        for index, campaign in enumerate(campaigns):
            tasks = (
                asyncio.run(verify_tasks(self.address, campaign["workflow_id"])) if "workflow_id" in campaign else []
            )
            record["campaigns"].append(
                {
                    "server_gpu": index,
                    "deployed": [d.get("op") for d in campaign.get("deployed", [])],
                    "rejected": [(r.get("op"), r.get("reason")) for r in campaign.get("rejected", [])],
                    "verify_devices": sorted({t["device"] for t in tasks}),
                    "error": campaign.get("error"),
                }
            )
            other = gpus[1 - index]
            self.check(
                f"campaign on GPU {index}'s server deployed", bool(campaign.get("deployed")), record["campaigns"][-1]
            )
            self.check(
                f"campaign on GPU {index}'s server verified on the other GPU",
                bool(tasks) and all(t["device"] == other for t in tasks),
                sorted({t["device"] for t in tasks}),
            )
        self.result["two_servers"] = record

    def kernelbench(self) -> None:
        if self.args.kernelbench is None:
            self.check("kernelbench", False, "--kernelbench DIR not given")
            return
        times = {}
        for gpus in (1, 2):
            argv = [sys.executable, str(REPO / "benchmarks" / "kernelbench_sharded.py"), str(self.args.kernelbench)]
            argv += ["--device", "cuda", "--shards", "4", "--gpus", str(gpus), "--max-iterations", "2"]
            argv += ["--only", self.args.kb_only, "--out", str(self.out / f"kb-gpus{gpus}")]
            t0 = time.monotonic()
            code = subprocess.call(argv, timeout=self.args.kb_timeout)
            times[gpus] = {"seconds": time.monotonic() - t0, "exit": code}
        self.result["kernelbench"] = times
        ratio = times[2]["seconds"] / times[1]["seconds"]
        self.check("kernelbench on two GPUs takes about half the time", ratio < 0.65, {"ratio": ratio, **times})

    def run(self) -> int:
        parts = [p.strip() for p in self.args.parts.split(",") if p.strip()]
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            print(f"scale_out_bench: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
            return 2
        if len(self.result["gpus"]) < 2:
            print(f"scale_out_bench: needs two GPUs, sees {len(self.result['gpus'])}")
            return 2
        try:
            if {"one-server", "two-servers"} & set(parts):
                self.start_stack()
            for part in parts:
                try:
                    getattr(self, part.replace("-", "_"))()
                except Exception as exc:  # noqa: BLE001 - recorded; the next part runs where it can
                    self.check(f"{part} ran", False, f"{type(exc).__name__}: {exc}")
        finally:
            for managed in reversed(self.processes):
                managed.stop()
            self.save()
        return 0 if all(c["ok"] for c in self.result["checks"].values()) else 1


def main(argv: list[str] | None = None) -> int:
    return Bench(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
