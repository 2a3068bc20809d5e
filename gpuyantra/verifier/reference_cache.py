"""What the judge compares against, computed once per process for the same question.

A case's float64 reference, and the allowance an honest kernel gets around it, depend on the op,
the case (seed, shape, dtype, distribution) and the parameters' specs, never on the candidate. A
worker judges the same cases again and again: every iteration of a target, every verification of a
warm campaign, six verifications of one op at once. Each recomputed the inputs, three references and
the allowances on the device, beside the child's own GPU work and under the worker's one GIL.

Kept per process (on the judging device) up to a byte budget (`GPUYANTRA_REFERENCE_CACHE_MB`; 0
turns it off; by default an eighth of the GPU's memory between 4 and 16 GiB), per plan
(`ReferenceCache`). A key is computed once however many judgings ask for it at the same time: the
others wait for it instead of computing it beside it.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

BUDGET_ENV = "GPUYANTRA_REFERENCE_CACHE_MB"
DEFAULT_BUDGET_MB = {"cuda": 4096, "cpu": 1024}
# On a GPU with room to spare, up to this share of its memory, at most CUDA_MAX_BUDGET_MB: the
# command's three dtypes make a plan of about 12 GiB (rms_norm at the decode shapes), so 4 GiB kept a
# third of it and every verification on a 141 GB H200 computed the rest again (the parent's CPU per
# judging 0.13-0.28 s in six at once, against 0.09-0.10 s with the whole plan kept).
CUDA_MEMORY_SHARE = 1 / 8
CUDA_MAX_BUDGET_MB = 16384
# A single entry past this share of the budget is computed and not kept: it would push out many.
LARGEST_SHARE = 0.25


class Sized(Protocol):
    def nbytes(self) -> int: ...


T = TypeVar("T", bound=Sized)


def budget_bytes(device_type: str, device_memory: int | None = None) -> int:
    """The budget for references kept on this kind of device (`device_memory`: the judging GPU's total
    bytes, where known); a malformed setting is a clear error."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        default = DEFAULT_BUDGET_MB.get(device_type, DEFAULT_BUDGET_MB["cpu"]) * 2**20
        if device_type == "cuda" and device_memory:
            return max(default, min(int(device_memory * CUDA_MEMORY_SHARE), CUDA_MAX_BUDGET_MB * 2**20))
        return default
    try:
        megabytes = float(raw)
    except ValueError:
        raise ValueError(f"{BUDGET_ENV}={raw!r} is not a number of MiB") from None
    if megabytes < 0:
        raise ValueError(f"{BUDGET_ENV}={raw!r} is negative")
    return int(megabytes * 2**20)


class _InFlight(Generic[T]):
    """A value being computed: set, then `done`; None when the computation raised."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None


class ReferenceCache(Generic[T]):
    """Values by (group, key) up to `budget` bytes, each computed once at a time.

    A group is one question's plan (an op and its parameters' specs on a device), and verifications
    judge its keys in the same order every time. Plain least-recently-used order would keep nothing
    of a plan larger than the budget (each key pushed out before its next use: a 4.9 GB plan of 210
    cases against 4 GB). So groups leave least recently used first, whole, to make room for another
    group, and a group that alone fills the budget keeps the keys it already holds: the same first
    cases hit every time."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.hits = 0
        self.misses = 0
        self._groups: OrderedDict[Hashable, dict[Hashable, T]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._computing: dict[tuple[Hashable, Hashable], _InFlight[T]] = {}

    def get(self, group: Hashable, key: Hashable, compute: Callable[[], T]) -> T:
        """The value kept for (`group`, `key`), else `compute()`'s (kept when there is room). A
        judging that asks while another computes the same key waits for that one's value, and gets
        it whether or not it is kept: six judgings of one plan past the budget then compute each key
        once between them, not one after another (each waiting for the previous one's computation,
        then doing it again because it was not kept)."""
        if self.budget <= 0:
            return compute()
        with self._lock:
            if (value := self._hit(group, key)) is not None:
                return value
            flight = self._computing.get((group, key))
            if flight is None:
                flight = self._computing[(group, key)] = _InFlight()
                self.misses += 1
                owner = True
            else:
                owner = False
        if not owner:
            flight.done.wait()
            if flight.value is not None:
                return flight.value
            return compute()  # the computation it waited for raised: its own, to raise its own error
        try:
            value = compute()
            flight.value = value
            with self._lock:
                self._keep(group, key, value)
        finally:
            with self._lock:
                self._computing.pop((group, key), None)
            flight.done.set()
        return value

    def __len__(self) -> int:
        return sum(len(items) for items in self._groups.values())

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._groups.clear()
            self._bytes = 0

    def _hit(self, group: Hashable, key: Hashable) -> T | None:
        items = self._groups.get(group)
        value = items.get(key) if items is not None else None
        if value is not None:
            self._groups.move_to_end(group)
            self.hits += 1
        return value

    def _keep(self, group: Hashable, key: Hashable, value: T) -> None:
        size = value.nbytes()
        if size > self.budget * LARGEST_SHARE:
            return
        for other in list(self._groups):  # least recently used first; never the group itself
            if self._bytes + size <= self.budget:
                break
            if other != group:
                self._bytes -= sum(v.nbytes() for v in self._groups.pop(other).values())
        if self._bytes + size > self.budget:
            return  # the group alone fills the budget: it keeps what it holds
        self._groups.setdefault(group, {})[key] = value
        self._groups.move_to_end(group)
        self._bytes += size
