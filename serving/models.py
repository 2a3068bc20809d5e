"""Model presets and loading: a preset name, a local Hugging Face folder or a Hugging Face model id
already in the local cache becomes a live model.

`--model` resolves, in order: a preset name; a local folder; a Hugging Face model id (`org/name`)
looked up in the local Hugging Face cache only (`HF_HUB_CACHE` / `HF_HOME`; `snapshot_download(...,
local_files_only=True)`: nothing is ever downloaded, an id that is not cached is an error saying so).

Presets carry their configs in code, so nothing is downloaded. Weights of a preset (and of a folder
loaded with `random_weights=True`) come from `AutoModelForCausalLM.from_config` under a fixed seed:
two processes that load the same preset with the same seed, device and dtype hold identical
weights, which the restart and parity tests rely on.

Tokenizer: a folder (or cached model) is served with its own tokenizer; a tokenizer that is missing
or does not load is an error (`serve` exits 2 saying why) unless `byte_tokenizer=True`
(`--byte-tokenizer`) asks for `ByteTokenizer` instead. Presets ship no tokenizer files and declare
`ByteTokenizer` (`PRESET_TOKENIZERS`). `ByteTokenizer` is byte-level: text is encoded as its UTF-8
bytes, each byte `b` becoming token id `b % vocab_size`; token ids decode back to bytes as `id % 256`
(ids >= 256 therefore alias bytes), invalid UTF-8 is decoded with U+FFFD. It has no special tokens,
so generation with it only stops on `max_tokens` or a stop string.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("gpuyantra.serving")

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def _tiny_qwen2():
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        hidden_act="silu",
        initializer_range=0.2,
    )


def _tiny_llama():
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        hidden_act="silu",
        initializer_range=0.2,
    )


def _tiny_llama_gelu():
    """tiny-llama with an exact-GELU gated MLP: no registered family computes its activation, so
    its costliest uncovered module is an open target."""
    config = _tiny_llama()
    config.hidden_act = "gelu"
    return config


def _tiny_gpt2():
    from transformers import GPT2Config

    return GPT2Config(
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_inner=128,
        vocab_size=512,
        n_positions=1024,
        initializer_range=0.2,
        bos_token_id=None,
        eos_token_id=None,
    )


def _qwen25_15b():
    """The Qwen2.5-1.5B architecture (config numbers of the released model), random weights."""
    from transformers import Qwen2Config

    return Qwen2Config(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
        sliding_window=32768,
        max_window_layers=21,
        hidden_act="silu",
        bos_token_id=151643,
        eos_token_id=151643,
        attention_dropout=0.0,
        initializer_range=0.02,
    )


PRESETS: dict[str, Callable[[], Any]] = {
    "tiny-qwen2": _tiny_qwen2,
    "tiny-llama": _tiny_llama,
    "tiny-llama-gelu": _tiny_llama_gelu,
    "tiny-gpt2": _tiny_gpt2,
    "qwen2.5-1.5b": _qwen25_15b,
}
# The tokenizer each preset is served with: presets ship no tokenizer files, so all declare the
# byte-level tokenizer (no chat template: /v1/chat/completions answers 400 on them).
PRESET_TOKENIZERS: dict[str, str] = {name: "byte" for name in PRESETS}


class ModelLoadError(ValueError):
    """The model spec names neither a preset nor a usable folder."""


class ByteTokenizer:
    """Byte-level fallback tokenizer (see the module docstring for the exact mapping)."""

    is_byte_level = True
    eos_token_ids: frozenset[int] = frozenset()
    bos_token_id: int | None = None
    chat_template: str | None = None

    def __init__(self, vocab_size: int):
        if vocab_size < 1:
            raise ValueError("vocab_size must be positive")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab_size for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([int(token_id) % 256])

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")


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
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._byte_decoder: dict[str, int] | None = None
        if decoder is not None and "ByteLevel" in repr(decoder):  # GPT-2 style byte-level BPE
            from transformers.convert_slow_tokenizer import bytes_to_unicode

            self._byte_decoder = {c: b for b, c in bytes_to_unicode().items()}

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tok, "chat_template", None) or None

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> list[int]:
        """Prompt token ids of a conversation, ending with the assistant's generation prompt."""
        out = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out  # transformers 5 answers a BatchEncoding
        return [int(i) for i in ids]

    def token_text(self, token_id: int) -> str:
        return self.tok.decode([int(token_id)], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes (a byte-level BPE piece may be part of a UTF-8 character)."""
        if self._byte_decoder is not None and int(token_id) not in self.tok.all_special_ids:
            piece = self.tok.convert_ids_to_tokens(int(token_id))
            if isinstance(piece, str) and piece and all(c in self._byte_decoder for c in piece):
                return bytes(self._byte_decoder[c] for c in piece)
        return self.token_text(token_id).encode("utf-8")


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Any
    name: str  # what /v1/models reports and what the swap manifest keys on
    device: str
    dtype: torch.dtype
    seed: int
    source: str  # "preset" | "folder" | "hf-cache"
    random_weights: bool

    @property
    def config(self):
        return self.model.config


def resolve_device(device: str | None) -> str:
    if device is None or device in ("", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"--device {device} asked for, but CUDA is not available here")
    return device


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """Default: bfloat16 on CUDA, float32 on CPU (the Triton interpreter mishandles bf16)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype in ("", "auto"):
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
        model = built_with_attention(
            lambda attention: AutoModelForCausalLM.from_config(config, attn_implementation=attention)
        )
    return model.to(device=device, dtype=dtype)


def built_with_attention(build: Callable[[str], Any]) -> Any:
    """`build(attention)` with SDPA, or with the architecture's own eager attention where transformers
    refuses SDPA for it (Gemma2 in some releases: its soft-capping), the reason logged."""
    try:
        return build("sdpa")
    except ValueError as exc:
        if "scaled_dot_product_attention" not in str(exc):
            raise
        log.warning("this architecture has no SDPA attention in transformers, so it is served with eager attention")
        return build("eager")


def resolve_model(spec: str) -> tuple[str, Path | None, str]:
    """(source, folder, name) of a `--model` spec: ("preset", None, spec), ("folder", path, str(path))
    or ("hf-cache", snapshot path, spec) for a Hugging Face model id found in the local cache (never
    downloaded). ModelLoadError when it is none of these."""
    if spec in PRESETS:
        return "preset", None, spec
    folder = Path(spec).expanduser()
    if folder.is_dir():
        folder = folder.resolve()
        return "folder", folder, str(folder)
    if looks_like_a_path(spec):  # not a model id: no download would help
        raise ModelLoadError(
            f"--model {spec}: no such folder ({folder.resolve()}); pass a model folder that exists, "
            f"or a preset ({', '.join(sorted(PRESETS))})"
        )
    snapshot, why = _cached_snapshot(spec)
    if snapshot is not None:
        return "hf-cache", snapshot, spec
    raise ModelLoadError(
        f"--model {spec!r} is neither a preset ({', '.join(sorted(PRESETS))}), a local folder "
        f"nor a Hugging Face model id in the local cache ({why}); nothing is downloaded: "
        f"fetch it first, e.g. `hf download {spec}`"
    )


def looks_like_a_path(spec: str) -> bool:
    """A `--model` that names a place on disk rather than a Hugging Face id (`org/name`): absolute,
    relative with `.` or `~`, more than one `/`, or inside a folder that exists here."""
    if spec.startswith(("/", ".", "~")) or spec.count("/") > 1:
        return True
    head = spec.split("/", 1)[0]
    return "/" in spec and Path(head).is_dir()


def _cached_snapshot(repo_id: str) -> tuple[Path | None, str]:
    """The local snapshot folder of a Hugging Face model id (local cache only), or (None, why not)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except Exception:  # noqa: BLE001 - not an id at all
        return None, "not a valid model id"
    try:
        return Path(snapshot_download(repo_id, local_files_only=True)), ""
    except Exception:  # noqa: BLE001 - LocalEntryNotFoundError and friends
        return None, f"not found in {constants.HF_HUB_CACHE}"


def load_tokenizer(folder: Path, config: Any, byte_tokenizer: bool = False) -> Any:
    """The folder's tokenizer; ModelLoadError when it has none or it does not load, unless
    `byte_tokenizer` asks for `ByteTokenizer` (which is then used whatever the folder holds)."""
    if byte_tokenizer:
        return ByteTokenizer(int(config.vocab_size))
    if not _has_tokenizer(folder):
        raise ModelLoadError(
            f"{folder} has no tokenizer (tokenizer.json, tokenizer_config.json, ...); "
            "pass --byte-tokenizer to serve it with the byte-level tokenizer"
        )
    from transformers import AutoTokenizer

    try:
        return HFTokenizer(AutoTokenizer.from_pretrained(folder, local_files_only=True), config)
    except Exception as exc:  # noqa: BLE001 - reported as one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ModelLoadError(
            f"the tokenizer of {folder} does not load ({type(exc).__name__}: {first}); "
            "pass --byte-tokenizer to serve it with the byte-level tokenizer"
        ) from exc


def load_model(
    spec: str,
    *,
    random_weights: bool = False,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    seed: int = 0,
    byte_tokenizer: bool = False,
) -> LoadedModel:
    """Load a preset (always random weights), a local folder or a cached Hugging Face model id
    (weights, or config + random weights)."""
    problem = model_problem(spec, random_weights)
    if problem is not None:
        raise ModelLoadError(problem)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    source, folder, name = resolve_model(spec)
    if folder is None:
        config = PRESETS[spec]()
        model = _from_config(config, device, torch_dtype, seed)
        assert PRESET_TOKENIZERS[spec] == "byte"
        tokenizer: Any = ByteTokenizer(int(config.vocab_size))
        random_weights = True
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        tokenizer = load_tokenizer(folder, config, byte_tokenizer)  # before the (slower) weights
        if random_weights:
            model = _from_config(config, device, torch_dtype, seed)
        else:
            model = built_with_attention(
                lambda attention: AutoModelForCausalLM.from_pretrained(
                    folder, dtype=torch_dtype, attn_implementation=attention, local_files_only=True
                )
            )
            model = model.to(device)
    model.eval()
    model.requires_grad_(False)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        device=device,
        dtype=torch_dtype,
        seed=seed,
        source=source,
        random_weights=random_weights,
    )


def model_problem(spec: str, random_weights: bool = False, byte_tokenizer: bool | None = None) -> str | None:
    """Why `spec` cannot be served, found without loading the model (so `serve` can refuse before
    it binds its port); None when it can be. With `byte_tokenizer` given (`serve` passes it), the
    folder's tokenizer is loaded too: a tokenizer that does not load is a problem unless it is True."""
    try:
        source, folder, _ = resolve_model(spec)
    except ModelLoadError as exc:
        return str(exc)
    if folder is None:
        return None
    if not (folder / "config.json").exists():
        return f"{folder} has no config.json: pass a Hugging Face model folder or a preset"
    if not random_weights and not _has_weights(folder):
        return f"{folder} holds a config but no weights; pass --random-weights to serve it with random weights"
    if byte_tokenizer is False:
        from transformers import AutoConfig

        try:
            load_tokenizer(folder, AutoConfig.from_pretrained(folder, local_files_only=True))
        except ModelLoadError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - a config transformers cannot read
            return f"{folder}/config.json does not load ({type(exc).__name__}: {exc})".splitlines()[0]
    return None


def describe(loaded: LoadedModel) -> dict[str, Any]:
    cfg = loaded.config
    return {
        "name": loaded.name,
        "source": loaded.source,
        "architecture": type(loaded.model).__name__,
        "device": loaded.device,
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "seed": loaded.seed,
        "random_weights": loaded.random_weights,
        "tokenizer": "byte-level" if getattr(loaded.tokenizer, "is_byte_level", False) else "folder",
        "chat_template": bool(getattr(loaded.tokenizer, "chat_template", None)),
        "vocab_size": int(getattr(cfg, "vocab_size", 0) or 0),
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
    }


def write_preset_folder(preset: str, folder: str | Path) -> Path:
    """Write a preset's config.json into `folder` (a config-only folder for `--random-weights`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    PRESETS[preset]().save_pretrained(folder)
    return folder


__all__ = [
    "ByteTokenizer",
    "HFTokenizer",
    "LoadedModel",
    "ModelLoadError",
    "PRESETS",
    "PRESET_TOKENIZERS",
    "describe",
    "load_model",
    "load_tokenizer",
    "model_problem",
    "resolve_device",
    "resolve_dtype",
    "resolve_model",
    "write_preset_folder",
]
