"""Live input shapes per matched module class, recorded from real traffic (parity checks, profiles)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from gpuyantra.binding import ModuleGroup


class ShapeRecorder:
    """Records the input shapes each matched module class sees in real traffic (forward pre-hooks)."""

    def __init__(self, model: torch.nn.Module, groups: Sequence[ModuleGroup], keep: int = 12):
        self.keep = keep
        self._shapes: dict[str, OrderedDict[tuple[int, ...], int]] = {}
        self._lock = threading.Lock()
        self._handles = []
        modules = dict(model.named_modules())
        self._live_ids: set[int] = set()
        for group in groups:
            # A linear shape group (every q_proj of the model, ...) sees one traffic pattern: one hook
            # per group, not one per Linear (a Python hook on ~200 projections costs each eager step).
            for name in group.names[:1] if group.param_shapes else group.names:
                module = modules[name]
                if id(module) in self._live_ids:
                    continue
                self._live_ids.add(id(module))
                self._handles.append(module.register_forward_pre_hook(self._hook(group.key), with_kwargs=True))
        self.enabled = True

    def _hook(self, key: str):
        def hook(module, args, kwargs):
            # deepcopies of a live module (binding probes) inherit the hook: only live modules count
            if not self.enabled or id(module) not in self._live_ids:
                return None
            x = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(x, torch.Tensor):
                shape = tuple(int(d) for d in x.shape)
                with self._lock:
                    od = self._shapes.setdefault(key, OrderedDict())
                    od[shape] = od.get(shape, 0) + 1
                    od.move_to_end(shape, last=False)
                    while len(od) > self.keep:
                        od.popitem(last=True)
            return None

        return hook

    def shapes_for(self, qualified_class: str) -> list[tuple[int, ...]]:
        """Most recent first."""
        with self._lock:
            return list(self._shapes.get(qualified_class, {}))

    def counts_for(self, qualified_class: str) -> dict[tuple[int, ...], int]:
        with self._lock:
            return dict(self._shapes.get(qualified_class, {}))

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
