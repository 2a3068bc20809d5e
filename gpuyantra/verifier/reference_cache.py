"""What the judge compares against, computed once per process for the same question.

A case's float64 reference, and the allowance an honest kernel gets around it, depend on the op,
the case (seed, shape, dtype, distribution) and the parameters' specs, never on the candidate. A
worker judges the same cases again and again: every iteration of a target, every verification of a
warm campaign, six verifications of one op at once. Each recomputed the inputs, three references and
the allowances on the device, beside the child's own GPU work and under the worker's one GIL.

Kept per process (on the judging device) in least-recently-used order, up to a byte budget
(`GPUYANTRA_REFERENCE_CACHE_MB`; 0 turns it off). A key is computed once however many judgings ask
for it at the same time: the others wait for it instead of computing it beside it.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

BUDGET_ENV = "GPUYANTRA_REFERENCE_CACHE_MB"
DEFAULT_BUDGET_MB = {"cuda": 4096, "cpu": 1024}
# A single entry past this share of the budget is computed and not kept: it would push out many.
LARGEST_SHARE = 0.25


class Sized(Protocol):
    def nbytes(self) -> int: ...


T = TypeVar("T", bound=Sized)


def budget_bytes(device_type: str) -> int:
    """The budget for references kept on this kind of device; a malformed setting is a clear error."""
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return DEFAULT_BUDGET_MB.get(device_type, DEFAULT_BUDGET_MB["cpu"]) * 2**20
    try:
        megabytes = float(raw)
    except ValueError:
        raise ValueError(f"{BUDGET_ENV}={raw!r} is not a number of MiB") from None
    if megabytes < 0:
        raise ValueError(f"{BUDGET_ENV}={raw!r} is negative")
    return int(megabytes * 2**20)


class ReferenceCache(Generic[T]):
    """Least-recently-used values by key, up to `budget` bytes, each key computed once at a time."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[Hashable, T] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._computing: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value kept for `key`, else `compute()`'s (kept when it fits). A judging that asks while
        another computes the same key waits for that one's value."""
        if self.budget <= 0:
            return compute()
        with self._lock:
            if (value := self._hit(key)) is not None:
                return value
            computing = self._computing.setdefault(key, threading.Lock())
        with computing:
            with self._lock:
                if (value := self._hit(key)) is not None:
                    return value
                self.misses += 1
            try:
                value = compute()
                with self._lock:
                    self._keep(key, value)
            finally:
                with self._lock:
                    self._computing.pop(key, None)
        return value

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def _hit(self, key: Hashable) -> T | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
            self.hits += 1
        return value

    def _keep(self, key: Hashable, value: T) -> None:
        size = value.nbytes()
        if size > self.budget * LARGEST_SHARE:
            return
        self._items[key] = value
        self._bytes += size
        while self._bytes > self.budget and self._items:
            _, evicted = self._items.popitem(last=False)
            self._bytes -= evicted.nbytes()
