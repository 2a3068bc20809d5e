"""End-to-end tests against real `gpuyantra serve` processes (uvicorn on 127.0.0.1).

- load: 8 concurrent clients while the server goes through 20 swap/rollback cycles of the real
  Triton rms_norm template: zero failed requests, every response equal to the pre-swap server's.
- faulty kernel: passes parity, raises on a later (larger) shape while serving: that call falls back,
  the swap is rolled back, the request succeeds with the reference output.
- restart: kill -9 after a swap, start again on the same state folder: the manifest re-applies it.
"""

from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest

from tests.serving.candidates import rms_norm_source
from tests.serving.helpers import RMS_NORM_KERNEL, attested, complete, metric_value

pytestmark = pytest.mark.integration

PROMPTS = [
    "Hello",
    "The quick brown fox",
    "gpuyantra",
    "a",
    "Kernels swap live",
    "1 2 3 4 5 6",
    "zzz",
    "serving under load!",
]
MAX_TOKENS = 4
# Bounded by count, not by time (each swap's parity check runs Triton's interpreter on the CPU, about
# 4-10 s a cycle): 10 cycles mix path and source bodies (every third a source) and single and
# all-at-once rollbacks (every fifth all at once), each kind at least twice.
CYCLES = 10
SOURCE_EVERY = 3
ALL_AT_ONCE_EVERY = 5
CLIENTS = 8


def test_load_with_swap_rollback_cycles(shared_server):
    server = shared_server
    with httpx.Client(base_url=server.url, timeout=60) as client:
        reference = {p: complete(client, p, MAX_TOKENS)["token_ids"] for p in PROMPTS}
        assert all(len(ids) == MAX_TOKENS for ids in reference.values())

    stop = threading.Event()
    failures: list[str] = []
    mismatches: list[str] = []
    served = [0] * CLIENTS

    def client_loop(k: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            i = k
            while not stop.is_set():
                prompt = PROMPTS[i % len(PROMPTS)]
                stream = (i // len(PROMPTS) + k) % 2 == 1
                try:
                    got = complete(client, prompt, MAX_TOKENS, stream=stream)
                except Exception as exc:  # noqa: BLE001 - every failure is a test failure
                    failures.append(f"client {k} ({'stream' if stream else 'plain'}) {prompt!r}: {exc!r}")
                    return
                if got["token_ids"] != reference[prompt]:
                    mismatches.append(f"{prompt!r}: {got['token_ids']} != {reference[prompt]}")
                served[k] += 1
                i += 1

    threads = [threading.Thread(target=client_loop, args=(k,), daemon=True) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    started = time.monotonic()
    cycles = 0
    swap_ids = []
    try:
        with httpx.Client(base_url=server.url, timeout=120, headers=server.admin) as admin:
            source = RMS_NORM_KERNEL.read_text()
            proof = attested(source)
            for cycle in range(CYCLES):
                body = (
                    {"source": source} if cycle % SOURCE_EVERY == SOURCE_EVERY - 1 else {"path": str(RMS_NORM_KERNEL)}
                )
                body["attestation"] = proof
                r = admin.post("/admin/swap", json=body)
                assert r.status_code == 200, r.text
                swap = r.json()
                assert swap["status"] == "committed" and swap["modules"] == 5 and swap["op"] == "rms_norm"
                swap_ids.append(swap["swap_id"])
                time.sleep(0.05)  # let some forward passes run on the kernel
                all_at_once = cycle % ALL_AT_ONCE_EVERY == ALL_AT_ONCE_EVERY - 1
                rollback = {"all": True} if all_at_once else {"swap_id": swap["swap_id"]}
                r = admin.post("/admin/rollback", json=rollback)
                assert r.status_code == 200, r.text
                assert [x["swap_id"] for x in r.json()["rolled_back"]] == [swap["swap_id"]]
                assert r.json()["active"] == []
                cycles += 1
                if failures:
                    break
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    elapsed = time.monotonic() - started

    assert not failures, failures[:5]
    assert not mismatches, mismatches[:5]
    assert cycles == CYCLES
    assert all(n > 0 for n in served), served
    with httpx.Client(base_url=server.url, timeout=30, headers=server.admin) as admin:
        kernels = admin.get("/admin/kernels").json()
        metrics = admin.get("/metrics").text
    history = {r["swap_id"]: r for r in kernels["history"]}
    assert all(history[sid]["status"] == "rolled_back" for sid in swap_ids)
    # The kernel really served traffic (calls counts swapped-forward calls that ran the kernel).
    assert sum(history[sid]["calls"] for sid in swap_ids) > 0
    assert metric_value(metrics, "gpuyantra_swaps_total", 'result="committed"') >= CYCLES
    assert metric_value(metrics, "gpuyantra_rollbacks_total", 'cause="admin"') >= CYCLES
    assert metric_value(metrics, "gpuyantra_requests_total", 'status="error"') == 0
    print(
        f"\nload: {cycles} swap/rollback cycles, {sum(served)} requests by {CLIENTS} clients in {elapsed:.1f}s; "
        f"kernel calls {sum(history[sid]['calls'] for sid in swap_ids)}"
    )


def test_faulty_kernel_falls_back_and_rolls_back(shared_server, tmp_path):
    server = shared_server
    long_prompt = "a longer prompt that has more rows than parity checked"  # 55 bytes -> 55 rows
    short_prompt = "hi"
    faulty = tmp_path / "faulty_rms_norm.py"
    faulty.write_text(rms_norm_source(max_rows=16))  # correct math, raises on more than 16 rows
    with (
        httpx.Client(base_url=server.url, timeout=60) as client,
        httpx.Client(base_url=server.url, timeout=120, headers=server.admin) as admin,
    ):
        ref_long = complete(client, long_prompt, 6)["token_ids"]
        ref_short = complete(client, short_prompt, 6)["token_ids"]
        before = admin.get("/metrics").text

        r = admin.post(
            "/admin/swap",
            json={
                "path": str(faulty),
                "shapes": [[1, 1, 64], [8, 1, 64], [1, 8, 64]],
                "attestation": attested(faulty.read_bytes()),
            },
        )
        assert r.status_code == 200, r.text
        swap_id = r.json()["swap_id"]
        assert r.json()["parity"]["shapes"] == [[1, 1, 64], [1, 8, 64], [8, 1, 64]]

        # Short prompts fit the kernel: served by it.
        assert complete(client, short_prompt, 6)["token_ids"] == ref_short
        # 55 prompt rows: the kernel raises, the call falls back, the request still succeeds.
        got = complete(client, long_prompt, 6, stream=True)
        assert got["token_ids"] == ref_long

        deadline = time.monotonic() + 30
        while True:
            kernels = admin.get("/admin/kernels").json()
            record = next(r for r in kernels["history"] if r["swap_id"] == swap_id)
            if record["status"] == "rolled_back" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert record["status"] == "rolled_back", record
        assert "raised while serving" in record["reason"] and "16" in record["reason"]
        assert record["fallbacks"] >= 1 and record["calls"] > 0
        assert swap_id not in [r["swap_id"] for r in kernels["active"]]
        after = admin.get("/metrics").text
        assert metric_value(after, "gpuyantra_kernel_fallbacks_total") > metric_value(
            before, "gpuyantra_kernel_fallbacks_total"
        )
        assert (
            metric_value(after, "gpuyantra_rollbacks_total", 'cause="fallback"')
            == metric_value(before, "gpuyantra_rollbacks_total", 'cause="fallback"') + 1
        )
        assert metric_value(after, "gpuyantra_requests_total", 'status="error"') == 0
        # Still serving, on the original forward.
        assert complete(client, long_prompt, 6)["token_ids"] == ref_long


def test_restart_reapplies_manifest(start_server, tmp_path):
    state = tmp_path / "state"
    candidate = tmp_path / "candidate_rms_norm.py"
    shutil.copyfile(RMS_NORM_KERNEL, candidate)
    first = start_server(state)
    with (
        httpx.Client(base_url=first.url, timeout=60) as client,
        httpx.Client(base_url=first.url, timeout=60, headers=first.admin) as admin,
    ):
        reference = {p: complete(client, p, 5)["token_ids"] for p in PROMPTS[:4]}
        r = admin.post("/admin/swap", json={"path": str(candidate), "attestation": attested(candidate.read_bytes())})
        assert r.status_code == 200, r.text
        swap_id = r.json()["swap_id"]
        assert {p: complete(client, p, 5)["token_ids"] for p in reference} == reference
    first.kill()  # SIGKILL: no shutdown hook runs; the manifest was written at commit
    candidate.unlink()  # the kept copy in the state folder is what the restart loads

    manifest = state / "swaps" / "manifest.json"
    assert manifest.exists() and (state / "swaps" / f"{swap_id}.py").exists()

    second = start_server(state)
    ready = second.wait_ready()
    assert ready["active_swaps"] == [swap_id]
    assert ready["reapplied"] == [{"swap_id": swap_id, "status": "committed", "reapplied": True}]
    with (
        httpx.Client(base_url=second.url, timeout=60) as client,
        httpx.Client(base_url=second.url, timeout=60, headers=second.admin) as admin,
    ):
        assert {p: complete(client, p, 5)["token_ids"] for p in reference} == reference
        kernels = admin.get("/admin/kernels").json()
        active = kernels["active"]
        assert [a["swap_id"] for a in active] == [swap_id]
        assert active[0]["reapplied_at"] is not None and active[0]["parity"]["checked"] > 0
        assert active[0]["calls"] > 0  # the re-applied kernel served those requests
        # Rolling back after the restart works and is persisted too.
        r = admin.post("/admin/rollback", json={"swap_id": swap_id})
        assert r.status_code == 200 and r.json()["active"] == []
    second.kill()
    third = start_server(state)
    assert third.wait_ready()["active_swaps"] == []
