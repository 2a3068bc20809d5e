"""Choose Triton's interpreter on machines without CUDA.

TRITON_INTERPRET must be set before triton is first imported, so every entry point that may load
kernels calls `prepare()` before importing torch-side code that imports triton.
"""

from __future__ import annotations

import os


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def prepare(device: str | None = None) -> str:
    """Set TRITON_INTERPRET=1 unless kernels will run on CUDA. Returns the device to use."""
    if device is None:
        device = "cuda" if cuda_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from gpuyantra.interpreter_speed import install

        install()  # the interpreter's repeated work per launch removed (gpuyantra/interpreter_speed.py)
    return device
