"""Campaigns already running replay their history on the current workflow code (after a worker restart
or a deploy), so the code must issue the same commands for the same history: no Temporal server here,
Temporal's Replayer fails on any divergence (an activity added, dropped or reordered).

`histories/` holds campaigns recorded with the scripted activities of test_campaign_logic.py (a fake
profile of rms_norm, softmax and one linear projection), on the workflow before it read its targets and
verdicts through workflows/types.py (`handle.fetch_history().to_json()`): concurrent targets with
served-speed checks, a CPU verdict, a rollback, an approval signal and a missing op; `batch_rollback`
on the workflow that measures served speed per decode batch (two targets, one rolled back for its
batch-8 drop). A change that must differ for old campaigns goes behind `workflow.patched(...)`, and
these keep passing.
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
    assert len(HISTORIES) >= 4
