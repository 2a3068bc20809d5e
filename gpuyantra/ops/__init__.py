"""The op registry: every op family gpuyantra can write, verify and swap kernels for."""

from __future__ import annotations

from gpuyantra.ops.base import OpFamily, ParamSpec, adapter_kwargs, import_class
from gpuyantra.ops.registry import _REGISTRY, UnknownOpError, register


def get_op(name: str) -> OpFamily:
    _load_builtin_families()
    if name not in _REGISTRY:
        from gpuyantra.ops.open import find_open_family

        find_open_family(name)  # a saved open target registers itself on first use
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownOpError(f"unknown op {name!r}; known ops: {', '.join(sorted(_REGISTRY))}") from None


def all_ops(include_open: bool = False) -> list[OpFamily]:
    """The registered families (and, with `include_open`, the open targets this process knows)."""
    _load_builtin_families()
    return [f for f in _REGISTRY.values() if include_open or f.open_target is None]


def _load_builtin_families() -> None:
    # Imported lazily so `gpuyantra.ops` stays cheap to import; each module registers its family.
    import gpuyantra.ops.families  # noqa: F401


__all__ = ["OpFamily", "ParamSpec", "UnknownOpError", "adapter_kwargs", "all_ops", "get_op", "import_class", "register"]
