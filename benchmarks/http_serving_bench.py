#!/usr/bin/env python3
"""Served tokens/s through HTTP: a real `gpuyantra serve --cuda-graphs` process on 127.0.0.1, clients
calling `/v1/completions`, the campaign's kernels swapped in through `/admin/swap` while it serves.

Phases: (1) C concurrent clients for each C in --clients, on the server as started; (2) the swaps
(rms_norm, rope, silu_mul templates, each verified first and posted with its verdict's attestation)
posted one by one while a background client keeps sending requests (none may fail); (3) the same
client runs again; (4) `/admin/rollback {"all": true}`, then a completion and `/admin/kernels`,
`/metrics` read back. Tokens/s counts completion tokens over wall time, with greedy decoding and
`max_tokens` per request.

    python benchmarks/http_serving_bench.py --out $OUT/http_serving.json            # H200, qwen2.5-1.5b
    python benchmarks/http_serving_bench.py --smoke --out /tmp/h.json               # CPU, tiny-qwen2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from gpuyantra.processes import free_port, start_server  # noqa: E402

TOKEN = "bench-admin-token"
SWAPS = ["rms_norm", "rope", "silu_mul"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="qwen2.5-1.5b")
    p.add_argument("--clients", default="1,8")
    p.add_argument("--requests", type=int, default=16, help="requests per phase")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--smoke", action="store_true", help="tiny-qwen2 on the CPU, few tokens, no CUDA graphs")
    return p.parse_args(argv)


def complete(client: httpx.Client, url: str, prompt: str, max_tokens: int) -> dict:
    r = client.post(
        f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}, timeout=600
    )
    r.raise_for_status()
    body = r.json()
    return {"text": body["choices"][0]["text"], "tokens": body["usage"]["completion_tokens"]}


def load_phase(url: str, clients: int, requests: int, max_tokens: int) -> dict:
    prompts = [f"request {i}: the quick brown fox jumps over the lazy dog" for i in range(requests)]
    started = time.perf_counter()
    with httpx.Client() as client, concurrent.futures.ThreadPoolExecutor(clients) as pool:
        outs = list(pool.map(lambda p: complete(client, url, p, max_tokens), prompts))
    wall = time.perf_counter() - started
    tokens = sum(o["tokens"] for o in outs)
    return {
        "clients": clients,
        "requests": requests,
        "completion_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "texts": [o["text"] for o in outs],
    }


def attest_templates(device: str, smoke: bool) -> tuple[dict[str, dict], dict[str, dict]]:
    """Verify each template (untimed, one seed in a smoke run: only the attestation is needed)."""
    from gpuyantra.triton_env import prepare

    prepare(device)
    from gpuyantra.verifier import run_verification

    proofs, summary = {}, {}
    for name in SWAPS:
        verdict = run_verification(
            REPO / "gpuyantra" / "kernels" / f"{name}.py", device=device, benchmark=False, seeds=(0,) if smoke else None
        )
        proofs[name] = verdict.attestation
        summary[name] = {
            "reward": verdict.reward,
            "seconds": verdict.seconds,
            "failures": [f.to_dict() for f in verdict.failures][:3],
        }
        print(f"verify {name}: reward {verdict.reward:+d} in {verdict.seconds:.1f}s", flush=True)
    return proofs, summary


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        args.model, args.clients, args.requests, args.max_tokens = "tiny-qwen2", "1,2", 4, 6
    device = "cpu" if args.smoke else "cuda"
    extra = ["--max-seq-len", "512", "--max-batch", "8", "--log-level", "warning"]
    if not args.smoke:
        extra.append("--cuda-graphs")
    env = {"TRITON_INTERPRET": "1"} if args.smoke else {}
    state = Path(tempfile.mkdtemp(prefix="gy-http-bench-"))
    # The server (--state-dir) and this process's verifier share the attestation key through this
    # folder, unless $GPUYANTRA_ATTESTATION_KEY gives both the same key.
    os.environ["GPUYANTRA_STATE_DIR"] = str(state)
    out: dict = {"config": vars(args), "phases": {}, "errors": []}
    proofs, out["verified"] = attest_templates(device, args.smoke)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    t0 = time.perf_counter()
    server = start_server(
        args.model, state, free_port(), TOKEN, device=device, extra_args=extra, env=env, timeout_s=600
    )
    url = server.info["url"]
    out["startup_s"] = round(time.perf_counter() - t0, 1)
    try:
        out["readyz"] = httpx.get(f"{url}/readyz").json()
        clients = [int(c) for c in args.clients.split(",")]
        for c in clients:
            out["phases"][f"before_swaps_c{c}"] = load_phase(url, c, args.requests, args.max_tokens)
            print(f"before swaps, {c} clients: {out['phases'][f'before_swaps_c{c}']['tokens_per_s']} tok/s", flush=True)

        # swaps while a client keeps the server busy: no request may fail
        stop, failures, served = threading.Event(), [], [0]

        def background():
            with httpx.Client() as client:
                while not stop.is_set():
                    try:
                        complete(client, url, "background traffic during swaps", 8)
                        served[0] += 1
                    except Exception as exc:  # noqa: BLE001 - counted, reported
                        failures.append(repr(exc))

        thread = threading.Thread(target=background, daemon=True)
        thread.start()
        swaps = []
        for name in SWAPS:
            t = time.perf_counter()
            r = httpx.post(
                f"{url}/admin/swap",
                headers=auth,
                timeout=600,
                json={"path": str(REPO / "gpuyantra" / "kernels" / f"{name}.py"), "attestation": proofs[name]},
            )
            body = r.json()
            swaps.append(
                {
                    "op": name,
                    "http": r.status_code,
                    "seconds": round(time.perf_counter() - t, 2),
                    "status": body.get("status"),
                    "modules": body.get("modules"),
                    "detail": body.get("detail"),
                }
            )
            print(f"swap {name}: HTTP {r.status_code} {body.get('status')} in {swaps[-1]['seconds']}s", flush=True)
        stop.set()
        thread.join(timeout=120)
        out["swaps"] = swaps
        out["during_swaps"] = {"requests_served": served[0], "failed": len(failures), "failures": failures[:5]}
        for c in clients:
            out["phases"][f"after_swaps_c{c}"] = load_phase(url, c, args.requests, args.max_tokens)
            print(f"after swaps, {c} clients: {out['phases'][f'after_swaps_c{c}']['tokens_per_s']} tok/s", flush=True)
        kernels = httpx.get(f"{url}/admin/kernels", headers=auth).json()
        out["kernels_after_swaps"] = {
            "active": [(a.get("op"), a.get("modules")) for a in kernels["active"]],
            "graphs": kernels.get("graphs"),
            "fallbacks": kernels.get("fallbacks"),
        }
        r = httpx.post(f"{url}/admin/rollback", headers=auth, json={"all": True}, timeout=600)
        out["rollback"] = {"http": r.status_code, "active": r.json().get("active")}
        with httpx.Client() as client:
            out["after_rollback_text"] = complete(
                client, url, "request 0: the quick brown fox jumps over the lazy dog", args.max_tokens
            )["text"]
        before = out["phases"][f"before_swaps_c{clients[0]}"]["texts"][0]
        out["after_rollback_equals_before"] = out["after_rollback_text"] == before
        metrics = httpx.get(f"{url}/metrics").text
        prefixes = ("gpuyantra_swaps", "gpuyantra_rollbacks", "gpuyantra_requests")
        out["metrics_lines"] = [line for line in metrics.splitlines() if line.startswith(prefixes)][:30]
    except Exception as exc:  # noqa: BLE001 - recorded with the server log
        out["errors"].append(f"{type(exc).__name__}: {exc}")
        out["server_log"] = server.log_tail(80)
    finally:
        server.stop()
    for phase in out["phases"].values():
        phase["texts"] = phase["texts"][:2]
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    ok = (
        not out["errors"]
        and out.get("during_swaps", {}).get("failed", 1) == 0
        and all(s["http"] == 200 for s in out.get("swaps", []))
    )
    summary = {k: v for k, v in out.items() if k not in ("phases", "metrics_lines")}
    print(json.dumps(summary, indent=1, default=str)[:4000])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
