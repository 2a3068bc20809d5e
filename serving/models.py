"""Model presets and loading: a preset name or a local Hugging Face folder becomes a live model.

Presets carry their configs in code, so nothing is downloaded. Weights of a preset (and of a folder
loaded with `random_weights=True`) come from `AutoModelForCausalLM.from_config` under a fixed seed:
two processes that load the same preset with the same seed, device and dtype hold identical
weights, which the restart and parity tests rely on.

Tokenizer: the folder's own tokenizer when it has one; otherwise `ByteTokenizer`, a byte-level
fallback: text is encoded as its UTF-8 bytes, each byte `b` becoming token id `b % vocab_size`;
token ids decode back to bytes as `id % 256` (ids >= 256 therefore alias bytes), invalid UTF-8 is
decoded with U+FFFD. It has no special tokens, so generation with it only stops on `max_tokens` or a
stop string.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def _tiny_qwen2():
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=2048,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False, hidden_act="silu",
        initializer_range=0.2,
    )


def _tiny_llama():
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=2048,
        rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu", initializer_range=0.2,
    )


def _tiny_gpt2():
    from transformers import GPT2Config

    return GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=128, vocab_size=512, n_positions=1024,
                      initializer_range=0.2, bos_token_id=None, eos_token_id=None)


def _qwen25_15b():
    """The Qwen2.5-1.5B architecture (config numbers of the released model), random weights."""
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False, sliding_window=32768,
        max_window_layers=21, hidden_act="silu", bos_token_id=151643, eos_token_id=151643,
        attention_dropout=0.0, initializer_range=0.02,
    )


PRESETS: dict[str, Callable[[], Any]] = {
    "tiny-qwen2": _tiny_qwen2,
    "tiny-llama": _tiny_llama,
    "tiny-gpt2": _tiny_gpt2,
    "qwen2.5-1.5b": _qwen25_15b,
}


class ModelLoadError(ValueError):
    """The model spec names neither a preset nor a usable folder."""


class ByteTokenizer:
    """Byte-level fallback tokenizer (see the module docstring for the exact mapping)."""

    is_byte_level = True
    eos_token_ids: frozenset[int] = frozenset()
    bos_token_id: int | None = None

    def __init__(self, vocab_size: int):
        if vocab_size < 1:
            raise ValueError("vocab_size must be positive")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab_size for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """The folder's own tokenizer behind the same small interface as `ByteTokenizer`."""

    is_byte_level = False

    def __init__(self, tokenizer: Any, config: Any):
        self.tok = tokenizer
        self.vocab_size = int(getattr(config, "vocab_size", None) or len(tokenizer))
        eos: set[int] = set()
        for source in (tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, (list, tuple)):
                eos.update(int(i) for i in source)
        self.eos_token_ids = frozenset(eos)
        self.bos_token_id = tokenizer.bos_token_id

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Any
    name: str              # what /v1/models reports and what the swap manifest keys on
    device: str
    dtype: torch.dtype
    seed: int
    source: str            # "preset" | "folder"
    random_weights: bool

    @property
    def config(self):
        return self.model.config


def resolve_device(device: str | None) -> str:
    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"--device {device} asked for, but CUDA is not available here")
    return device


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """Default: bfloat16 on CUDA, float32 on CPU (the Triton interpreter mishandles bf16)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "", "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of float32, bfloat16, float16") from None


def _has_weights(folder: Path) -> bool:
    patterns = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.safetensors.index.json", "*.bin.index.json")
    return any(any(folder.glob(p)) for p in patterns)


def _has_tokenizer(folder: Path) -> bool:
    names = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "spiece.model")
    return any((folder / n).exists() for n in names)


def _from_config(config: Any, device: str, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    if device.startswith("cuda"):
        torch.cuda.manual_seed_all(seed)
    # Built directly on the device (fast for large models on CUDA), in float32 then cast, so the
    # random values do not depend on the serving dtype's rounding during init.
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(device=device, dtype=dtype)


def load_model(spec: str, *, random_weights: bool = False, device: str | None = None,
               dtype: str | torch.dtype | None = None, seed: int = 0) -> LoadedModel:
    """Load a preset (always random weights) or a local folder (weights, or config + random)."""
    problem = model_problem(spec, random_weights)
    if problem is not None:
        raise ModelLoadError(problem)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    folder = Path(spec).expanduser()
    if spec in PRESETS:
        config = PRESETS[spec]()
        model = _from_config(config, device, torch_dtype, seed)
        tokenizer: Any = ByteTokenizer(int(config.vocab_size))
        name, source, random_weights = spec, "preset", True
    else:
        folder = folder.resolve()
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        config = AutoConfig.from_pretrained(folder)
        if random_weights:
            model = _from_config(config, device, torch_dtype, seed)
        else:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, attn_implementation="sdpa")
            model = model.to(device)
        tokenizer = None
        if _has_tokenizer(folder):
            try:
                tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(folder), config)
            except Exception:  # noqa: BLE001 - a broken tokenizer folder falls back to bytes
                tokenizer = None
        if tokenizer is None:
            tokenizer = ByteTokenizer(int(config.vocab_size))
        name, source = str(folder), "folder"
    model.eval()
    model.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, device=device, dtype=torch_dtype,
                       seed=seed, source=source, random_weights=random_weights)


def model_problem(spec: str, random_weights: bool = False) -> str | None:
    """Why `spec` cannot be served, found without loading anything (so `serve` can refuse before
    it binds its port); None when it can be."""
    if spec in PRESETS:
        return None
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        return f"--model {spec!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a local folder"
    folder = folder.resolve()
    if not (folder / "config.json").exists():
        return f"{folder} has no config.json: pass a Hugging Face model folder or a preset"
    if not random_weights and not _has_weights(folder):
        return f"{folder} holds a config but no weights; pass --random-weights to serve it with random weights"
    return None


def describe(loaded: LoadedModel) -> dict[str, Any]:
    cfg = loaded.config
    return {
        "name": loaded.name, "source": loaded.source, "architecture": type(loaded.model).__name__,
        "device": loaded.device, "dtype": str(loaded.dtype).replace("torch.", ""), "seed": loaded.seed,
        "random_weights": loaded.random_weights,
        "tokenizer": "byte-level fallback" if getattr(loaded.tokenizer, "is_byte_level", False) else "folder",
        "vocab_size": int(getattr(cfg, "vocab_size", 0) or 0),
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
    }


def write_preset_folder(preset: str, folder: str | Path) -> Path:
    """Write a preset's config.json into `folder` (a config-only folder for `--random-weights`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    PRESETS[preset]().save_pretrained(folder)
    return folder


__all__ = ["ByteTokenizer", "HFTokenizer", "LoadedModel", "ModelLoadError", "PRESETS", "describe", "load_model",
           "model_problem", "resolve_device", "resolve_dtype", "write_preset_folder"]
