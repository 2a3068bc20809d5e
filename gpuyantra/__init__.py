"""gpuyantra: profile a served model, write Triton kernels, verify them, hot-swap them in."""

__version__ = "0.1.0"
