"""UCB1 over retrieved skills: which stored kernel seeds the next attempt.

Each skill carries its own bandit statistics (`pulls`, `total_reward`), persisted in the skill
store's payload and updated after every verdict (`SkillStore.record_outcome`). Rewards follow the
verifier's ladder (-1 wrong, +1 correct, +2 beats eager, +3 beats eager and torch.compile) and are
mapped onto [0, 1] before UCB1, whose exploration constant assumes that range.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gpuyantra import rewards

REWARD_MIN, REWARD_MAX = float(rewards.REWARD_MIN), float(rewards.REWARD_MAX)


def normalize_reward(reward: float) -> float:
    return min(max((float(reward) - REWARD_MIN) / (REWARD_MAX - REWARD_MIN), 0.0), 1.0)


def mean_reward(skill: Any) -> float | None:
    """Mean raw reward over the skill's pulls, or None when never pulled."""
    pulls = int(getattr(skill, "pulls", 0) or 0)
    return float(getattr(skill, "total_reward", 0.0)) / pulls if pulls > 0 else None


def ucb1_score(skill: Any, total_pulls: int, c: float = math.sqrt(2)) -> float:
    pulls = int(getattr(skill, "pulls", 0) or 0)
    if pulls <= 0:
        return math.inf
    mean = normalize_reward(float(getattr(skill, "total_reward", 0.0)) / pulls)
    return mean + c * math.sqrt(math.log(max(total_pulls, 1)) / pulls)


def ucb1_choose(skills: Sequence[Any], c: float = math.sqrt(2)) -> Any | None:
    """The skill to seed the next attempt: every unpulled skill first (the nearest fingerprint first,
    by retrieval `score`; then the smallest id), then the highest UCB1 score, ties broken by the
    smallest id. None for an empty list. Ids are random, so ordering unpulled skills by id alone
    would seed a LayerNorm from whichever family's skill happened to get the smaller id."""
    if not skills:
        return None
    unpulled = [s for s in skills if int(getattr(s, "pulls", 0) or 0) <= 0]
    if unpulled:
        return min(unpulled, key=lambda s: (-float(getattr(s, "score", None) or 0.0), str(s.id)))
    total = sum(int(s.pulls) for s in skills)
    return min(skills, key=lambda s: (-ucb1_score(s, total, c), str(s.id)))
