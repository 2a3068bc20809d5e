"""Imports every built-in op family module so each registers itself."""

from gpuyantra.ops import rms_norm  # noqa: F401
from gpuyantra.ops import gemma_rms_norm  # noqa: F401
from gpuyantra.ops import layer_norm  # noqa: F401
from gpuyantra.ops import add_rms_norm  # noqa: F401
from gpuyantra.ops import silu_mul  # noqa: F401
from gpuyantra.ops import gelu_tanh_mul  # noqa: F401
from gpuyantra.ops import rope  # noqa: F401
from gpuyantra.ops import softmax  # noqa: F401
