"""The whole loop on real parts: Temporal dev server binary, separate GPU/CPU worker processes,
a uvicorn serving process, a Qdrant folder and real Triton kernels (in the interpreter)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import httpx
import pytest
from temporalio.client import Client, WorkflowFailureError

from gpuyantra.config import CONTROL_TASK_QUEUE, gpu_kind_queue
from gpuyantra.processes import Managed, free_port, start_server, temporal_binary
from workflows.types import CampaignInput

PROMPT = "The quick brown fox"


def logits(url: str, headers: dict[str, str]) -> list[float]:
    response = httpx.post(f"{url}/admin/logits", json={"prompt": PROMPT}, headers=headers, timeout=120)
    response.raise_for_status()
    return response.json()["logits"]


def completion(url: str) -> str:
    response = httpx.post(
        f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0}, timeout=120
    )
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


def tiny_qwen2_rms_norm_names() -> set[str]:
    from serving.models import PRESETS

    layers = PRESETS["tiny-qwen2"]().num_hidden_layers
    per_layer = {
        f"model.layers.{i}.{norm}" for i in range(layers) for norm in ("input_layernorm", "post_attention_layernorm")
    }
    return per_layer | {"model.norm"}


def max_abs_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def rms_norm_module_count(url: str, headers: dict[str, str]) -> int:
    profile = httpx.post(f"{url}/admin/profile", json={}, headers=headers, timeout=300).json()
    return sum(t["modules"] for t in profile["targets"] if t["op"] == "rms_norm")


async def run_campaign(temporal: Managed, params: CampaignInput) -> dict:
    client = await Client.connect(temporal.info["address"])
    return await client.execute_workflow(
        "OptimizeCampaign", params, id=f"test-{uuid.uuid4().hex[:8]}", task_queue=CONTROL_TASK_QUEUE
    )


async def verify_queues(temporal: Managed, workflow_id: str) -> set[str]:
    """The task queues the campaign's verify_candidate activities were scheduled on (its history)."""
    from temporalio.api.enums.v1 import EventType

    client = await Client.connect(temporal.info["address"])
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return {
        e.activity_task_scheduled_event_attributes.task_queue.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "verify_candidate"
    }


async def test_campaign_swaps_every_rms_norm_and_rollback_restores(temporal, workers, served_model, admin_headers):
    url = served_model.info["url"]
    before_logits = logits(url, admin_headers)
    expected_modules = rms_norm_module_count(url, admin_headers)
    assert expected_modules >= 3

    result = await run_campaign(
        temporal, CampaignInput(server_url=url, ops=["rms_norm"], min_reward=1, max_iterations=3)
    )

    assert [d["op"] for d in result["deployed"]] == ["rms_norm"], result
    deployed = result["deployed"][0]
    assert deployed["reward"] == 1 and deployed["modules"] == expected_modules and deployed["skill_id"]
    # Verified on the GPU-role worker of the server's kind (`cpu` here), which the verdict names.
    assert await verify_queues(temporal, result["workflow_id"]) == {gpu_kind_queue("cpu")}
    assert deployed["verdict"]["timed_on"]["kind"] == "cpu" and deployed["verdict"]["timed_on"]["device"] == "cpu"
    # The profiles before and after the swap travel with the result (digests: no open-target payloads).
    norm_classes = [
        [c for c in p["phases"][p["primary_phase"]]["classes"] if c["module_class"] == "Qwen2RMSNorm"]
        for p in (result["profile"], result["profile_after"])
    ]
    assert all(len(rows) == 1 and rows[0]["modules"] == expected_modules for rows in norm_classes), norm_classes
    assert any(t["op"] == "rms_norm" for t in result["profile"]["targets"])
    assert "open_target" not in json.dumps(result["profile"])
    kernels = httpx.get(f"{url}/admin/kernels", headers=admin_headers, timeout=30).json()
    active = [k for k in kernels["active"] if k["op"] == "rms_norm"]
    assert len(active) == 1 and active[0]["modules"] == expected_modules
    assert set(active[0]["module_names"]) == tiny_qwen2_rms_norm_names()  # every one, counted independently
    assert completion(url)  # still answers
    kernels = httpx.get(f"{url}/admin/kernels", headers=admin_headers, timeout=30).json()
    assert kernels["active"][0]["calls"] > 0  # the swapped kernel served that request
    after_logits = logits(url, admin_headers)
    assert max_abs_diff(before_logits, after_logits) < 1e-3

    rolled = httpx.post(f"{url}/admin/rollback", json={"all": True}, headers=admin_headers, timeout=60)
    assert rolled.status_code == 200
    assert httpx.get(f"{url}/admin/kernels", headers=admin_headers, timeout=30).json()["active"] == []
    assert logits(url, admin_headers) == before_logits  # the original forward, bit for bit


def test_stock_temporal_cli_starts_the_campaign(temporal, workers, served_model, admin_headers):
    url = served_model.info["url"]
    workflow_id = f"cli-{uuid.uuid4().hex[:8]}"
    payload = json.dumps({"server_url": url, "ops": ["rms_norm"], "min_reward": 1, "max_iterations": 2})
    base = [temporal_binary(), "workflow"]
    address = ["--address", temporal.info["address"]]
    started = subprocess.run(
        base
        + [
            "start",
            "--type",
            "OptimizeCampaign",
            "--task-queue",
            CONTROL_TASK_QUEUE,
            "--workflow-id",
            workflow_id,
            "--input",
            payload,
            *address,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    finished = subprocess.run(
        base + ["result", "--workflow-id", workflow_id, "--output", "json", *address],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "rms_norm" in finished.stdout and '"deployed"' in finished.stdout
    kernels = httpx.get(f"{url}/admin/kernels", headers=admin_headers, timeout=30).json()
    assert [k["op"] for k in kernels["active"]] == ["rms_norm"]


async def test_campaign_fails_clearly_when_server_unreachable(temporal, workers, trust):
    dead = trust(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(WorkflowFailureError) as failure:
        await run_campaign(temporal, CampaignInput(server_url=dead, ops=["rms_norm"], min_reward=1))
    assert "not reachable" in str(failure.value.cause)


async def test_campaign_fails_clearly_on_wrong_token(temporal, workers, tmp_path, trust):
    other = start_server("tiny-qwen2", tmp_path, free_port(), "a-different-token", env={"TRITON_INTERPRET": "1"})
    trust(other.info["url"])
    try:
        with pytest.raises(WorkflowFailureError) as failure:
            await run_campaign(temporal, CampaignInput(server_url=other.info["url"], min_reward=1))
        assert "401" in str(failure.value.cause)
    finally:
        other.stop()


def test_optimize_cli_waits_and_prints_result_json_last(temporal, workers, served_model, admin_headers, state_dir):
    import os
    import sys

    url = served_model.info["url"]
    env = {
        **os.environ,
        "GPUYANTRA_ADMIN_TOKEN": admin_headers["Authorization"].split()[1],
        # The workers' state folder, as on one machine: the report reads kernel sources only from there.
        "GPUYANTRA_STATE_DIR": str(state_dir),
    }
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuyantra.cli",
            "optimize",
            "--server",
            url,
            "--ops",
            "rms_norm",
            "--min-reward",
            "1",
            "--max-iterations",
            "2",
            "--wait",
            "--json",
            "--temporal",
            temporal.info["address"],
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert finished.returncode == 0, finished.stdout + finished.stderr
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    assert result["server"] == url and [d["op"] for d in result["deployed"]] == ["rms_norm"]
    assert set(result["e2e"]) == {"tokens_per_s_before", "tokens_per_s_after"}
    workflow_id = result["workflow_id"]
    assert workflow_id.startswith("campaign-tiny-qwen2-rms_norm-127.0.0.1-")
    assert f"Campaign {workflow_id} started." in finished.stderr and "rms_norm:Qwen2RMSNorm: verify" in finished.stderr
    # The real verdict as the report reads it: a CPU verdict, its candidate file, no timings.
    verdict = result["deployed"][0]["verdict"]
    assert verdict["device"] == "cpu" and verdict["accepted"] and verdict["bench"] == []
    page = (state_dir / "reports" / f"{workflow_id}.html").read_text()
    assert "speed is not judged" in page and "@triton.jit" in page and "<svg" in page
    # Findable by docs/usage.md's query (registered by start_temporal, as `gpuyantra up` does).
    for _ in range(25):  # visibility may lag the close by a moment
        listed = subprocess.run(
            [
                temporal_binary(),
                "workflow",
                "list",
                "--address",
                temporal.info["address"],
                "--query",
                'GpuyantraModel="tiny-qwen2" AND GpuyantraDeployed=1',
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if workflow_id in listed.stdout:
            break
        time.sleep(0.2)
    assert workflow_id in listed.stdout, listed.stdout + listed.stderr


async def test_rope_campaign_swaps_the_attention_function(temporal, workers, served_model, admin_headers):
    url = served_model.info["url"]
    before_logits = logits(url, admin_headers)
    result = await run_campaign(temporal, CampaignInput(server_url=url, ops=["rope"], min_reward=1, max_iterations=2))
    assert [d["op"] for d in result["deployed"]] == ["rope"], result
    kernels = httpx.get(f"{url}/admin/kernels", headers=admin_headers, timeout=30).json()
    assert [(k["op"], k.get("binding")) for k in kernels["active"]] == [("rope", "function")]
    assert max_abs_diff(before_logits, logits(url, admin_headers)) < 1e-3
    assert completion(url)
