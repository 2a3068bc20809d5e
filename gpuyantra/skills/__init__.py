"""The skill library: bottleneck fingerprints, a Qdrant-backed store of verified kernels, UCB1.

    from gpuyantra.skills import Fingerprint, Skill, SkillStore, ucb1_choose

    fp = Fingerprint.from_target(target, hardware)        # target: a profile target dict
    with SkillStore() as store:                           # local folder, or GPUYANTRA_QDRANT_URL
        seeds = store.retrieve(fp, target["op"], hardware)  # filtered; falls back across families
        seed = ucb1_choose(seeds)
        ...
        store.record_outcome(seed.id, verdict_reward)

This package imports neither torch nor qdrant at import time.
"""

from gpuyantra.skills.bandit import mean_reward, normalize_reward, ucb1_choose, ucb1_score
from gpuyantra.skills.fingerprint import FINGERPRINT_DIM, Fingerprint, op_class
from gpuyantra.skills.store import COLLECTION, Skill, SkillStore, skill_id

__all__ = [
    "COLLECTION",
    "FINGERPRINT_DIM",
    "Fingerprint",
    "Skill",
    "SkillStore",
    "mean_reward",
    "normalize_reward",
    "op_class",
    "skill_id",
    "ucb1_choose",
    "ucb1_score",
]
