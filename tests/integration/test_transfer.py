"""Skill transfer across op families (issue 5): with only RMSNorm skills stored, a GPT-2 LayerNorm
target retrieves them by fingerprint, and the campaign deploys a verified LayerNorm kernel."""

from __future__ import annotations

import httpx

from gpuyantra.authors.template import render
from gpuyantra.campaign.records import CampaignInput
from gpuyantra.processes import free_port, start_server
from gpuyantra.skills import Fingerprint, Skill, SkillStore
from tests.integration.conftest import ADMIN_TOKEN
from tests.integration.test_campaign import run_campaign

RMS_ADAPTER = [
    {"kernel_param": "weight", "module_attr": "weight"},
    {"kernel_param": "eps", "module_attr": "variance_epsilon"},
]


def store_rms_norm_skill(qdrant_path, hardware: str) -> str:
    strategy = {"BLOCK_H_MAX": 8192, "ROWS_PER_PROGRAM": 2, "NUM_WARPS": 4}
    target = {"op": "rms_norm", "regime": "memory-bound", "shapes": [[1, 64]], "dtype": "float32"}
    from gpuyantra.authors.template import STRATEGY_SPACES

    strategy = {**STRATEGY_SPACES["rms_norm"][0], **strategy}
    skill = Skill(
        op="rms_norm",
        hardware=hardware,
        source=render("rms_norm", strategy, RMS_ADAPTER),
        adapter=RMS_ADAPTER,
        strategy=strategy,
        reward=1.0,
        shapes=[[1, 64]],
        dtypes=["float32"],
        fingerprint=Fingerprint.from_target(target, hardware).to_payload(),
        provenance={"campaign": "seeded-by-test", "iteration": 1, "author": "template"},
    )
    with SkillStore(path=qdrant_path) as store:
        assert store.list(op="layer_norm") == []
        return store.upsert(skill)


async def test_layer_norm_campaign_starts_from_rms_norm_skill(temporal, workers, state_dir, tmp_path, trust):
    server = start_server("tiny-gpt2", tmp_path, free_port(), ADMIN_TOKEN, env={"TRITON_INTERPRET": "1"})
    try:
        url = trust(server.info["url"])
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        profile = httpx.post(f"{url}/admin/profile", json={}, headers=headers, timeout=300).json()
        layer_norms = [t for t in profile["targets"] if t["op"] == "layer_norm"]
        assert layer_norms and layer_norms[0]["module_class"] == "LayerNorm"
        store_rms_norm_skill(state_dir / "qdrant", profile["hardware"])

        result = await run_campaign(
            temporal, CampaignInput(server_url=url, ops=["layer_norm"], min_reward=1, max_iterations=3)
        )

        assert [d["op"] for d in result["deployed"]] == ["layer_norm"], result
        deployed = result["deployed"][0]
        assert deployed["modules"] == layer_norms[0]["modules"]
        with SkillStore(path=state_dir / "qdrant") as store:
            seed = store.get(deployed["seed_skill_id"])
            learned = store.get(deployed["skill_id"])
        assert seed is not None and seed.op == "rms_norm"  # transfer: the seed came from another family
        assert seed.pulls >= 1  # the bandit paid the seed with the LayerNorm attempt's reward
        assert learned is not None and learned.op == "layer_norm" and learned.reward == 1
        kernels = httpx.get(f"{url}/admin/kernels", headers=headers, timeout=30).json()
        assert [k["op"] for k in kernels["active"]] == ["layer_norm"]
    finally:
        server.stop()
