"""The op registry: every op family gpuyantra can write, verify and swap kernels for."""

from __future__ import annotations

from gpuyantra.ops.base import OpFamily, ParamSpec, adapter_kwargs, import_class

_REGISTRY: dict[str, OpFamily] = {}


class UnknownOpError(LookupError):
    pass


def register(family: OpFamily) -> OpFamily:
    _REGISTRY[family.name] = family
    return family


def get_op(name: str) -> OpFamily:
    _load_builtin_families()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownOpError(f"unknown op {name!r}; known ops: {', '.join(sorted(_REGISTRY))}") from None


def all_ops() -> list[OpFamily]:
    _load_builtin_families()
    return list(_REGISTRY.values())


def _load_builtin_families() -> None:
    # Imported lazily so `gpuyantra.ops` stays cheap to import; each module registers its family.
    from gpuyantra.ops import families  # noqa: F401


__all__ = ["OpFamily", "ParamSpec", "UnknownOpError", "adapter_kwargs", "all_ops", "get_op", "import_class", "register"]
