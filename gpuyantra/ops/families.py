"""Imports every built-in op family module so each registers itself."""

from gpuyantra.ops import (
    add_rms_norm,  # noqa: F401
    gelu_tanh_mul,  # noqa: F401
    gemma_rms_norm,  # noqa: F401
    layer_norm,  # noqa: F401
    linear,  # noqa: F401
    rms_norm,  # noqa: F401
    rope,  # noqa: F401
    silu_mul,  # noqa: F401
    softmax,  # noqa: F401
)
