#!/usr/bin/env python3
"""One state folder (a campaign's kernels, re-applied from its manifest) served by several server
configurations in turn: for each, decode at batch 8 in-process (`/admin/benchmark`) and through
HTTP (8 streaming client processes, each streaming its requests one after another, as
`campaign_bench.py`'s HTTP decode), the host's cycle of the decode steps (`graphs.decode_timing`),
the prefill passes that interrupted decoding, and the server threads' CPU seconds.

    python benchmarks/campaign_bench.py --out $OUT/c --state-dir /tmp/s --phases cold ...   # kernels
    python benchmarks/serve_variants.py --state-dir /tmp/s --out $OUT/variants.json \\
        --variant plain= --variant mixed64=--mixed-prompt-tokens=64

A variant is NAME=SERVE_ARGS (extra `gpuyantra serve` arguments, space separated). `--env NAME=K:V`
adds an environment variable to one variant's server; with `--site-hooks`, GY_NO_UV=1 hides uvloop
and httptools from it (uvicorn falls back to asyncio and h11), GY_SWITCH_S=<s> sets its
interpreter's switch interval and GY_NO_JOIN_AHEAD=1 keeps mixed steps from being queued behind a
step running ahead (the host feeds each one) (a `sitecustomize` on its PYTHONPATH).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import httpx  # noqa: E402
from campaign_bench import spread_of, stream_requests  # noqa: E402

from gpuyantra.processes import free_port, start_server  # noqa: E402

SITE_HOOKS = """import os, sys
if os.environ.get("GY_NO_UV"):
    sys.modules["uvloop"] = None
    sys.modules["httptools"] = None
if os.environ.get("GY_SWITCH_S"):
    sys.setswitchinterval(float(os.environ["GY_SWITCH_S"]))
if os.environ.get("GY_NO_JOIN_AHEAD"):
    import importlib.util

    class _NoJoinAhead:
        def find_spec(self, name, path=None, target=None):
            if name != "serving.scheduler":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                module.Scheduler._join_ahead = lambda self, step: None

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _NoJoinAhead())
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--state-dir", required=True, help="the state folder whose manifest each server re-applies")
    p.add_argument("--out", required=True, help="result JSON (written after each variant)")
    p.add_argument("--variant", action="append", required=True, help="NAME=SERVE_ARGS (repeatable)")
    p.add_argument("--env", action="append", default=[], help="NAME=KEY:VALUE for one variant's server")
    p.add_argument("--site-hooks", action="store_true", help="the GY_* variables take effect (module doc)")
    p.add_argument("--model", default="qwen2.5-1.5b")
    p.add_argument("--http-runs", type=int, default=3, help="HTTP decode runs per variant")
    p.add_argument("--token", default=os.environ.get("GPUYANTRA_ADMIN_TOKEN", "variants-token"))
    args = p.parse_args(argv)
    args.variants = []
    for spec in args.variant:
        name, sep, serve = spec.partition("=")
        if not sep or not name:
            p.error(f"--variant {spec!r}: want NAME=SERVE_ARGS")
        args.variants.append((name, serve.split()))
    args.envs = {}
    for spec in args.env:
        name, _, kv = spec.partition("=")
        key, sep, value = kv.partition(":")
        if not sep or name not in dict(args.variants):
            p.error(f"--env {spec!r}: want NAME=KEY:VALUE for a variant's NAME")
        args.envs.setdefault(name, {})[key] = value
    return args


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of a process (`tid:name`)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[f"{tid}:{name}"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def http_decode(url: str, clients: int = 8, per_client: int = 4, max_tokens: int = 64) -> dict[str, Any]:
    """`clients` x the median request's streamed decode rate (campaign_bench's HTTP decode)."""
    prompts = [f"stream {i}: the quick brown fox jumps over the lazy dog" for i in range(clients * per_client)]
    shares = [prompts[c::clients] for c in range(clients)]
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(clients, mp_context=spawn) as pool:
        futures = [pool.submit(stream_requests, url, share, max_tokens, 120) for share in shares]
        rates = [rate for f in futures for rate in f.result(timeout=200)]
    return spread_of([clients * r["tokens_per_s"] for r in rates if r["tokens_per_s"]])


def graphs_report(client: httpx.Client, url: str, auth: dict[str, str]) -> dict[str, Any]:
    return client.get(f"{url}/admin/kernels", headers=auth).json().get("graphs") or {}


def measure(url: str, pid: int, auth: dict[str, str], http_runs: int) -> dict[str, Any]:
    record: dict[str, Any] = {}
    with httpx.Client(timeout=300) as client:
        record["active_swaps"] = len(client.get(f"{url}/admin/kernels", headers=auth).json().get("active") or [])
        client.post(f"{url}/v1/completions", json={"prompt": "warm", "max_tokens": 4, "temperature": 0})
        body = {"mode": "benchmark", "batch": 8, "max_tokens": 64, "prompt_tokens": 32, "repeats": 3}
        bench = client.post(f"{url}/admin/benchmark", headers=auth, json=body).json()
        record["inprocess_b8"] = {k: bench.get(k) for k in ("tokens_per_s", "tokens_per_s_samples", "ms_per_step")}
        http_decode(url, per_client=1, max_tokens=8)  # the clients' path warm
        runs = []
        for _ in range(http_runs):
            cpu_before, started = thread_cpu_s(pid), time.perf_counter()
            run = http_decode(url)
            run["wall_s"] = round(time.perf_counter() - started, 2)
            cpu_after = thread_cpu_s(pid)
            used = {k: round(v - cpu_before.get(k, 0.0), 2) for k, v in cpu_after.items()}
            run["server_cpu_s"] = {k: v for k, v in used.items() if v > 0.05}
            run["decode_timing"] = graphs_report(client, url, auth).get("decode_timing")
            runs.append(run)
        record["http_decode_b8"] = runs
        record["mixed"] = graphs_report(client, url, auth).get("mixed")
    return record


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hooks = Path(tempfile.mkdtemp(prefix="gy-site-hooks-"))
    if args.site_hooks:
        (hooks / "sitecustomize.py").write_text(SITE_HOOKS)
    auth = {"Authorization": f"Bearer {args.token}"}
    results: dict[str, Any] = {}
    for name, serve in args.variants:
        env = {**args.envs.get(name, {}), "PYTHONPATH": f"{hooks}:{os.environ.get('PYTHONPATH', '')}"}
        record: dict[str, Any] = {"serve_args": serve, "env": args.envs.get(name, {})}
        results[name] = record
        started = time.perf_counter()
        try:
            server = start_server(
                args.model,
                Path(args.state_dir),
                free_port(),
                args.token,
                device="cuda",
                extra_args=["--cuda-graphs", "--log-level", "warning", *serve],
                env=env,
                timeout_s=300,
            )
        except Exception as exc:  # noqa: BLE001 - this variant fails, the next one runs
            record["error"] = f"start: {type(exc).__name__}: {exc}"
        else:
            record["startup_s"] = round(time.perf_counter() - started, 1)
            try:
                record.update(measure(server.info["url"], server.process.pid, auth, args.http_runs))
            except Exception as exc:  # noqa: BLE001 - recorded, the next variant runs
                record["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                server.stop()
        print(name, json.dumps(record), flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
