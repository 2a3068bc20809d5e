"""The skill library as the dashboard shows it: filtered by op, hardware and fingerprint text, with
each skill's bandit statistics (pulls, mean reward, UCB1 score)."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from typing import Any

from gpuyantra.skills.bandit import ucb1_score
from gpuyantra.skills.store import Skill, SkillStore

QDRANT_WITHIN_S = 5.0  # a Qdrant server's request timeout, and the wait for a busy local folder
# qdrant-client warns on every open of a server it cannot reach; the page's status line says it once.
warnings.filterwarnings("ignore", message="Failed to obtain server version", category=UserWarning)


def open_store(qdrant_url: str | None, qdrant_path: str | None) -> SkillStore:
    """The store `gpuyantra skills` would open, with a short wait: a page must not hang on it."""
    if qdrant_url:
        return SkillStore(url=qdrant_url, lock_timeout=QDRANT_WITHIN_S)
    return SkillStore(path=qdrant_path, lock_timeout=QDRANT_WITHIN_S)


def fingerprint_text(skill: Skill) -> str:
    """What the fingerprint search matches: the fingerprint in words, plus the module class."""
    try:
        described = skill.fingerprint_obj().describe()
    except (TypeError, ValueError, KeyError):  # a payload written by another version: match what is there
        described = " ".join(f"{k}={v}" for k, v in sorted((skill.fingerprint or {}).items()))
    return f"{described} {skill.module_class}".strip()


def matches(skill: Skill, op: str, hardware: str, text: str) -> bool:
    """Case-insensitive substring filters; an empty filter matches everything."""
    return (
        op.lower() in skill.op.lower()
        and hardware.lower() in skill.hardware.lower()
        and text.lower() in fingerprint_text(skill).lower()
    )


def skill_rows(skills: list[Skill]) -> list[dict[str, Any]]:
    """One JSON row per skill. UCB1 counts the pulls of the skills sharing its op and hardware: those are
    the arms retrieval offers together. An unpulled skill's score is infinite (tried first): `ucb` None,
    `unpulled` true."""
    totals = Counter[tuple[str, str]]()
    for skill in skills:
        totals[(skill.op, skill.hardware)] += int(skill.pulls or 0)
    rows = []
    for skill in skills:
        score = ucb1_score(skill, totals[(skill.op, skill.hardware)])
        rows.append(
            {
                "id": skill.id,
                "op": skill.op,
                "hardware": skill.hardware,
                "module_class": skill.module_class,
                "fingerprint": fingerprint_text(skill),
                "reward": skill.reward,
                "speedup_vs_eager": skill.speedup_vs_eager,
                "speedup_vs_compile": skill.speedup_vs_compile,
                "pulls": int(skill.pulls or 0),
                "mean_reward": skill.mean_reward,
                "ucb": None if math.isinf(score) else round(score, 4),
                "unpulled": math.isinf(score),
                "author": (skill.provenance or {}).get("author"),
                "created_at": skill.created_at,
            }
        )
    return rows


def search(
    qdrant_url: str | None, qdrant_path: str | None, op: str = "", hardware: str = "", text: str = ""
) -> list[dict[str, Any]]:
    """The rows of the skills matching the filters (blocking: run it in a thread). Scores are computed
    over the whole library first, so a filter does not change a skill's UCB1 score."""
    skills = open_store(qdrant_url, qdrant_path).list()
    return [row for skill, row in zip(skills, skill_rows(skills)) if matches(skill, op, hardware, text)]
