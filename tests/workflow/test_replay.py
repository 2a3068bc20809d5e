"""Campaigns already running replay their history on the current workflow code (after a worker restart
or a deploy), so the code must issue the same commands for the same history: no Temporal server here,
Temporal's Replayer fails on any divergence (an activity added, dropped or reordered).

`histories/` holds campaigns of the current release recorded with the scripted activities of
test_campaign_logic.py (`python -m tests.workflow.record_histories`): three targets chosen by gain and
searched at once, a CPU verdict, a rollback the paired check confirmed, an approval signal with a
missing op, a rollback for a batch-8 drop. A change that alters the commands a campaign issues fails
these; when it is meant, the release re-records them (docs/ARCHITECTURE.md, "Replay policy").
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from workflows.campaign import OptimizeCampaign

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
async def test_recorded_campaign_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(f"recorded-{path.stem}", path.read_text())
    result = await Replayer(workflows=[OptimizeCampaign]).replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


def test_histories_are_there() -> None:
    assert len(HISTORIES) >= 5
