"""Kernels run in Triton's interpreter on CPU-only machines: set before anything imports triton."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
