"""The plan-class corpus: kernels wrong in a way that corrupts a served model yet right on every case
of the older plan (seeds x scales x N(0, 1) and activation-like inputs on fresh contiguous tensors
of a few hidden shapes), and honest kernels in several styles that must pass the whole plan.

One table, read by `tests/verifier/test_plan_classes.py` (CPU) and `benchmarks/verify_plan_gpu.py`
(every entry and every template, on a GPU). Each wrong kernel names the plan class that exposes it
and the exact rule its verdict carries; `knobs` are `run_verification` arguments (the dtype that
class needs; live shapes where the class is about live shapes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CANDIDATES = Path(__file__).parent / "candidates"


@dataclass(frozen=True)
class Entry:
    name: str  # candidates/<name>.py
    plan_class: str  # the class that exposes it ("" for honest kernels)
    rule: str | None  # the rule the verdict names; None: accepted
    knobs: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return CANDIDATES / f"{self.name}.py"


# The last token of each of 4 prompts of 16: [4, 1, 64] strided 16 x 64 apart, at the last row's offset.
LAST_TOKEN = {"input": 0, "shape": [4, 1, 64], "stride": [1024, 64, 1], "offset": 960}
F16 = {"dtypes": ["float16"]}
F32 = {"dtypes": ["float32"]}

WRONG = [
    Entry("plan_wrong_wide_one_pass_ln", "wide_rows", "unstable-numerics", F32),
    Entry("plan_wrong_wide_fp16_sumsq", "wide_rows", "unstable-numerics", F16),
    Entry("plan_wrong_prefill_rows", "prefill_rows", "unseen-shape", F32),
    Entry("plan_wrong_prefill_k_remainder", "prefill_rows", "unseen-shape", F32),
    Entry("plan_wrong_persistent_tail", "large_tensor", "shape-cap", F32),
    # Qwen3's q/k norm inputs: [batch, seq, heads, head_dim] (a live rank-4 shape keeps its rank too).
    Entry("plan_wrong_rank4", "rank4", "unseen-shape", F32),
    Entry("plan_wrong_view_layout", "view", "input-layout", F32),
    # The served prefill's head input `h[:, -1:, :]` (the profile target's `layouts`), rows capped.
    Entry("plan_wrong_live_leading_stride", "live_layout", "input-layout", {**F32, "layouts": [LAST_TOKEN]}),
    Entry("plan_wrong_bias_none", "no_optional", "optional-parameter", F32),
    Entry("plan_wrong_full_rotary_only", "partial_rotary", "optional-parameter", F32),
    Entry("plan_wrong_zero_rows", "zero_rows", "unstable-numerics", F32),
    Entry("plan_wrong_masked_online_softmax", "masked_rows", "unstable-numerics", F32),
    Entry("plan_wrong_late_peak_softmax", "late_peak", "unstable-numerics", F32),
]

HONEST = [
    # GPT-2's width: a two-pass LayerNorm was rejected there on float32 conditioning slack alone.
    Entry("plan_honest_ln_two_pass", "", None, {"dtypes": ["float32", "float16"], "shapes": [[64, 768]]}),
    Entry("plan_honest_ln_welford", "", None, {"dtypes": ["float32", "float16"]}),
    Entry("honest_rowwise", "", None, {"dtypes": ["float32", "float16"]}),  # fp16 in, fp32 accumulate
    Entry("plan_honest_view_strides", "", None, F32),
    Entry("plan_honest_online_softmax", "", None, {"dtypes": ["float32", "float16"]}),
    Entry("plan_honest_gemm_kmask", "", None, F32),
]

CORPUS = WRONG + HONEST
