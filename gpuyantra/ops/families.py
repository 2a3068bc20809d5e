"""Imports every built-in op family module so each registers itself."""

from gpuyantra.ops import rms_norm  # noqa: F401
