"""Shared fixtures. Kernels run in Triton's interpreter on this CPU-only machine; the variable
must be set before anything imports triton."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
