"""Store the raw outputs under docs/perf compressed (xz), and point the pages at the compressed names.

Why xz: the campaign histories are JSON with base64 payloads, which xz stores in a quarter of
gzip's bytes; the folder stays light enough to clone. Pages (`*.md`), images and the small scripts
that reproduce a run stay as they are. A page's backquoted name of a raw file (`call2/kb_l1.json`,
`history-cold.json.gz`) becomes the compressed one; read a file with `xz -dc NAME.xz`.

Run from anywhere: `python docs/perf/compress_raw.py` (idempotent).
"""

from __future__ import annotations

import gzip
import lzma
import re
from pathlib import Path

PERF = Path(__file__).resolve().parent
KEPT_SUFFIXES = {".md", ".png", ".sh", ".py", ".xz"}  # read as they are (pages, images, scripts)
SMALL_BYTES = 16 * 1024  # raw files up to this size stay plain text
BACKQUOTED = re.compile(r"`([^`\s]+)`")


def compress(path: Path) -> Path:
    """`x.json` -> `x.json.xz`, `x.json.gz` -> `x.json.xz` (the same bytes, stored smaller)."""
    if path.suffix == ".gz":
        data, target = gzip.decompress(path.read_bytes()), path.with_suffix(".xz")
    else:
        data, target = path.read_bytes(), path.with_name(path.name + ".xz")
    target.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    path.unlink()
    return target


def raw_files(folder: Path) -> list[Path]:
    """Raw outputs worth compressing (a short file reads better as it is and saves nothing)."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.suffix not in KEPT_SUFFIXES and (p.suffix == ".gz" or p.stat().st_size > SMALL_BYTES)
    )


def renamed_name(old: str) -> str:
    return old[: -len(".gz")] + ".xz" if old.endswith(".gz") else old + ".xz"


def relink(page: Path, renamed: dict[str, str]) -> bool:
    """Rewrite the page's backquoted names of raw files that were compressed; True when it changed."""
    text = page.read_text()

    def swap(match: re.Match[str]) -> str:
        name = match.group(1)
        new = renamed.get(name)
        return f"`{new}`" if new else match.group(0)

    new_text = BACKQUOTED.sub(swap, text)
    if new_text != text:
        page.write_text(new_text)
    return new_text != text


def names_for(folder: Path, compressed: dict[Path, Path]) -> dict[str, str]:
    """Every way a page may name a compressed file: its path from docs/perf, from the page's
    folder, and its bare name when no other file of the folder has it."""
    names: dict[str, str] = {}
    bare: dict[str, set[str]] = {}
    for old, new in compressed.items():
        for root in (PERF, folder):
            if old.is_relative_to(root):
                names[str(old.relative_to(root))] = str(new.relative_to(root))
        bare.setdefault(old.name, set()).add(str(new.relative_to(folder)))
    for name, news in bare.items():
        if len(news) == 1:
            names.setdefault(name, renamed_name(name))
    return names


def main() -> None:
    pages_changed = 0
    for page in sorted(PERF.glob("*.md")):
        folder = PERF / page.stem
        if not folder.is_dir():
            continue
        for path in raw_files(folder):
            compress(path)
        # Every compressed file under both names it had (`x.json`, `x.json.gz`): a rerun relinks too.
        compressed = {p.with_name(p.name[: -len(".xz")]): p for p in folder.rglob("*.xz")}
        compressed |= {p.with_name(p.name[: -len(".xz")] + ".gz"): p for p in folder.rglob("*.json.xz")}
        pages_changed += relink(page, names_for(folder, compressed))
    print(f"pages relinked: {pages_changed}")


if __name__ == "__main__":
    main()
