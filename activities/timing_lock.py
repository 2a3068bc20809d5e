"""The GPU-wide timing lock, held by the served-speed check as verifications hold it while they time.

Verifications on one GPU take turns timing under an exclusive `flock` (the verifier's
`gpu-timing.lock`, `gpuyantra/verifier/baselines.py:timing_lock`). The campaign's served-speed
check takes the same lock, so it is not measured under another target's verification and no
verdict is timed under the check's load. Its wait is bounded: past it the check measures anyway
and says so (`held: false`), rather than stalling a campaign behind a long verification.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

POLL_S = 0.05


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def held(path: Path, wait_s: float) -> Iterator[dict[str, Any]]:
    """Hold an exclusive flock on `path` for the block, waiting at most `wait_s` for it. Yields
    `{"held", "waited_s"}`: `held` is False when the wait ran out and the block runs without it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        started = time.monotonic()
        deadline = started + wait_s
        locked = _try_lock(fd)
        while not locked and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            locked = _try_lock(fd)
        yield {"held": locked, "waited_s": round(time.monotonic() - started, 3)}
    finally:
        os.close(fd)  # closing releases the lock
