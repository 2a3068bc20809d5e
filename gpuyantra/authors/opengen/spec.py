"""What the open author is given (OpenSpec) and how it says no (Unsupported)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class Unsupported(ValueError):
    """The computation holds something the open author cannot write a kernel for; the message is
    the reason, on one line."""

    def __init__(self, reason: str):
        super().__init__(" ".join(str(reason).split()))


@dataclass(frozen=True)
class OpenSpec:
    """The target: a reference module (CPU, eval mode), its forward's inputs and its bound params."""

    op: str  # OP name written into the file, e.g. "open.model_3f2a1c9e"
    module: torch.nn.Module
    input_names: tuple[str, ...]  # entry's positional parameters, in forward order
    example_inputs: tuple[torch.Tensor, ...]  # CPU tensors at representative (possibly reduced) shapes
    tensor_params: tuple[tuple[str, str], ...] = ()  # (kernel_param, dotted module attr)
    float_params: tuple[tuple[str, str], ...] = ()  # (kernel_param, dotted module attr) of float attributes
    # Kernel params of bound buffers the forward writes new values into (a training-mode
    # BatchNorm's running statistics): entry returns their new values after the forward's outputs.
    updated_buffers: tuple[str, ...] = ()
    # Per input, the dims whose size changes between calls (None: not known, the examples' dims
    # of size 2 and up): the kernel must read each from the call, never bake it.
    variable_dims: tuple[tuple[int, ...], ...] | None = None
    # Every input's shapes in each live call: the kernel must compute each of them.
    calls: tuple[tuple[tuple[int, ...], ...], ...] = ()
    # (kernel_param, position in the forward, live value) of each number the forward takes as an
    # argument besides its tensors: entry takes it as a keyword the caller passes (not in ADAPTER).
    # A float is a run-time kernel argument; an int or a bool is written in at its live value, and
    # entry refuses any other.
    arguments: tuple[tuple[str, int, Any], ...] = ()

    @property
    def keywords(self) -> list[str]:
        """entry's keyword-only parameters: tensor params, float params, then the number arguments."""
        return [kp for kp, _ in self.tensor_params + self.float_params] + [kp for kp, _, _ in self.arguments]

    @property
    def adapter(self) -> list[dict[str, str]]:
        """ADAPTER bindings: tensor params first, then float params, exactly as given."""
        return [
            {"kernel_param": kernel_param, "module_attr": attr}
            for kernel_param, attr in self.tensor_params + self.float_params
        ]
