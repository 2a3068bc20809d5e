"""Files other processes read while they are written."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` so no reader ever sees it half written (a temporary file beside it,
    then a rename). Each call has a temporary file of its own: writers of the same path at once
    (verifications of the same bytes share a candidate file named by them) never mix their bytes."""
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
