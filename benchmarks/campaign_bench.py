#!/usr/bin/env python3
# Over 600 lines: one end-to-end GPU run (servers, workers, campaigns), a single script for a GPU host.
"""A real campaign end to end, timed: Temporal dev server, GPU and CPU workers, `gpuyantra serve`,
served tokens/s before and after, a cold and a warm `gpuyantra optimize --wait --json`.

Everything runs as a user would run it, on 127.0.0.1 with free ports and a fresh state folder (so the
first campaign is cold: empty skill library, no Temporal history):

1. `temporal server start-dev` (SQLite in the state folder, the project's search attributes, Web UI on
   the gRPC port + 1000), `gpuyantra worker cpu` and `gpuyantra worker gpu` (separate queues, as on a
   real deployment), `gpuyantra serve --model M --random-weights --cuda-graphs --admin-token T`.
2. `before`: served decode tokens/s at each batch (default 1 and 8) through HTTP (C concurrent clients
   on `/v1/completions`, greedy, completion tokens over wall time, median of --http-repeats runs of at
   least 4 requests per client) and
   in-process (`POST /admin/benchmark`, mode `benchmark`: median of repeats with their spread), a
   recorded greedy completion of a fixed prompt (text and token ids), and the greedy continuation of
   that prompt's bytes sent as token ids with each token's top-two margin (`forced`).
3. `cold`: `gpuyantra optimize --wait --json` (no `--ops` unless given: the profiler picks the top
   targets), timed from start to exit; the first deployment's time comes from the workflow history
   (`temporal workflow show --output json`: when the first `deploy_kernel` activity completed).
4. `warm`: `POST /admin/rollback {"all": true}` (then the greedy completion must equal the recorded
   one: the original forward is back), then the same campaign again: the skill library seeds it.
5. `after`: the measurements of `before` with the warm campaign's kernels in, the greedy completion
   compared with the recorded one (free-running, and teacher-forced: `forced_comparison` feeds the
   recorded token at each difference and names the differences that were near ties), `/admin/kernels`.
6. `reports`: `gpuyantra report CAMPAIGN_ID --out` for both campaigns.
7. `compile`: torch.compile (reduce-overhead, static KV cache) of the same model in a separate
   process, `benchmarks/serving_bench.py --only-compile` (skipped on a CPU, or with --skip-compile).

Every phase is bounded by its own timeout and by --budget-s for the whole run; a phase that fails or
times out is recorded in the JSON and the next phase runs where it can. Every process started is
stopped at the end (also on SIGTERM). Output in --out: `campaign_bench.json` (all figures; written
after every phase), `campaign-{cold,warm}.json` (the results), `history-{cold,warm}.json` (the
workflow histories), `report-{cold,warm}.html`, `compile.json`, `logs/` (Temporal, workers, server,
each optimize with a timestamp per progress line). A short table is printed at the end.

    # GPU (H200), from the repository root after `source benchmarks/device_prelude.sh`:
    python3 benchmarks/campaign_bench.py --out $OUT/campaign --max-targets 2 --max-iterations 2
    # CPU smoke (tiny-qwen2, Triton interpreter, rms_norm only; about a minute on 2 idle cores):
    .venv/bin/python benchmarks/campaign_bench.py --smoke --out /tmp/campaign-smoke

Exit status: 0 when every selected phase succeeded, 1 otherwise.

One file of about a thousand lines on purpose: it is the script a GPU machine runs bare (one
device call, nothing installed but the project), and it reads top to bottom in the order of the
phases above; its parts are used nowhere else.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import functools
import importlib.metadata
import json
import multiprocessing
import os
import re
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from gpuyantra.config import search_attribute_args  # noqa: E402
from gpuyantra.processes import SQLITE_WAL_PRAGMAS, Managed, free_port, port_open, temporal_binary  # noqa: E402

PHASES = ("before", "cold", "warm", "after", "reports", "bisect", "compile")
STACK_PHASES = {"before", "cold", "warm", "after", "reports", "bisect"}
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
# The teacher-forced check sends token ids: the prompt's bytes, ids every vocabulary holds.
FORCED_PROMPT_IDS = list(PROMPT.encode())
RESERVE_S = 25.0  # kept from --budget-s for stopping everything and writing the JSON
MIN_PHASE_S = 5.0  # a phase given less than this is skipped as out of time
HTTP_REQUESTS_PER_CLIENT = 4

GPU_DEFAULTS: dict[str, Any] = {
    "model": "qwen2.5-1.5b",
    "batches": "1,8",
    "http_requests": 16,
    "http_repeats": 3,
    "max_tokens": 64,
    "prompt_tokens": 32,
    "bench_repeats": 5,
    "greedy_tokens": 32,
    "budget_s": 520.0,
    "start_timeout": 180.0,
    "measure_timeout": 90.0,
    "campaign_timeout": 300.0,
    "report_timeout": 60.0,
    "compile_timeout": 240.0,
}
SMOKE_DEFAULTS: dict[str, Any] = {
    "model": "tiny-qwen2",
    "batches": "1,2",
    "http_requests": 2,
    "http_repeats": 1,
    "max_tokens": 6,
    "prompt_tokens": 4,
    "bench_repeats": 2,
    "greedy_tokens": 8,
    "budget_s": 1500.0,
    "start_timeout": 180.0,
    "measure_timeout": 180.0,
    "campaign_timeout": 480.0,
    "report_timeout": 90.0,
    "compile_timeout": 180.0,
    "ops": "rms_norm",
    "max_iterations": 2,
    "min_reward": 1,
}


class PhaseTimeout(Exception):
    pass


class PhaseFailed(Exception):
    pass


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self, what: str) -> float:
        left = self.left()
        if left <= 0:
            raise PhaseTimeout(f"out of time before {what}")
        return left


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (created)")
    p.add_argument("--model", default=None, help="served model (default qwen2.5-1.5b; --smoke: tiny-qwen2)")
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)} (the stack starts when any but compile is asked)",
    )
    p.add_argument("--skip-compile", action="store_true", help="leave out the torch.compile phase")
    p.add_argument("--smoke", action="store_true", help="CPU: tiny-qwen2, Triton interpreter, tiny counts, rms_norm")
    p.add_argument("--state-dir", default=None, help="state folder (default: a fresh temporary one: a cold start)")
    p.add_argument("--batches", default=None, help="decode batches measured (default 1,8; --smoke 1,2)")
    p.add_argument("--http-requests", type=int, default=None, help="requests per HTTP run (at least 4 per client)")
    p.add_argument("--http-repeats", type=int, default=None, help="HTTP runs per batch (median, min, max)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens generated per request / benchmark row")
    p.add_argument("--prompt-tokens", type=int, default=None, help="prompt length of /admin/benchmark rows")
    p.add_argument("--bench-repeats", type=int, default=None, help="/admin/benchmark repeats (1..20)")
    p.add_argument("--greedy-tokens", type=int, default=None, help="tokens of the recorded greedy completion")
    p.add_argument(
        "--near-tie-nats",
        type=float,
        default=0.05,
        help="a teacher-forced difference where the recorded top two lay closer than this is a near tie",
    )
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        help="extra `gpuyantra serve` argument, repeatable, with `=`: --serve-arg=--max-seq-len=512",
    )
    campaign = p.add_argument_group("campaign (passed to `gpuyantra optimize`)")
    campaign.add_argument(
        "--ops",
        default=None,
        help="op families, comma separated (default: the profiler's top targets; `auto` says so in --smoke, "
        "whose default is rms_norm)",
    )
    campaign.add_argument("--max-targets", type=int, default=None)
    campaign.add_argument("--max-iterations", type=int, default=None)
    campaign.add_argument("--min-reward", type=int, default=None)
    campaign.add_argument("--device", choices=["cpu", "cuda"], default=None, help="where candidates are verified")
    campaign.add_argument("--require-approval", action="store_true", help="(waits for a signal: not for timing)")
    campaign.add_argument(
        "--warm-runs",
        type=int,
        default=1,
        help="warm campaigns in a row (each after rolling everything back: warm, warm2, ...); the result "
        "says whether every campaign deployed the same kernels",
    )
    limits = p.add_argument_group("time limits, seconds")
    limits.add_argument("--budget-s", type=float, default=None, help="the whole run (default 520; --smoke 1500)")
    limits.add_argument("--start-timeout", type=float, default=None, help="Temporal, workers and server ready")
    limits.add_argument("--measure-timeout", type=float, default=None, help="each of before / after")
    limits.add_argument("--campaign-timeout", type=float, default=None, help="each campaign")
    limits.add_argument("--report-timeout", type=float, default=None, help="each report")
    limits.add_argument("--compile-timeout", type=float, default=None, help="the torch.compile process")
    args = p.parse_args(argv)
    for key, value in (SMOKE_DEFAULTS if args.smoke else GPU_DEFAULTS).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    unknown = [x for x in phases if x not in PHASES]
    if unknown:
        p.error(f"unknown phase(s) {unknown}; choose from {','.join(PHASES)}")
    args.phase_list = [x for x in PHASES if x in phases and not (x == "compile" and args.skip_compile)]
    args.batch_list = [int(b) for b in str(args.batches).split(",") if b.strip()]
    if args.warm_runs < 1:
        p.error("--warm-runs must be at least 1")
    return args


# ------------------------------------------------------------------ helpers on results


def payload_value(payload: Any) -> Any:
    """One Temporal payload of `temporal workflow show --output json`: base64 JSON in `data`, or already decoded."""
    if isinstance(payload, dict) and isinstance(payload.get("data"), str):
        try:
            return json.loads(base64.b64decode(payload["data"]))
        except (ValueError, json.JSONDecodeError):
            return payload["data"]
    return payload


def event_kind(event: dict[str, Any]) -> str:
    """`EVENT_TYPE_ACTIVITY_TASK_COMPLETED` or `ActivityTaskCompleted` -> `ACTIVITY_TASK_COMPLETED`."""
    kind = str(event.get("eventType", ""))
    if kind.startswith("EVENT_TYPE_"):
        return kind[len("EVENT_TYPE_") :]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).upper()


def event_time(event: dict[str, Any]) -> float | None:
    text = event.get("eventTime")
    if not isinstance(text, str):
        return None
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?$", text)
    if not match:
        return None
    stamp = datetime.fromisoformat(match.group(1) + (match.group(3) or "Z").replace("Z", "+00:00"))
    return stamp.replace(tzinfo=stamp.tzinfo or UTC).timestamp() + float("0." + (match.group(2) or "0"))


def event_attributes(event: dict[str, Any]) -> dict[str, Any]:
    for key, value in event.items():
        if key.endswith("EventAttributes") and isinstance(value, dict):
            return value
    return {}


def activity_timeline(events: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    """Each activity of a campaign's history (scheduled -> closed, seconds from the optimize command's
    start `t0` and from the workflow's start), the deployments among them, and totals per activity."""
    scheduled: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    workflow_start = workflow_end = None
    closed_as = None
    for event in events:
        kind, at, attrs = event_kind(event), event_time(event), event_attributes(event)
        if kind == "WORKFLOW_EXECUTION_STARTED":
            workflow_start = at
        elif kind.startswith("WORKFLOW_EXECUTION_") and kind.split("_")[-1] in (
            "COMPLETED",
            "FAILED",
            "TERMINATED",
            "CANCELED",
        ):
            workflow_end, closed_as = at, kind.split("_")[-1].lower()
        elif kind == "ACTIVITY_TASK_SCHEDULED":
            name = (attrs.get("activityType") or {}).get("name")
            summary = payload_value((event.get("userMetadata") or {}).get("summary"))
            inputs = [payload_value(x) for x in (attrs.get("input") or {}).get("payloads") or []]
            target = inputs[0].get("target") if inputs and isinstance(inputs[0], dict) else None
            row: dict[str, Any] = {
                "activity": name,
                "summary": summary if isinstance(summary, str) else None,
                "op": target.get("op") if isinstance(target, dict) else None,
                "scheduled": at,
            }
            scheduled[str(event.get("eventId"))] = row
            rows.append(row)
        elif kind.startswith("ACTIVITY_TASK_") and kind != "ACTIVITY_TASK_STARTED":
            closed = scheduled.get(str(attrs.get("scheduledEventId")))
            if closed is not None:
                closed["closed"], closed["outcome"] = at, kind[len("ACTIVITY_TASK_") :].lower()
    base = workflow_start or t0

    def offset(stamp: float | None, origin: float | None) -> float | None:
        return None if stamp is None or origin is None else round(stamp - origin, 2)

    activities = []
    totals: dict[str, dict[str, Any]] = {}
    for row in rows:
        seconds = offset(row.get("closed"), row["scheduled"])
        activities.append(
            {
                "activity": row["activity"],
                "op": row["op"],
                "summary": row["summary"],
                "outcome": row.get("outcome", "open"),
                "start_s": offset(row["scheduled"], base),
                "seconds": seconds,
            }
        )
        total = totals.setdefault(str(row["activity"]), {"count": 0, "seconds": 0.0, "max_s": 0.0})
        total["count"] += 1
        total["seconds"] = round(total["seconds"] + (seconds or 0.0), 2)
        total["max_s"] = max(total["max_s"], seconds or 0.0)
    deploys: list[dict[str, Any]] = [
        {
            "op": row["op"] or str(row["summary"] or "").removeprefix("deploy "),
            "outcome": row.get("outcome", "open"),
            "completed_s": offset(row.get("closed"), t0),
            "completed_workflow_s": offset(row.get("closed"), workflow_start),
        }
        for row in rows
        if row["activity"] == "deploy_kernel"
    ]
    done = [d for d in deploys if d["outcome"] == "completed" and d["completed_s"] is not None]
    first = min(done, key=lambda d: d["completed_s"]) if done else None
    return {
        "workflow_s": offset(workflow_end, workflow_start),
        "workflow_started_s": offset(workflow_start, t0),
        "closed_as": closed_as,
        "first_deploy_s": first["completed_s"] if first else None,
        "first_deploy_workflow_s": first["completed_workflow_s"] if first else None,
        "first_deploy_op": first["op"] if first else None,
        "deploy_activities": deploys,
        "rollback_activities": sum(1 for row in rows if row["activity"] == "rollback_swap"),
        "activity_totals": totals,
        "activities": activities,
    }


def summarize_result(result: dict[str, Any]) -> dict[str, Any]:
    """What the bench keeps of a campaign result: deployments with op, rewards and speedups, rejections."""

    def verdict_figures(entry: dict[str, Any]) -> dict[str, Any]:
        verdict = entry.get("verdict") or {}
        return {key: verdict.get(key) for key in ("device", "kernel_us", "eager_us", "compile_us", "floor_us")}

    deployed = [
        {
            **{
                key: d.get(key)
                for key in (
                    "op",
                    "module_class",
                    "variant",
                    "modules",
                    "reward",
                    "speedup_vs_eager",
                    "speedup_vs_compile",
                    "iterations",
                    "best_iteration",
                    "seed_skill_id",
                    "skill_id",
                    "swap_id",
                )
            },
            **verdict_figures(d),
            "served_speed": d.get("served_speed"),
        }
        for d in result.get("deployed") or []
    ]
    rejected = [
        {
            **{
                key: r.get(key)
                for key in ("op", "module_class", "reward", "speedup_vs_eager", "speedup_vs_compile", "iterations")
            },
            "seed_skill_id": r.get("seed_skill_id"),
            "skill_id": r.get("skill_id"),
            "reason": r.get("reason"),
            **verdict_figures(r),
        }
        for r in result.get("rejected") or []
    ]
    attempts = sum(
        len(x.get("attempts") or []) for x in (result.get("deployed") or []) + (result.get("rejected") or [])
    )
    return {
        "model": result.get("model"),
        "hardware": result.get("hardware"),
        "deployed": deployed,
        "rejected": rejected,
        "rolled_back": [r for r in rejected if str(r.get("reason") or "").startswith("rolled back")],
        "seeded_targets": sum(1 for x in deployed + rejected if x.get("seed_skill_id")),
        "attempts": attempts,
        "e2e": result.get("e2e"),
        "served_speed": result.get("served_speed"),
        "warnings": result.get("warnings") or [],
    }


def spread_of(samples: list[float]) -> dict[str, Any]:
    median = statistics.median(samples)
    return {
        "tokens_per_s": round(median, 2),
        "tokens_per_s_min": round(min(samples), 2),
        "tokens_per_s_max": round(max(samples), 2),
        "relative_spread": round((max(samples) - min(samples)) / median, 4) if median > 0 else 0.0,
        "runs": len(samples),
    }


# ------------------------------------------------------------------ the bench


class CampaignBench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.state = Path(args.state_dir or tempfile.mkdtemp(prefix="gy-campaign-bench-")).resolve()
        self.state.mkdir(parents=True, exist_ok=True)
        self.token = "bench-" + secrets.token_hex(12)
        self.procs: list[Managed] = []
        self.started = time.monotonic()
        self.deadline = Deadline(args.budget_s)
        self.url = ""
        self.address = ""
        self.device = "cpu" if args.smoke else "cuda"
        self.result: dict[str, Any] = {
            "config": {k: v for k, v in vars(args).items() if k != "phase_list"},
            "phases_selected": args.phase_list,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "state_dir": str(self.state),
            "phases": {},
            "warnings": [],
        }

    # -------------------------------------------------------------- bookkeeping
    def save(self) -> None:
        self.result["elapsed_s"] = round(time.monotonic() - self.started, 1)
        (self.out / "campaign_bench.json").write_text(json.dumps(self.result, indent=1, default=str))

    def warn(self, text: str) -> None:
        self.result["warnings"].append(text)
        print(f"WARNING: {text}", flush=True)

    def phase(self, name: str, timeout_s: float, fn: Callable[[Deadline], Any]) -> bool:
        """Run one phase within min(its timeout, what --budget-s leaves); record how it went."""
        left = self.deadline.left() - RESERVE_S
        limit = min(timeout_s, left)
        record: dict[str, Any] = {"limit_s": round(limit, 1)}
        self.result["phases"][name] = record
        if limit < MIN_PHASE_S:
            record.update(status="skipped", reason=f"out of time (--budget-s {self.args.budget_s:.0f} spent)")
            print(f"[{name}] skipped: out of time", flush=True)
            self.save()
            return False
        print(f"[{name}] start (limit {limit:.0f}s, {time.monotonic() - self.started:.0f}s elapsed)", flush=True)
        t0 = time.monotonic()
        try:
            fn(Deadline(limit))
            record["status"] = "ok"
        except PhaseTimeout as exc:
            record.update(status="timeout", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - recorded; the next phase runs where it can
            record.update(
                status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-2500:]
            )
        except BaseException:  # SIGTERM (SystemExit) or Ctrl-C: recorded, then everything is stopped
            record.update(status="interrupted", seconds=round(time.monotonic() - t0, 1))
            self.save()
            raise
        record["seconds"] = round(time.monotonic() - t0, 1)
        print(f"[{name}] {record['status']} in {record['seconds']}s {record.get('error', '')}".rstrip(), flush=True)
        self.save()
        return record["status"] == "ok"

    # -------------------------------------------------------------- processes
    def launch(self, name: str, argv: list[str], stdout: Path | None = None, stamped: bool = False) -> Managed:
        """Start a child in its own session (stopped with its children), logged to logs/<name>.log;
        `stdout` apart when given; `stamped`: each stderr line with the seconds since its start."""
        log_path = self.logs / f"{name}.log"
        log = open(log_path, "a", buffering=1)  # noqa: SIM115 - closed when the child's output ends
        log.write(f"$ {shlex.join(argv)}\n")
        out = open(stdout, "wb") if stdout else log  # noqa: SIM115 - handed to the child
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.PIPE if stamped else subprocess.STDOUT if stdout is None else log,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            start_new_session=True,
            text=stamped,
        )
        managed = Managed(name=name, process=process, log_path=log_path)
        self.procs.append(managed)
        if stdout:
            out.close()
        if stamped:
            t0 = time.monotonic()

            def pump() -> None:
                assert process.stderr is not None
                for line in process.stderr:
                    log.write(f"[{time.monotonic() - t0:7.1f}s] {line}")
                log.close()

            threading.Thread(target=pump, daemon=True).start()
        else:
            log.close()
        return managed

    def run_command(self, name: str, argv: list[str], deadline: Deadline, stdout: Path | None = None) -> int | None:
        """Run a command to its end within the deadline: its exit code, None when it was stopped."""
        managed = self.launch(name, argv, stdout=stdout, stamped=True)
        while managed.process.poll() is None and deadline.left() > 0:
            time.sleep(0.2)
        if managed.process.poll() is None:
            managed.stop()
            return None
        time.sleep(0.1)  # let the stderr pump write the last lines
        return managed.process.returncode

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "gpuyantra.cli", *args]

    def stop_all(self) -> None:
        for managed in reversed(self.procs):
            try:
                managed.stop()
            except Exception as exc:  # noqa: BLE001 - stop the others anyway
                print(f"stopping {managed.name}: {exc}", flush=True)

    # -------------------------------------------------------------- phase: start
    def start_stack(self, deadline: Deadline) -> None:
        """Temporal dev server, then the workers and the server together; every one ready or a failure."""
        record = self.result["stack"] = {"state_dir": str(self.state)}
        os.environ.update(
            GPUYANTRA_STATE_DIR=str(self.state),
            GPUYANTRA_ADMIN_TOKEN=self.token,
            PYTHONUNBUFFERED="1",
        )
        if self.args.smoke:
            os.environ["TRITON_INTERPRET"] = "1"
        port = ui_port = 0
        for _ in range(50):  # the Web UI on gRPC + 1000, as `optimize` prints its links
            port = 20000 + secrets.randbelow(20000)
            ui_port = port + 1000
            if not port_open("127.0.0.1", port) and not port_open("127.0.0.1", ui_port):
                break
        self.address = f"127.0.0.1:{port}"
        os.environ["TEMPORAL_ADDRESS"] = self.address
        t0 = time.monotonic()
        argv = [temporal_binary(), "server", "start-dev", "--db-filename", str(self.state / "temporal.db")]
        argv += ["--ip", "127.0.0.1", "--port", str(port), "--ui-port", str(ui_port), "--log-level", "warn"]
        argv += ["--ui-disable-news-fetch", *search_attribute_args(), *SQLITE_WAL_PRAGMAS]
        temporal = self.launch("temporal", argv)
        self.wait_ready({"temporal": (temporal, lambda: port_open("127.0.0.1", port))}, deadline, record, t0)
        record.update(temporal=self.address, web_ui=f"http://127.0.0.1:{ui_port}")

        server_port = free_port()
        self.url = f"http://127.0.0.1:{server_port}"
        serve = ["serve", "--model", self.args.model, "--random-weights", "--device", self.device]
        serve += ["--host", "127.0.0.1", "--port", str(server_port), "--admin-token", self.token]
        serve += ["--state-dir", str(self.state), "--log-level", "info"]
        serve += ([] if self.args.smoke else ["--cuda-graphs"]) + list(self.args.serve_arg)
        record["serve_command"] = shlex.join(["gpuyantra", *serve]).replace(self.token, "$TOKEN")
        t0 = time.monotonic()
        workers = {
            role: self.launch(f"worker-{role}", self.cli("worker", role, "--temporal", self.address))
            for role in ("cpu", "gpu")
        }
        server = self.launch("server", self.cli(*serve))

        def polling(managed: Managed) -> Callable[[], bool]:
            return lambda: "polling" in managed.log_tail(200)

        checks = {f"worker-{role}": (m, polling(m)) for role, m in workers.items()}
        checks["server"] = (server, lambda: self.ready())
        self.wait_ready(checks, deadline, record, t0)
        record["readyz"] = httpx.get(f"{self.url}/readyz", timeout=10).json()
        record["server"] = self.url

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    def wait_ready(
        self,
        checks: dict[str, tuple[Managed, Callable[[], bool]]],
        deadline: Deadline,
        record: dict[str, Any],
        t0: float,
    ) -> None:
        pending = dict(checks)
        ready_s = record.setdefault("ready_s", {})
        while pending:
            for name, (managed, check) in list(pending.items()):
                if managed.process.poll() is not None:
                    raise PhaseFailed(
                        f"{name} exited with {managed.process.returncode} before it was ready:\n{managed.log_tail(15)}"
                    )
                if check():
                    ready_s[name] = round(time.monotonic() - t0, 1)
                    print(f"  {name} ready in {ready_s[name]}s", flush=True)
                    del pending[name]
            if pending and deadline.left() <= 0:
                tails = "\n".join(f"--- {n}:\n{m.log_tail(10)}" for n, (m, _) in pending.items())
                raise PhaseTimeout(f"{', '.join(pending)} not ready in time:\n{tails}")
            if pending:
                time.sleep(0.25)

    # -------------------------------------------------------------- measurements
    def admin(self, method: str, path: str, deadline: Deadline, body: dict[str, Any] | None = None) -> Any:
        response = httpx.request(
            method,
            f"{self.url}{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=max(1.0, deadline.check(f"{method} {path}")),
        )
        if response.status_code != 200:
            raise PhaseFailed(f"{method} {path}: HTTP {response.status_code} {response.text[:300]}")
        return response.json()

    def completion(
        self,
        client: httpx.Client,
        prompt: str | list[int],
        max_tokens: int,
        deadline: Deadline,
        logprobs: int | None = None,
    ) -> dict[str, Any]:
        """One greedy completion (of text or token ids; with the k most likely per token when `logprobs`)."""
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        if logprobs is not None:
            body["logprobs"] = logprobs
        response = client.post(
            f"{self.url}/v1/completions", json=body, timeout=max(1.0, deadline.check("a completion"))
        )
        if response.status_code != 200:
            raise PhaseFailed(f"/v1/completions: HTTP {response.status_code} {response.text[:300]}")
        body = response.json()
        choice = body["choices"][0]
        out = {
            "text": choice["text"],
            "token_ids": choice.get("token_ids"),
            "finish_reason": choice.get("finish_reason"),
            "completion_tokens": body["usage"]["completion_tokens"],
        }
        return {**out, "logprobs": choice.get("logprobs")} if logprobs is not None else out

    def greedy(self, deadline: Deadline) -> dict[str, Any]:
        with httpx.Client() as client:
            out = self.completion(client, PROMPT, self.args.greedy_tokens, deadline)
        return {"prompt": PROMPT, "max_tokens": self.args.greedy_tokens, **out}

    def continuation(self, client: httpx.Client, ids: list[int], max_tokens: int, deadline: Deadline) -> dict[str, Any]:
        """The greedy continuation of token ids, with each token's margin over the runner-up."""
        out = self.completion(client, ids, max_tokens, deadline, logprobs=2)
        return {"token_ids": out["token_ids"], "margins": top_margins(out["logprobs"])}

    def forced(self, recorded: dict[str, Any] | None, deadline: Deadline) -> dict[str, Any]:
        """Before any swap (`recorded` None): the greedy continuation of FORCED_PROMPT_IDS with margins.
        After: the same tokens teacher-forced (`forced_comparison`)."""
        with httpx.Client() as client:

            def ask(prefix: list[int], max_tokens: int) -> dict[str, Any]:
                return self.continuation(client, FORCED_PROMPT_IDS + prefix, max_tokens, deadline)

            if recorded is None:
                return ask([], self.args.greedy_tokens)
            return forced_comparison(recorded, ask, self.args.near_tie_nats)

    def http_speed(self, clients: int, deadline: Deadline) -> dict[str, Any]:
        """C concurrent clients, each request greedy with max_tokens: completion tokens over wall time."""
        # At least 4 requests per client: with 2 each, a batch-8 run lasted 0.6-1.6 s and its first and
        # last requests (each client's prefill, the batch draining) made most of it (spread 657-1797).
        requests = max(self.args.http_requests, HTTP_REQUESTS_PER_CLIENT * clients)
        prompts = [f"request {i}: the quick brown fox jumps over the lazy dog" for i in range(requests)]
        runs = []
        with httpx.Client(limits=httpx.Limits(max_connections=clients + 4)) as client:
            self.completion(client, prompts[0], 2, deadline)  # warm-up, untimed
            with concurrent.futures.ThreadPoolExecutor(clients) as pool:
                for _ in range(max(1, self.args.http_repeats)):
                    t0 = time.perf_counter()
                    outs = list(pool.map(lambda p: self.completion(client, p, self.args.max_tokens, deadline), prompts))
                    wall = time.perf_counter() - t0
                    tokens = sum(o["completion_tokens"] for o in outs)
                    runs.append({"wall_s": round(wall, 3), "completion_tokens": tokens, "tokens_per_s": tokens / wall})
        return {
            **spread_of([r["tokens_per_s"] for r in runs]),
            "clients": clients,
            "requests": requests,
            "max_tokens": self.args.max_tokens,
            "run_details": runs,
        }

    def http_decode(self, clients: int, deadline: Deadline) -> dict[str, Any]:
        """Decode speed as streaming clients see it: each request's tokens after its first, over the
        time from its first token to its last (prefill and the HTTP round trip excluded, stalls behind
        other requests' prefills included). C clients at once, each its own process (as users are:
        threads of one Python process would share one interpreter lock while they parse C streams,
        and time their arrivals late), each streaming its requests one after another: C x the median
        request's rate."""
        requests = max(self.args.http_requests, HTTP_REQUESTS_PER_CLIENT * clients)
        prompts = [f"stream {i}: the quick brown fox jumps over the lazy dog" for i in range(requests)]
        shares = [prompts[c::clients] for c in range(clients)]
        timeout = max(1.0, deadline.check("streamed completions"))
        spawn = multiprocessing.get_context("spawn")  # the bench process runs threads: no fork
        with concurrent.futures.ProcessPoolExecutor(clients, mp_context=spawn) as pool:
            futures = [pool.submit(stream_requests, self.url, share, self.args.max_tokens, timeout) for share in shares]
            try:
                rates = [rate for f in futures for rate in f.result(timeout=timeout + 30)]
            except Exception as exc:  # noqa: BLE001 - a client's failure fails this measurement, said in one line
                raise PhaseFailed(f"a streaming client failed: {type(exc).__name__}: {exc}") from exc
        per_request = [r["tokens_per_s"] for r in rates if r["tokens_per_s"]]
        if not per_request:
            raise PhaseFailed("no streamed request returned two or more token events")
        spread = spread_of([clients * rate for rate in per_request])
        return {
            **spread,
            "clients": clients,
            "client_processes": clients,
            "requests": requests,
            "per_request_tokens_per_s": per_request,
            **self.step_timing(deadline),
        }

    def inprocess_speed(self, batch: int, deadline: Deadline) -> dict[str, Any]:
        body = {
            "mode": "benchmark",
            "batch": batch,
            "max_tokens": self.args.max_tokens,
            "prompt_tokens": self.args.prompt_tokens,
            "repeats": self.args.bench_repeats,
        }
        answer = {**self.admin("POST", "/admin/benchmark", deadline, body), **self.step_timing(deadline)}
        keep = (
            "tokens_per_s",
            "tokens_per_s_min",
            "tokens_per_s_max",
            "relative_spread",
            "relative_mad",
            "tokens_per_s_samples",
            "e2e_tokens_per_s",
            "ms_per_step",
            "ttft_s",
            "measured",
            "repeats",
            "path",
            "active_swaps",
            "device",
            "dtype",
            "decode_timing",
        )
        return {key: answer.get(key) for key in keep if key in answer}

    def kernels(self, deadline: Deadline) -> dict[str, Any]:
        answer = self.admin("GET", "/admin/kernels", deadline)
        keep = ("swap_id", "op", "module_class", "modules", "binding", "status", "calls", "fallbacks", "last_error")
        return {
            "active": [{key: k.get(key) for key in keep} for k in answer.get("active") or []],
            "history": len(answer.get("history") or []),
            "fallbacks": answer.get("fallbacks"),
            "graphs": answer.get("graphs"),
        }

    def step_timing(self, deadline: Deadline) -> dict[str, Any]:
        """The host's cycle of the decode steps just served, and the prefill passes that interrupted
        decoding (`graphs.decode_timing`, `graphs.mixed`): read after each speed measurement."""
        graphs = self.admin("GET", "/admin/kernels", deadline).get("graphs") or {}
        mixed = graphs.get("mixed") or {}
        return {
            "decode_timing": graphs.get("decode_timing"),
            "interrupting_prefill_ms": mixed.get("interrupting_prefill_ms"),
            "interrupting_prefill_rows": mixed.get("interrupting_prefill_rows"),
        }

    def measure(self, label: str, deadline: Deadline) -> None:
        """Served speed through HTTP and in-process at every batch, the greedy completion, the kernels."""
        record: dict[str, Any] = {"http": {}, "http_decode": {}, "inprocess": {}, "errors": []}
        self.result[label] = record

        def part(name: str, fn: Callable[[], Any], into: dict[str, Any], key: str) -> None:
            try:
                into[key] = fn()
            except PhaseTimeout:
                raise
            except Exception as exc:  # noqa: BLE001 - the other parts still run
                record["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
            self.save()

        part("kernels", lambda: self.kernels(deadline), record, "kernels")
        part("greedy", lambda: self.greedy(deadline), record, "greedy")
        recorded_forced = (self.result.get("before") or {}).get("forced") if label != "before" else None
        if label == "before" or recorded_forced:
            part("forced", lambda: self.forced(recorded_forced, deadline), record, "forced")
        for b in self.args.batch_list:
            part(f"http batch {b}", functools.partial(self.http_speed, b, deadline), record["http"], f"batch{b}")
            part(
                f"http decode batch {b}",
                functools.partial(self.http_decode, b, deadline),
                record["http_decode"],
                f"batch{b}",
            )
            part(
                f"in-process batch {b}",
                functools.partial(self.inprocess_speed, b, deadline),
                record["inprocess"],
                f"batch{b}",
            )
            print(
                f"  {label} batch {b}: HTTP {record['http'].get(f'batch{b}', {}).get('tokens_per_s')} tok/s, "
                f"HTTP decode {fmt(record['http_decode'].get(f'batch{b}', {}).get('tokens_per_s'))} tok/s, "
                f"in-process {fmt(record['inprocess'].get(f'batch{b}', {}).get('tokens_per_s'))} tok/s",
                flush=True,
            )
        recorded = (self.result.get("before") or {}).get("greedy")
        if label != "before" and recorded and record.get("greedy"):
            record["greedy_equal"] = same_completion(recorded, record["greedy"])
            record["greedy_equal_tokens"] = equal_prefix(recorded, record["greedy"])
            if not record["greedy_equal"]:
                self.warn(f"{label}: the greedy completion differs from the one recorded before any swap")
        if record["errors"]:
            raise PhaseFailed("; ".join(record["errors"]))

    # -------------------------------------------------------------- campaigns
    def optimize_argv(self) -> list[str]:
        a = self.args
        argv = self.cli("optimize", "--server", self.url, "--wait", "--json", "--temporal", self.address)
        argv += ["--state-dir", str(self.state)]
        for flag, value in (
            ("--ops", None if a.ops == "auto" else a.ops),
            ("--max-targets", a.max_targets),
            ("--max-iterations", a.max_iterations),
            ("--min-reward", a.min_reward),
            ("--device", a.device or ("cpu" if a.smoke else None)),
        ):
            if value is not None:
                argv += [flag, str(value)]
        return argv + (["--require-approval"] if a.require_approval else [])

    def campaign(self, label: str, deadline: Deadline) -> None:
        record: dict[str, Any] = {}
        self.result[label] = record
        if label != "cold":
            self.rollback_all(deadline, record)
        argv = self.optimize_argv()
        record["command"] = shlex.join(["gpuyantra", *argv[3:]])
        stdout = self.logs / f"optimize-{label}.stdout"
        t0 = time.time()
        code = self.run_command(f"optimize-{label}", argv, deadline, stdout=stdout)
        record["wall_s"] = round(time.time() - t0, 1)
        record["exit_code"] = code
        text = stdout.read_text(errors="replace") if stdout.exists() else ""
        result = last_json(text)
        stderr_text = (self.logs / f"optimize-{label}.log").read_text(errors="replace")
        found = re.search(r"Campaign (\S+) started\.", stderr_text)
        workflow_id = (result or {}).get("workflow_id") or (found.group(1) if found else None)
        record["workflow_id"] = workflow_id
        if code is None and workflow_id:
            record["progress_at_timeout"] = self.temporal_json(
                ["workflow", "query", "--workflow-id", workflow_id, "--type", "progress"]
            )
            self.temporal_json(["workflow", "terminate", "--workflow-id", workflow_id, "--reason", "campaign_bench"])
        if workflow_id:  # the next campaign's one-per-server check reads visibility: wait until it shows closed
            record["closed_in_visibility"] = self.wait_closed(workflow_id)
        if result:
            (self.out / f"campaign-{label}.json").write_text(json.dumps(result, indent=1))
            record.update(summarize_result(result))
            self.name_seeds(record)
        if workflow_id:
            try:
                history = self.temporal_json(["workflow", "show", "--workflow-id", workflow_id])
                (self.out / f"history-{label}.json").write_text(json.dumps(history, indent=1))
                record["timeline"] = activity_timeline(history.get("events") or [], t0)
                record["first_deploy_s"] = record["timeline"]["first_deploy_s"]
            except Exception as exc:  # noqa: BLE001 - the result still counts
                record["timeline_error"] = f"{type(exc).__name__}: {exc}"
        self.save()
        if code is None:
            raise PhaseTimeout(f"optimize still running after {record['wall_s']}s: stopped, workflow terminated")
        if code != 0 or not result:
            tail = "\n".join(stderr_text.splitlines()[-6:])
            raise PhaseFailed(f"optimize exited {code}{'' if result else ' without a result'}:\n{tail}")
        if not result.get("deployed"):
            self.warn(f"{label} campaign deployed nothing")

    def compare_deployments(self) -> None:
        """Whether every campaign of this run deployed the same kernels (op, class, swapped modules):
        the served-speed check should keep or roll back the same swaps each time."""
        sets = {
            label: sorted(
                f"{d.get('op')}:{d.get('module_class')}{'[' + d['variant'] + ']' if d.get('variant') else ''}"
                f"x{d.get('modules')}"
                for d in campaign["deployed"]
            )
            for label in campaign_labels(self.result)
            if isinstance(campaign := self.result.get(label), dict) and "deployed" in campaign
        }
        self.result["deployments"] = {"by_campaign": sets, "same": len({tuple(v) for v in sets.values()}) <= 1}
        if not self.result["deployments"]["same"]:
            self.warn(f"the campaigns deployed different kernels: {sets}")
        self.save()

    def name_seeds(self, record: dict[str, Any]) -> None:
        """Each seeded target's `seed_op`: the op of the skill that seeded it, as this run's campaigns
        learned it (another family's skill seeds by transfer: only its shared knobs count)."""
        learned = {
            entry["skill_id"]: entry.get("op")
            for label in campaign_labels(self.result)
            for entry in ((self.result.get(label) or {}).get("deployed") or [])
            + ((self.result.get(label) or {}).get("rejected") or [])
            if entry.get("skill_id")
        }
        for entry in (record.get("deployed") or []) + (record.get("rejected") or []):
            if entry.get("seed_skill_id"):
                entry["seed_op"] = learned.get(entry["seed_skill_id"])
        record["seeded_same_op"] = sum(
            1
            for e in (record.get("deployed") or []) + (record.get("rejected") or [])
            if e.get("seed_op") == e.get("op")
        )

    def rollback_all(self, deadline: Deadline, record: dict[str, Any]) -> None:
        before = self.kernels(deadline)
        answer = self.admin("POST", "/admin/rollback", deadline, {"all": True})
        after = self.kernels(deadline)
        rolled = answer.get("rolled_back") if isinstance(answer, dict) else None
        record["rollback"] = {
            "active_before": [(k["op"], k["modules"]) for k in before["active"]],
            "rolled_back": len(rolled) if isinstance(rolled, list) else None,
            "active_after": [(k["op"], k["modules"]) for k in after["active"]],
        }
        if after["active"]:
            self.warn(f"rollback all left kernels active: {record['rollback']['active_after']}")
        recorded = (self.result.get("before") or {}).get("greedy")
        if recorded:
            again = self.greedy(deadline)
            record["rollback"]["greedy_equal"] = same_completion(recorded, again)
            if not record["rollback"]["greedy_equal"]:
                self.warn("after rolling back everything the greedy completion differs from the recorded one")
        # The original forward is back: so should be the speed measured before any swap.
        record["rollback"]["inprocess"] = {f"batch{b}": self.inprocess_speed(b, deadline) for b in self.args.batch_list}

    def bisect_greedy(self, deadline: Deadline) -> None:
        """When the greedy completion after the warm campaign differs from the recorded one, roll the
        active swaps back one at a time, newest first, and record after each whether it is equal again:
        the swap whose rollback restores it is the one that changed the output."""
        record: dict[str, Any] = {"steps": []}
        self.result["bisect"] = record
        recorded = (self.result.get("before") or {}).get("greedy")
        if not recorded or (self.result.get("after") or {}).get("greedy_equal") is not False:
            record["skipped"] = "the greedy completion after the warm campaign was not found different"
            return
        active = self.kernels(deadline)["active"]
        for kernel in reversed(active):
            self.admin("POST", "/admin/rollback", deadline, {"swap_id": kernel["swap_id"]})
            equal = same_completion(recorded, self.greedy(deadline))
            record["steps"].append({"rolled_back": kernel["op"], "modules": kernel["modules"], "greedy_equal": equal})
            self.save()
            if equal:
                record["culprit"] = {"op": kernel["op"], "module_class": kernel.get("module_class")}
                print(f"  greedy equal again after rolling back {kernel['op']} ({kernel.get('module_class')})")
                return

    def wait_closed(self, workflow_id: str, seconds: float = 15.0) -> bool:
        query = f"WorkflowId = '{workflow_id}' AND ExecutionStatus = 'Running'"
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                if not self.temporal_json(["workflow", "list", "--query", query]):
                    return True
            except (PhaseFailed, subprocess.TimeoutExpired):
                pass
            time.sleep(0.5)
        return False

    def temporal_json(self, argv: list[str]) -> Any:
        proc = subprocess.run(
            [temporal_binary(), *argv, "--address", self.address, "--output", "json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if proc.returncode != 0:
            raise PhaseFailed(f"temporal {' '.join(argv[:2])}: exit {proc.returncode}: {proc.stderr.strip()[:300]}")
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError:
            return proc.stdout.strip()[:2000]

    # -------------------------------------------------------------- reports and compile
    def reports(self, deadline: Deadline) -> None:
        record = self.result["reports"] = {}
        failures = []
        for label in campaign_labels(self.result):
            campaign = self.result.get(label) or {}
            workflow_id = campaign.get("workflow_id")
            closed_as = (campaign.get("timeline") or {}).get("closed_as")
            if not workflow_id or closed_as not in (None, "completed"):
                record[label] = {"skipped": f"no completed campaign ({closed_as or 'no campaign id'})"}
                continue
            path = self.out / f"report-{label}.html"
            argv = self.cli("report", workflow_id, "--out", str(path), "--temporal", self.address)
            code = self.run_command(f"report-{label}", argv, Deadline(min(self.args.report_timeout, deadline.left())))
            record[label] = {"exit_code": code, "path": str(path) if path.exists() else None}
            if code != 0:
                failures.append(f"{label}: exit {code}: {(self.logs / f'report-{label}.log').read_text()[-300:]}")
        if failures:
            raise PhaseFailed("; ".join(failures))

    def compile(self, deadline: Deadline) -> None:
        out = self.out / "compile.json"
        argv = [sys.executable, str(REPO / "benchmarks" / "serving_bench.py"), "--only-compile", "--out", str(out)]
        argv += ["--model", self.args.model, "--batches", ",".join(str(b) for b in self.args.batch_list)]
        argv += ["--tokens", str(self.args.max_tokens), "--prompt-tokens", str(self.args.prompt_tokens)]
        argv += ["--compile-budget-s", str(round(deadline.left() * 0.5))]
        argv += ["--smoke"] if self.args.smoke else []
        code = self.run_command("compile", argv, deadline)
        data = json.loads(out.read_text()) if out.exists() else {}
        section = (data.get("results") or {}).get("torch.compile") or {}
        self.result["compile"] = {
            "exit_code": code,
            "versions": data.get("versions"),
            **{key: value for key, value in section.items() if key.startswith("batch") or key == "skipped"},
            "errors": data.get("errors"),
        }
        if code is None:
            raise PhaseTimeout("serving_bench.py --only-compile stopped at its time limit")
        if code != 0:
            raise PhaseFailed(f"serving_bench.py --only-compile exited {code}: {data.get('errors')}")

    # -------------------------------------------------------------- the run
    def run(self) -> int:
        a = self.args
        self.result["versions"] = versions()
        stack_ok = False
        if STACK_PHASES & set(a.phase_list):
            stack_ok = self.phase("start", a.start_timeout, self.start_stack)
        for name in a.phase_list:
            if name in STACK_PHASES and not stack_ok:
                self.result["phases"][name] = {"status": "skipped", "reason": "the stack did not start"}
                continue
            if name in ("before", "after"):
                self.phase(name, a.measure_timeout, functools.partial(self.measure, name))
            elif name == "cold":
                self.phase(name, a.campaign_timeout, functools.partial(self.campaign, name))
            elif name == "warm":
                for label in warm_labels(a.warm_runs):
                    self.phase(label, a.campaign_timeout, functools.partial(self.campaign, label))
                self.compare_deployments()
            elif name == "reports":
                self.phase(name, a.report_timeout * 2, self.reports)
            elif name == "bisect":
                self.phase(name, a.measure_timeout, self.bisect_greedy)
            elif name == "compile":
                self.phase(name, a.compile_timeout, self.compile)
        self.save()
        return 0 if all(p.get("status") == "ok" for p in self.result["phases"].values()) else 1


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def stream_requests(url: str, prompts: list[str], max_tokens: int, timeout_s: float) -> list[dict[str, Any]]:
    """One streaming client (a process of its own): a 2-token warm-up, then each prompt's greedy
    completion streamed in turn; the decode rate of each (`decode_rate`)."""
    stop_at = time.monotonic() + timeout_s
    with httpx.Client() as client:
        streamed_arrivals(client, url, prompts[0], 2, stop_at)
        return [decode_rate(streamed_arrivals(client, url, p, max_tokens, stop_at)) for p in prompts]


def streamed_arrivals(
    client: httpx.Client, url: str, prompt: str, max_tokens: int, stop_at: float
) -> list[tuple[float, int]]:
    """One greedy completion streamed: when each token event arrived, and how many tokens it held."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    timeout = max(1.0, stop_at - time.monotonic())
    arrivals: list[tuple[float, int]] = []
    with client.stream("POST", f"{url}/v1/completions", json=body, timeout=timeout) as response:
        if response.status_code != 200:  # a builtin error: it crosses back from the client process
            raise RuntimeError(f"/v1/completions (stream): HTTP {response.status_code}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            choices = json.loads(line[len("data: ") :]).get("choices") or []
            tokens = sum(len(c.get("token_ids") or []) for c in choices)
            if tokens:
                arrivals.append((time.perf_counter(), tokens))
    return arrivals


def decode_rate(arrivals: list[tuple[float, int]]) -> dict[str, Any]:
    """A streamed completion's decode rate: tokens after the first event over the time from the first
    event to the last (None with fewer than two events)."""
    tokens = sum(n for _, n in arrivals)
    if len(arrivals) < 2 or arrivals[-1][0] <= arrivals[0][0]:
        return {"completion_tokens": tokens, "tokens_per_s": None}
    after_first = tokens - arrivals[0][1]
    return {"completion_tokens": tokens, "tokens_per_s": after_first / (arrivals[-1][0] - arrivals[0][0])}


def equal_prefix(a: dict[str, Any], b: dict[str, Any]) -> int | None:
    """How many leading tokens two completions share (None without token ids)."""
    x, y = a.get("token_ids"), b.get("token_ids")
    if x is None or y is None:
        return None
    return next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))


def top_margins(logprobs: dict[str, Any] | None) -> list[float | None]:
    """Per generated token: how far (in nats) the chosen token's log-probability lies above the next
    likeliest token's (`top_token_logprobs`, by id; from `top_logprobs` where a server gives only
    that: None where two tokens share a text, so the map kept one of them)."""
    if not logprobs:
        return []
    by_id = logprobs.get("top_token_logprobs")  # by token id where the server gives it: no shared texts
    if by_id is not None:
        return [
            round(chosen - top[1][1], 6) if len(top) >= 2 else None
            for chosen, top in zip(logprobs["token_logprobs"], by_id)
        ]
    out: list[float | None] = []
    for chosen, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"]):
        others = sorted((v for v in top.values()), reverse=True)
        out.append(round(chosen - others[1], 6) if len(others) >= 2 else None)
    return out


def forced_comparison(
    recorded: dict[str, Any], ask: Callable[[list[int], int], dict[str, Any]], near_tie_nats: float
) -> dict[str, Any]:
    """Teacher-forced greedy equality: does the served model, given the recorded tokens so far, pick
    the recorded next token at every position?

    A free-running comparison stops meaning anything at the first different token: from there on the
    two completions continue different texts. Here, at a difference, the recorded token is fed and the
    comparison goes on, so each position is judged on the same context. With random weights many
    positions are near ties (the top two within hundredths of a nat), and a kernel that sums in another
    order than cuBLAS may flip one; a difference counts as a near tie when the recorded margin is
    below `near_tie_nats`. `ask(prefix, n)`: the greedy continuation of the forced prompt plus
    `prefix`, n tokens, with `margins`. One request per difference, plus one."""
    want: list[int] = list(recorded.get("token_ids") or [])
    margins: list[float | None] = list(recorded.get("margins") or [None] * len(want))
    differences: list[dict[str, Any]] = []
    position = 0
    requests = 0
    while position < len(want) and requests <= len(want):
        got = ask(want[:position], len(want) - position)
        requests += 1
        ids = list(got.get("token_ids") or [])
        offset = next((i for i, (p, q) in enumerate(zip(want[position:], ids)) if p != q), None)
        if offset is None:
            if len(ids) < len(want) - position:  # stopped early (an end-of-text token): nothing to compare further
                differences.append(
                    {"position": position + len(ids), "recorded": want[position + len(ids)], "got": None}
                )
            break
        at = position + offset
        got_margins = got.get("margins") or []
        differences.append(
            {
                "position": at,
                "recorded": want[at],
                "got": ids[offset],
                "recorded_margin": margins[at] if at < len(margins) else None,
                "got_margin": got_margins[offset] if offset < len(got_margins) else None,
            }
        )
        position = at + 1
    near = [d for d in differences if d.get("recorded_margin") is not None and d["recorded_margin"] < near_tie_nats]
    known = [m for m in margins if m is not None]
    return {
        "positions": len(want),
        "equal_positions": len(want) - len(differences),
        "differences": differences,
        "near_tie_nats": near_tie_nats,
        "all_differences_near_ties": len(near) == len(differences),
        "recorded_margin_median": round(statistics.median(known), 6) if known else None,
        "requests": requests,
    }


def forced_line(forced: dict[str, Any] | None) -> str:
    if not forced:
        return "-"
    margins = ", ".join(fmt(d.get("recorded_margin"), 3) for d in forced["differences"])
    return f"{forced['equal_positions']} of {forced['positions']} equal" + (
        f", recorded margins where different: {margins} nats" if forced["differences"] else ""
    )


def same_completion(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.get("token_ids") is not None and b.get("token_ids") is not None:
        return bool(a["token_ids"] == b["token_ids"])
    return bool(a.get("text") == b.get("text"))


def versions() -> dict[str, Any]:
    found: dict[str, Any] = {"python": sys.version.split()[0]}
    for name in ("torch", "triton", "transformers", "temporalio", "qdrant-client", "fastapi"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    try:
        proc = subprocess.run([temporal_binary(), "--version"], capture_output=True, text=True, timeout=20)
        found["temporal_cli"] = proc.stdout.strip()
    except Exception as exc:  # noqa: BLE001 - informational
        found["temporal_cli"] = f"unknown ({exc})"
    if shutil.which("nvidia-smi"):
        try:
            proc = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            found["gpu"] = proc.stdout.strip()
        except Exception as exc:  # noqa: BLE001 - informational
            found["gpu"] = f"unknown ({exc})"
    return found


# ------------------------------------------------------------------ the table


def warm_labels(runs: int) -> list[str]:
    """The warm campaigns' labels: warm, warm2, warm3, ..."""
    return ["warm", *(f"warm{i}" for i in range(2, runs + 1))]


def campaign_labels(result: dict[str, Any]) -> list[str]:
    """The campaigns a result holds, in order."""
    warm = sorted((k for k in result if re.fullmatch(r"warm\d*", k)), key=lambda k: int(k[4:] or 1))
    return [k for k in ["cold", *warm] if isinstance(result.get(k), dict)]


def fmt(value: Any, digits: int = 1) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.{digits}f}"


def speed_cell(figure: dict[str, Any] | None) -> str:
    if not figure or not isinstance(figure.get("tokens_per_s"), (int, float)):
        return "-"
    low, high = figure.get("tokens_per_s_min"), figure.get("tokens_per_s_max")
    spread = f" ({fmt(low)}-{fmt(high)})" if isinstance(low, (int, float)) and isinstance(high, (int, float)) else ""
    return f"{fmt(figure['tokens_per_s'])}{spread}"


def table(result: dict[str, Any], batches: list[int]) -> str:
    lines = [f"campaign_bench: {result['config'].get('model')}  out: {result['config'].get('out')}"]
    lines.append(
        "phases: "
        + ", ".join(f"{n} {p.get('status')} {fmt(p.get('seconds'), 0)}s" for n, p in result["phases"].items())
    )
    ready = (result.get("stack") or {}).get("ready_s") or {}
    if ready:
        lines.append("ready after (s): " + ", ".join(f"{name} {seconds}" for name, seconds in ready.items()))
    width = 26
    lines.append(f"{'served decode tok/s':{width}}" + "".join(f"{'batch ' + str(b):>24}" for b in batches))
    compile_row = result.get("compile") or {}
    rows = [
        ("HTTP before", (result.get("before") or {}).get("http")),
        ("HTTP decode before", (result.get("before") or {}).get("http_decode")),
        ("in-process before", (result.get("before") or {}).get("inprocess")),
        ("in-process after rollback", ((result.get("warm") or {}).get("rollback") or {}).get("inprocess")),
        ("torch.compile in-process", compile_row),
        ("HTTP after warm", (result.get("after") or {}).get("http")),
        ("HTTP decode after warm", (result.get("after") or {}).get("http_decode")),
        ("in-process after warm", (result.get("after") or {}).get("inprocess")),
    ]
    for name, figures in rows:
        cells = [speed_cell((figures or {}).get(f"batch{b}")) for b in batches]
        if (figures or {}).get("skipped"):
            cells = ["skipped"] * len(batches)
        lines.append(f"{name:{width}}" + "".join(f"{c:>24}" for c in cells))
    lines.append(
        f"{'campaign':8} {'exit':>4} {'wall_s':>7} {'first_deploy_s':>14} {'seeded(same op)':>15} {'rolled_back':>11}  "
        "deployed (op, reward, speedup vs eager) / rejected"
    )
    for label in campaign_labels(result):
        c = result.get(label)
        if not c:
            continue
        deployed = ", ".join(
            f"{d['op']} r{d.get('reward')} x{fmt(d.get('speedup_vs_eager'), 2)}" for d in c.get("deployed") or []
        )
        rejected = ", ".join(str(r.get("op")) for r in c.get("rejected") or [])
        lines.append(
            f"{label:8} {str(c.get('exit_code')):>4} {fmt(c.get('wall_s')):>7} {fmt(c.get('first_deploy_s')):>14} "
            f"{str(c.get('seeded_targets', '-')) + ' (' + str(c.get('seeded_same_op', '-')) + ')':>15} "
            f"{len(c.get('rolled_back') or []):>11}  "
            f"[{deployed or '-'}] / [{rejected or '-'}]"
        )
    after = result.get("after") or {}
    rollback = (result.get("warm") or {}).get("rollback") or {}
    lines.append(
        f"greedy completion equal to the recorded one: after rollback {rollback.get('greedy_equal', '-')}, "
        f"after warm {after.get('greedy_equal', '-')} (first {after.get('greedy_equal_tokens', '-')} tokens equal; "
        f"teacher-forced {forced_line(after.get('forced'))}); "
        "kernels in after warm: "
        + (", ".join(f"{k['op']}x{k['modules']}" for k in (after.get("kernels") or {}).get("active") or []) or "-")
    )
    culprit = (result.get("bisect") or {}).get("culprit")
    if culprit:
        lines.append(f"greedy equal again after rolling back {culprit['op']} ({culprit.get('module_class')})")
    warnings = list(result.get("warnings") or [])
    deployments = result.get("deployments")
    if deployments:
        lines.append(f"same deployments in every campaign: {deployments['same']}")
    for label in campaign_labels(result):
        warnings += [f"{label}: {w}" for w in (result.get(label) or {}).get("warnings") or []]
    lines += [f"warning: {w}" for w in warnings[:12]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `finally` stops every child
    bench = CampaignBench(args)
    code = 1
    try:
        code = bench.run()
    finally:
        t0 = time.monotonic()
        bench.stop_all()
        bench.result["teardown_s"] = round(time.monotonic() - t0, 1)
        bench.save()
        print(table(bench.result, args.batch_list), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
