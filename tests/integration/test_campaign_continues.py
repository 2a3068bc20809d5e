"""A second campaign on the same server continues where the first stopped: a target a committed swap
already serves is reported `already swapped` and never searched or deployed again (real Temporal,
workers, serving process and profile; the CPU verifier's first correct kernel ends the search)."""

from __future__ import annotations

import httpx

from gpuyantra.campaign.records import CampaignInput
from tests.integration.test_campaign import run_campaign


async def test_a_second_campaign_skips_what_the_first_swapped(temporal, workers, served_model, admin_headers):
    url = served_model.info["url"]
    first = await run_campaign(
        temporal, CampaignInput(server_url=url, ops=["rms_norm"], min_reward=1, max_iterations=2)
    )
    assert [d["op"] for d in first["deployed"]] == ["rms_norm"], first
    swap_id = first["deployed"][0]["swap_id"]

    second = await run_campaign(
        temporal, CampaignInput(server_url=url, ops=["rms_norm"], min_reward=1, max_iterations=2)
    )
    assert second["deployed"] == [] and second["rejected"] == [], second
    [skipped] = [entry for entry in second["skipped"] if entry["op"] == "rms_norm"]
    assert skipped["reason"].startswith(f"already swapped (swap {swap_id}"), skipped
    kernels = httpx.get(f"{url}/admin/kernels", headers=admin_headers, timeout=30).json()
    assert [k["swap_id"] for k in kernels["active"]] == [swap_id]  # the first swap serves on, alone
