"""Instances of module classes built on the `meta` device: attribute checks that allocate nothing."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any, cast

import torch

TINY_HIDDEN = 64
TINY_CONFIG = dict(
    hidden_size=TINY_HIDDEN,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=1,
    vocab_size=128,
    head_dim=16,
    n_embd=TINY_HIDDEN,
    n_head=4,
    n_layer=1,
    n_inner=128,
)


def tiny_configs_for(cls: type) -> list:
    """Tiny configs of the transformers config classes that live beside `cls`, most specific
    first (a model's own `...TextConfig` / `...Config` before the generic `PreTrainedConfig`)."""
    module = sys.modules.get(cls.__module__)
    if module is None:
        return []
    config_classes = [
        obj
        for name, obj in vars(module).items()
        if name.endswith("Config") and inspect.isclass(obj) and hasattr(obj, "model_type")
    ]
    config_classes.sort(key=lambda c: (not getattr(c, "model_type", ""), "Text" not in c.__name__))
    configs = []
    for config_cls in config_classes:
        try:
            config = config_cls(**TINY_CONFIG)
        except Exception:  # noqa: BLE001 - config classes reject unknown keys differently; try the next
            continue
        if getattr(config, "hidden_act", None) is None and hasattr(config, "hidden_act"):
            config.hidden_act = "silu"
        configs.append(config)
    return configs


def tiny_config_for(cls: type):
    """A tiny config of the transformers config class that lives beside `cls`, or None."""
    configs = tiny_configs_for(cls)
    return configs[0] if configs else None


def build_instance(cls: type, device: str | torch.device = "cpu") -> torch.nn.Module | None:
    """Construct `cls` with tiny sizes on `device`; None when no known constructor shape fits."""
    params = list(inspect.signature(cast(Any, cls).__init__).parameters)[1:]  # (mypy: __init__ via a type)
    attempts: list[Callable[[], Any]] = []
    if params and params[0] == "config":
        for config in tiny_configs_for(cls):
            attempts.append(partial(cls, config))
            attempts.append(partial(cls, config, layer_idx=0))
    attempts += [lambda: cls(TINY_HIDDEN), lambda: cls(hidden_size=TINY_HIDDEN), lambda: cls()]
    # (in_features, out_features) modules: nn.Linear and its subclasses.
    attempts.append(lambda: cls(TINY_HIDDEN, TINY_HIDDEN))
    for attempt in attempts:
        try:
            with torch.device(device):
                return attempt()
        except Exception:  # noqa: BLE001 - constructor shapes differ; the next attempt may fit
            continue
    return None


@lru_cache(maxsize=256)
def meta_instance(cls: type) -> torch.nn.Module | None:
    return build_instance(cls, "meta")
