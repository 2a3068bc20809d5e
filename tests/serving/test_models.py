"""Presets, seeded random weights, local folders, the byte-level tokenizer."""

from __future__ import annotations

import pytest
import torch

from serving.models import PRESETS, ByteTokenizer, ModelLoadError, load_model, write_preset_folder


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
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.vocab_size) == (1536, 8960, 28, 12, 2, 151936)
    assert cfg.tie_word_embeddings and cfg.rms_norm_eps == 1e-6


def test_folder_with_config_only(tmp_path):
    folder = write_preset_folder("tiny-llama", tmp_path / "llama")
    with pytest.raises(ModelLoadError, match="--random-weights"):
        load_model(str(folder))
    loaded = load_model(str(folder), random_weights=True)
    assert loaded.source == "folder" and type(loaded.model).__name__ == "LlamaForCausalLM"
    assert same_weights(loaded.model, load_model("tiny-llama").model)  # same config + seed
    assert isinstance(loaded.tokenizer, ByteTokenizer)


def test_folder_with_weights(tmp_path):
    src = load_model("tiny-qwen2", seed=3)
    src.model.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"))
    assert not loaded.random_weights and same_weights(loaded.model, src.model)


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
