"""Convolutions (1-D, 2-D, 3-D, any groups; transposed without groups) as ops the author writes.

A convolution is a matrix product whose K runs over (input channel of the group, window position):
the window positions are gathered at once, next to the channels (window.py's `Window.read_all`:
index clamped, padding masked to 0; a single load in the kernel), and one einsum contracts them with
the weight viewed as [out channels, in channels per group, positions]. The author writes that
einsum as a tiled `tl.dot` product whose operand is gathered in its prologue, with float32 sums.
A transposed convolution gathers the other way: output position o reads input position
(o + padding - j * dilation) / stride where that divides exactly.

Registered as a decomposition of `aten.convolution` (trace.py); the sizes stay symbolic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gpuyantra.authors.opengen.spec import Unsupported
from gpuyantra.authors.opengen.window import TransposedWindow, Window

aten = torch.ops.aten


def convolution(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
) -> torch.Tensor:
    n = weight.dim() - 2
    if n < 1 or n > 3:
        raise Unsupported(f"a convolution over {n} dims")
    if x.dim() != n + 2:
        raise Unsupported("an unbatched convolution input")
    if transposed and groups > 1:
        raise Unsupported("a grouped transposed convolution")
    kernel = list(weight.shape[2:])
    window: Window
    if transposed:
        window = TransposedWindow(x, n, kernel, stride, padding, dilation, output_padding)
    else:
        window = Window(x, n, kernel, stride, padding, dilation, False)
    stacked = window.read_all(0.0)  # [N, C, positions, *out]: one gather, not one per position
    positions = stacked.shape[2]
    batch = x.shape[0]
    # Input channels per group come from the weight (fixed), so the input's channel dim is tied to it.
    per_group = weight.shape[0] // groups if transposed else weight.shape[1]
    grouped = stacked.reshape(batch, groups, per_group, positions, *window.out)
    if transposed:  # weight [C_in, C_out / groups, *kernel]: out channel o of group g reads w[g, c, o]
        out_per_group = weight.shape[1]
        w = weight.reshape(groups, per_group, out_per_group, positions).permute(0, 2, 1, 3)
    else:  # weight [C_out, C_in / groups, *kernel]
        out_per_group = weight.shape[0] // groups
        w = weight.reshape(groups, out_per_group, per_group, positions)
    out = torch.einsum("ngck...,gock->ngo...", grouped, w)
    out = out.reshape(batch, groups * out_per_group, *window.out)
    if bias is not None:
        out = out + bias.reshape([1, -1] + [1] * n)
    return out


DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {aten.convolution.default: convolution}
