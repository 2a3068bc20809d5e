"""The registry itself: op family name -> family. A leaf module, so that the family modules (which
register themselves on import) and the open-target code depend on it without depending on the
package that loads them all (`gpuyantra.ops`: `get_op`, `all_ops`)."""

from __future__ import annotations

from gpuyantra.ops.base import OpFamily

_REGISTRY: dict[str, OpFamily] = {}


class UnknownOpError(LookupError):
    pass


def register(family: OpFamily) -> OpFamily:
    _REGISTRY[family.name] = family
    return family


def registered(name: str) -> OpFamily | None:
    """The family registered under `name` in this process, if any (nothing is loaded)."""
    return _REGISTRY.get(name)
