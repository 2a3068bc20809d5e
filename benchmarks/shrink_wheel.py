#!/usr/bin/env python3
"""Strip the debug sections of a binary wheel's shared libraries, in place, with its RECORD rewritten.

A device call carries at most 64 MiB; uvloop's wheel holds a 16 MB library of which 14 MB is debug
information the interpreter never loads. Libraries without debug sections are left as they are.

    python benchmarks/shrink_wheel.py .whl/uvloop-*.whl
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def stripped(data: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lib.so"
        path.write_bytes(data)
        subprocess.run(["strip", "--strip-debug", str(path)], check=True)
        return path.read_bytes()


def shrink(wheel: Path) -> tuple[int, int]:
    """(size before, size after) of the wheel file."""
    before = wheel.stat().st_size
    with zipfile.ZipFile(wheel) as src:
        entries = {info.filename: src.read(info) for info in src.infolist()}
    changed = {name: stripped(data) for name, data in entries.items() if name.endswith(".so")}
    changed = {name: data for name, data in changed.items() if len(data) < len(entries[name])}
    if not changed:
        return before, before
    entries.update(changed)
    record = next(name for name in entries if name.endswith(".dist-info/RECORD"))
    lines = [record_line(name, data) for name, data in entries.items() if name != record] + [f"{record},,"]
    entries[record] = ("\n".join(lines) + "\n").encode()
    shrunk = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(shrunk, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        for name, data in entries.items():
            dst.writestr(name, data)
    shrunk.replace(wheel)
    return before, wheel.stat().st_size


def main(argv: list[str]) -> int:
    for arg in argv:
        before, after = shrink(Path(arg))
        print(f"{Path(arg).name}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
