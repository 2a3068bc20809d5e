"""`make test-fast` leaves out the modules tests/conftest.py marks slow: each must exist (a renamed
one would silently join the fast run), and the marker must reach their tests."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import SLOW_MODULES

ROOT = Path(__file__).resolve().parents[1]


def test_every_slow_module_exists() -> None:
    assert [m for m in sorted(SLOW_MODULES) if not (ROOT / m).is_file()] == []


def test_this_module_is_not_marked_slow(request) -> None:
    assert request.node.get_closest_marker("slow") is None
