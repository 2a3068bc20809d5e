"""A served model whose uncovered module is an open target: the campaign optimizes it like a family.

tiny-llama-gelu's exact-GELU activation is computed by no registered family. The server's profile
makes it an open target and hands it to the workers with its target (their state folder is not the
server's); the open author writes the kernel, the verifier judges it, the server swaps it with
parity, and a restarted server re-applies it by name."""

from __future__ import annotations

import httpx

from gpuyantra.campaign.records import CampaignInput
from gpuyantra.processes import free_port, start_server
from tests.integration.conftest import ADMIN_TOKEN
from tests.integration.test_campaign import completion, logits, max_abs_diff, run_campaign


def _open_gelu_op(url: str, headers: dict[str, str]) -> str:
    profile = httpx.post(f"{url}/admin/profile", json={}, headers=headers, timeout=300).json()
    [target] = [t for t in profile["targets"] if t["module_class"] == "GELUActivation"]
    assert target["op"].startswith("open.geluactivation_") and target["modules"] == 2
    assert target["open_target"]["meta"]["op"] == target["op"]  # travels with the target
    return target["op"]


async def test_campaign_deploys_a_kernel_for_an_open_target_and_a_restart_keeps_it(
    temporal, workers, admin_headers, tmp_path, trust
):
    env = {"TRITON_INTERPRET": "1"}
    server = start_server("tiny-llama-gelu", tmp_path, free_port(), ADMIN_TOKEN, device="cpu", env=env)
    try:
        url = trust(server.info["url"])
        before = logits(url, admin_headers)
        op = _open_gelu_op(url, admin_headers)
        result = await run_campaign(temporal, CampaignInput(server_url=url, ops=[op], min_reward=1, max_iterations=2))
        assert [d["op"] for d in result["deployed"]] == [op], result
        assert result["deployed"][0]["modules"] == 2
        assert max_abs_diff(before, logits(url, admin_headers)) < 1e-3
        assert completion(url)
        active = httpx.get(f"{url}/admin/kernels", headers=admin_headers, timeout=30).json()["active"]
        assert [k["op"] for k in active] == [op]
    finally:
        server.stop()

    again = start_server("tiny-llama-gelu", tmp_path, free_port(), ADMIN_TOKEN, device="cpu", env=env)
    try:
        url = again.info["url"]
        active = httpx.get(f"{url}/admin/kernels", headers=admin_headers, timeout=30).json()["active"]
        assert [k["op"] for k in active] == [op] and active[0]["modules"] == 2
        assert max_abs_diff(before, logits(url, admin_headers)) < 1e-3
    finally:
        again.stop()
