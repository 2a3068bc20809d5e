"""A Gemma2-style model (sliding-window layers, soft-capped attention, no SDPA in some transformers
releases) serves on the engine's path of `--cuda-graphs` (the static graph step runs eagerly on the
CPU) with mixed steps and the Triton decode attention: each feature the kernel cannot serve falls back
per layer to the model's own attention, with a logged reason, instead of failing the warm-up.

The failure this pins down: in a mixed step the cache hands the decode attention every cache row
(`max_batch`), the kernel reading each query row's slot itself; a layer that fell back to
transformers' attention got those rows against one query row per prompt token, and broadcasting
failed ("The size of tensor a (64) must match the size of tensor b (8)" at batch 8 with 56 prompt
rows on CUDA)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from serving.attention import rows_of_the_step
from serving.engine import Engine, GenRequest
from serving.models import LoadedModel, load_model
from serving.runner import sliding_window_of
from tests.serving.helpers import PROMPTS, reference_greedy
from tests.serving.test_mixed_steps import drive

WINDOW = 16  # every request below fits it: prompt + generated tokens <= 15


def tiny_gemma2_config(window: int = WINDOW) -> Any:
    """tiny-qwen2's sizes with Gemma2's layers: sliding-window and full ones, soft-capped attention."""
    from transformers import Gemma2Config

    from serving.models import PRESETS

    sizes = PRESETS["tiny-qwen2"]().to_dict()
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    return Gemma2Config(
        **{key: sizes[key] for key in (*keep, "num_key_value_heads", "head_dim")},
        sliding_window=window,
        query_pre_attn_scalar=sizes["head_dim"],
    )


def tiny_gemma2(root: Path) -> LoadedModel:
    config = tiny_gemma2_config()
    folder = root / "tiny-gemma2"
    config.save_pretrained(folder)
    return load_model(str(folder), random_weights=True, byte_tokenizer=True)


@pytest.mark.parametrize("attention", ["triton", "sdpa"])
def test_gemma2_serves_mixed_steps_on_the_graph_step_with_fallbacks_logged(
    tmp_path: Path, attention: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    loaded = tiny_gemma2(tmp_path)
    engine = Engine(
        loaded,
        state_dir=tmp_path / "state",
        max_batch=4,
        max_seq_len=64,
        cuda_graphs=True,
        decode_attention=attention,
        mixed_prompt_tokens=8,
    )
    assert engine.self_check_report["ok"]
    assert engine.cache.usable_len == WINDOW  # capped at the window, logged
    assert any("context capped at 16 tokens" in r.getMessage() for r in caplog.records)
    first = [GenRequest(PROMPTS[0], 10), GenRequest(PROMPTS[2], 8)]
    later = [GenRequest(PROMPTS[1], 6), GenRequest(PROMPTS[4], 6)]
    drive(engine, first, later, after_passes=1)
    assert engine.mixed_admissions == 2
    for r in first + later:
        assert r.finish_reason == "length"
        assert r.output_ids == reference_greedy(engine.model, r.prompt_ids, r.max_tokens)
    if attention == "triton":  # soft-capping: every layer falls back, each said once
        assert engine.decode_attention is not None and engine.decode_attention.fallbacks > 0
        said = [r.getMessage() for r in caplog.records if "decode attention off for layer" in r.getMessage()]
        assert len(said) == 2 and all("eager attention serves it" in line for line in said)


def test_a_fallback_in_a_mixed_step_gets_one_key_row_per_query_row() -> None:
    keys = torch.arange(4.0).reshape(4, 1, 1, 1).expand(4, 2, 3, 2)
    slots = torch.tensor([2, 2, 0, 1, 3])  # two prompt rows of one request in slot 2, three decode rows
    got, _ = rows_of_the_step(keys, keys, slots, rows=5)
    assert got[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0, 1.0, 3.0]
    same, _ = rows_of_the_step(keys, keys, None, rows=4)
    assert same is keys


def test_only_layers_that_slide_cap_the_context() -> None:
    from serving.models import PRESETS

    assert sliding_window_of(PRESETS["tiny-qwen2"]()) is None  # a window named, not used
    from transformers import Gemma2Config

    assert sliding_window_of(Gemma2Config(sliding_window=4096)) == 4096
