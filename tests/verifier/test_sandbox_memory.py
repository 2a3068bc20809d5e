"""The memory limit charges a session what it really holds: forks of one process share their pages
copy-on-write, so their statm sum counts those pages once per fork (a candidate that forks on every
call would pass the limit with no memory of its own); past the limit, the proportional sum decides."""

from __future__ import annotations

import os
import signal
import time

from gpuyantra.verifier import sandbox

MIB = 2**20


def _fork_sleepers(count: int) -> list[int]:
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        pids.append(pid)
    return pids


def _end(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_forks_sharing_their_pages_are_charged_them_once():
    held = bytearray(os.urandom(64 * MIB))  # touched: resident in this process and, shared, in each fork
    children = _fork_sleepers(4)
    try:
        members = [os.getpid(), *children]
        statm_sum = sandbox._rss(members)
        assert statm_sum >= 5 * 64 * MIB  # each fork's statm shows the shared 64 MiB
        limit = statm_sum - MIB
        assert sandbox._resident(members, limit) < limit  # proportional: the 64 MiB once
    finally:
        _end(children)
    assert len(held) == 64 * MIB


def test_memory_a_fork_writes_for_itself_is_charged_in_full():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        own = bytearray(os.urandom(96 * MIB))
        os.write(write, b"x")
        time.sleep(60)
        os._exit(len(own) & 0)
    os.read(read, 1)
    try:
        members = [os.getpid(), pid]
        assert sandbox._resident(members, limit=0) >= 96 * MIB  # the limit passed: PSS still counts it all
    finally:
        _end([pid])
        os.close(read)
        os.close(write)


def test_below_the_limit_the_cheap_sum_is_used():
    members = [os.getpid()]
    assert sandbox._resident(members, limit=2**62) == sandbox._rss(members)
