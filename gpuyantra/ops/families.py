"""Imports every built-in op family module so each registers itself."""

import gpuyantra.ops.add_rms_norm  # noqa: F401 - registers its family
import gpuyantra.ops.gelu_tanh_mul  # noqa: F401 - registers its family
import gpuyantra.ops.gemma_rms_norm  # noqa: F401 - registers its family
import gpuyantra.ops.layer_norm  # noqa: F401 - registers its family
import gpuyantra.ops.linear  # noqa: F401 - registers its family
import gpuyantra.ops.rms_norm  # noqa: F401 - registers its family
import gpuyantra.ops.rope  # noqa: F401 - registers its family
import gpuyantra.ops.silu_mul  # noqa: F401 - registers its family
import gpuyantra.ops.softmax  # noqa: F401 - registers its family
