"""UCB1 over retrieved skills."""

from __future__ import annotations

import math
from types import SimpleNamespace

from gpuyantra.skills import Skill, normalize_reward, ucb1_choose, ucb1_score


def arm(id, pulls=0, total=0.0):
    return SimpleNamespace(id=id, pulls=pulls, total_reward=total)


def test_empty_and_unpulled_first_by_id():
    assert ucb1_choose([]) is None
    arms = [arm("c", 5, 15), arm("b"), arm("a", 1, 3), arm("a0")]
    assert ucb1_choose(arms).id == "a0"
    assert ucb1_choose([arm("c", 5, 15), arm("b")]).id == "b"


def test_unpulled_skills_go_nearest_fingerprint_first():
    near, far = arm("z"), arm("a")
    near.score, far.score = 0.98, 0.40  # retrieval similarity: a larger score is a nearer fingerprint
    assert ucb1_choose([far, near]).id == "z"


def test_exploits_the_better_mean_and_explores_the_rarely_pulled():
    good, bad = arm("x", 10, 30.0), arm("y", 10, -10.0)
    assert ucb1_choose([bad, good]).id == "x"
    # A rarely pulled arm with a decent mean wins over a well-known mediocre one.
    known, rare = arm("k", 200, 200.0), arm("r", 1, 1.0)
    assert ucb1_choose([known, rare]).id == "r"
    assert ucb1_choose([known, rare], c=0.0).id in {"k", "r"}


def test_ties_break_by_id_and_scores_use_normalized_reward():
    assert ucb1_choose([arm("b", 2, 4.0), arm("a", 2, 4.0)]).id == "a"
    assert normalize_reward(-1) == 0.0 and normalize_reward(3) == 1.0 and normalize_reward(9) == 1.0
    s = ucb1_score(arm("a", 4, 12.0), total_pulls=8)
    assert math.isclose(s, 1.0 + math.sqrt(2) * math.sqrt(math.log(8) / 4))


def test_works_on_skills():
    skills = [
        Skill(id="2", op="rms_norm", source="x", pulls=3, total_reward=9.0),
        Skill(id="1", op="rms_norm", source="y", pulls=3, total_reward=-3.0),
    ]
    assert ucb1_choose(skills).id == "2"
    assert skills[0].mean_reward == 3.0 and Skill(op="a", source="z").mean_reward is None
