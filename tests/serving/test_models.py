"""Presets, seeded random weights, local folders, cached Hugging Face model ids, tokenizers."""

from __future__ import annotations

import pytest
import torch

from serving.models import (
    PRESET_TOKENIZERS,
    PRESETS,
    ByteTokenizer,
    HFTokenizer,
    ModelLoadError,
    describe,
    load_model,
    model_problem,
    write_preset_folder,
)
from tests.serving.helpers import write_hf_cache_model


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_same_preset_and_seed_give_identical_weights():
    a, b = load_model("tiny-qwen2"), load_model("tiny-qwen2")
    assert same_weights(a.model, b.model)
    assert not same_weights(a.model, load_model("tiny-qwen2", seed=1).model)
    assert a.dtype == torch.float32 and a.device == "cpu" and a.random_weights


def test_qwen25_preset_is_the_real_architecture():
    cfg = PRESETS["qwen2.5-1.5b"]()
    assert (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.vocab_size,
    ) == (1536, 8960, 28, 12, 2, 151936)
    assert cfg.tie_word_embeddings and cfg.rms_norm_eps == 1e-6


def test_folder_with_config_only(tmp_path):
    folder = write_preset_folder("tiny-llama", tmp_path / "llama")
    with pytest.raises(ModelLoadError, match="--random-weights"):
        load_model(str(folder))
    # No tokenizer files: an error unless the byte-level tokenizer is asked for.
    with pytest.raises(ModelLoadError, match="has no tokenizer.*--byte-tokenizer"):
        load_model(str(folder), random_weights=True)
    assert "--byte-tokenizer" in model_problem(str(folder), True, byte_tokenizer=False)
    assert model_problem(str(folder), True, byte_tokenizer=True) is None
    loaded = load_model(str(folder), random_weights=True, byte_tokenizer=True)
    assert loaded.source == "folder" and type(loaded.model).__name__ == "LlamaForCausalLM"
    assert same_weights(loaded.model, load_model("tiny-llama").model)  # same config + seed
    assert isinstance(loaded.tokenizer, ByteTokenizer)


def test_folder_with_weights(tmp_path):
    src = load_model("tiny-qwen2", seed=3)
    src.model.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), byte_tokenizer=True)
    assert not loaded.random_weights and same_weights(loaded.model, src.model)


def test_presets_declare_the_byte_tokenizer():
    assert PRESET_TOKENIZERS == {name: "byte" for name in PRESETS}
    loaded = load_model("tiny-qwen2")
    assert isinstance(loaded.tokenizer, ByteTokenizer)
    assert describe(loaded)["tokenizer"] == "byte-level" and describe(loaded)["chat_template"] is False


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face hub cache of this test (HF_HUB_CACHE as huggingface_hub reads it)."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # belt and braces: nothing may be fetched
    return cache


def test_model_id_from_the_local_cache(hf_cache):
    snapshot = write_hf_cache_model(hf_cache, "org/tiny-chat")
    assert "--random-weights" in model_problem("org/tiny-chat", False)
    assert model_problem("org/tiny-chat", True, byte_tokenizer=False) is None
    loaded = load_model("org/tiny-chat", random_weights=True)
    assert loaded.source == "hf-cache" and loaded.name == "org/tiny-chat"
    assert type(loaded.model).__name__ == "Qwen2ForCausalLM" and loaded.config.vocab_size == 258
    tok = loaded.tokenizer
    assert isinstance(tok, HFTokenizer) and tok.eos_token_ids == {257} and tok.chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "hé"}])
    assert tok.decode(ids) == "user\nhé\nassistant\n" and ids[0] == 256  # specials skipped in decode
    assert tok.token_bytes(tok.encode("é")[0]) == "é".encode()[:1]  # a byte-level piece: half a character
    # Weights in the snapshot load without --random-weights.
    load_model("tiny-qwen2", seed=5).model.save_pretrained(snapshot)
    assert same_weights(load_model("org/tiny-chat").model, load_model("tiny-qwen2", seed=5).model)


def test_model_id_not_cached_is_never_downloaded(hf_cache):
    for spec in ("org/not-cached", "no-such-preset"):
        problem = model_problem(spec)
        assert "neither a preset" in problem and "local cache" in problem and str(hf_cache) in problem
    with pytest.raises(ModelLoadError, match="nothing is downloaded"):
        load_model("org/not-cached")


@pytest.mark.parametrize("tokenizer, message", [("broken", "does not load"), ("none", "has no tokenizer")])
def test_tokenizer_that_does_not_load_is_an_error(hf_cache, tokenizer, message):
    write_hf_cache_model(hf_cache, "org/bad-tok", tokenizer=tokenizer)
    problem = model_problem("org/bad-tok", True, byte_tokenizer=False)
    assert message in problem and "--byte-tokenizer" in problem and "\n" not in problem
    with pytest.raises(ModelLoadError, match=message):
        load_model("org/bad-tok", random_weights=True)
    loaded = load_model("org/bad-tok", random_weights=True, byte_tokenizer=True)
    assert isinstance(loaded.tokenizer, ByteTokenizer)


def test_unknown_model():
    with pytest.raises(ModelLoadError, match="neither a preset"):
        load_model("no-such-preset")


def test_byte_tokenizer():
    tok = ByteTokenizer(512)
    assert tok.encode("hé") == [104, 195, 169]
    assert tok.decode(tok.encode("hé llo")) == "hé llo"
    assert tok.decode([104 + 256]) == "h"  # ids >= 256 alias byte id % 256
    assert ByteTokenizer(100).encode("h") == [104 % 100]
    assert tok.decode([0xE2, 0x82]) == "\ufffd"  # incomplete UTF-8 decodes with U+FFFD
    assert tok.token_bytes(0xE2 + 256) == b"\xe2" and tok.token_text(104) == "h" and tok.chat_template is None
