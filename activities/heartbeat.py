"""Heartbeat while a blocking call runs, so a crashed worker's activity is retried elsewhere
within the heartbeat timeout instead of after the whole start-to-close timeout."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")
HEARTBEAT_EVERY_S = 5.0


def with_heartbeat(work: Callable[[], T], every_s: float = HEARTBEAT_EVERY_S) -> T:
    """Run `work` on a helper thread and heartbeat from the activity's own thread until it ends."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="activity-work") as pool:
        future = pool.submit(work)
        while True:
            try:
                return future.result(timeout=every_s)
            except concurrent.futures.TimeoutError:
                activity.heartbeat()
