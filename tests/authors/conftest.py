"""Author tests load candidate files; kernels (if any run) use Triton's interpreter on CPU hosts.
Set before anything imports triton."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
