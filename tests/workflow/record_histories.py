"""Record the histories `test_replay.py` replays: `python -m tests.workflow.record_histories`.

Each scenario runs `OptimizeCampaign` on a local Temporal dev server with the scripted activities of
test_campaign_logic.py (a fake profile of rms_norm, softmax and one linear projection) and writes its
history (`handle.fetch_history().to_json()`) to `histories/<scenario>.json`. Run it when a release
changes the commands a campaign issues (docs/ARCHITECTURE.md, "Replay policy"), and commit the files
it writes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from gpuyantra.campaign.records import CampaignInput
from gpuyantra.config import search_attribute_args
from gpuyantra.processes import temporal_binary
from tests.workflow.conftest import TEST_SERVERS
from tests.workflow.test_campaign_input import workers
from tests.workflow.test_campaign_logic import TARGET, Script
from workflows.campaign import OptimizeCampaign

HISTORIES = Path(__file__).parent / "histories"
LINEAR = {
    **TARGET,
    "op": "linear",
    "module_class": "Linear",
    "qualified_class": "torch.nn.modules.linear.Linear",
    "param_shapes": {"weight": [256, 64], "bias": None},
    "variant": "256x64",
}
# Shares above the fake server's noise (none): a campaign without `ops` goes after all three.
THREE = [
    {**TARGET, "share": 0.3},
    {**TARGET, "op": "softmax", "module_class": "S", "share": 0.2},
    {**LINEAR, "share": 0.1},
]
Steer = Callable[[WorkflowHandle], Awaitable[None]]


async def approve_when_asked(handle: WorkflowHandle) -> None:
    for _ in range(100):  # bounded: 10 s
        progress = await handle.query(OptimizeCampaign.progress)
        if any(t.get("stage") == "awaiting-approval" for t in progress["targets"].values()):
            break
        await asyncio.sleep(0.1)
    await handle.signal(OptimizeCampaign.approve, "rms_norm")


# name -> (script, input, what to do while it runs)
SCENARIOS: dict[str, tuple[Script, CampaignInput, Steer | None]] = {
    "three_targets": (Script(rewards=[2, 3], targets=THREE), CampaignInput(server_url="http://x"), None),
    "cpu_deploy": (
        Script(rewards=[-1, 1], device="cpu"),
        CampaignInput(server_url="http://x", ops=["rms_norm"], min_reward=1),
        None,
    ),
    "rollback": (
        Script(rewards=[3], slower_after_deploy=True, paired_drops=[0.2, 0.21, 0.19]),
        CampaignInput(server_url="http://x", ops=["rms_norm"]),
        None,
    ),
    "approval": (
        Script(rewards=[3]),
        CampaignInput(server_url="http://x", ops=["rms_norm", "rope"], require_approval=True),
        approve_when_asked,
    ),
    "batch_rollback": (
        Script(rewards=[3], batch8_after=600.0),
        CampaignInput(server_url="http://x", ops=["rms_norm", "softmax"]),
        None,
    ),
}


async def record(client: Client, name: str, script: Script, params: CampaignInput, steer: Steer | None) -> str:
    async with workers(client, script) as queue:
        handle = await client.start_workflow(OptimizeCampaign.run, params, id=f"recorded-{name}", task_queue=queue)
        if steer is not None:
            await steer(handle)
        await handle.result()
        # One line, as the files were kept before: smaller, and a re-recording diffs as one change.
        return json.dumps(json.loads((await handle.fetch_history()).to_json()), separators=(",", ":"))


async def main() -> None:
    import os

    os.environ["GPUYANTRA_SERVERS"] = TEST_SERVERS  # the preflight trusts the scripted server
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), dev_server_extra_args=["--headless", *search_attribute_args()]
    )
    try:
        for name, (script, params, steer) in SCENARIOS.items():
            (HISTORIES / f"{name}.json").write_text(await record(env.client, name, script, params, steer))
            print(f"recorded {name}")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
