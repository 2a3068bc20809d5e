"""Keep the convolution in the library, fuse the rest: a candidate whose `entry` calls
`torch.nn.functional.conv*d` (cuDNN on a GPU) and hands its output to the Triton kernels the open
author writes for everything after it (bias, activations, norms, pooling, reductions).

Why: measured on an H200, the open author's Triton convolutions ran at 0.14-0.57x of eager on
KernelBench level 2, where cuDNN's convolution is most of the time and the epilogue is what a
fused kernel saves. The verifier accepts the library call for such a target only (its forward
computes a convolution: gpuyantra/ops/open/library.py) and times the whole entry.

Found for a Model with one convolution submodule applied first to its only input: the module with
that submodule replaced by an identity (the *tail*), called on the convolution's output, must give
the Model's output on the example input (else the convolution is not where the forward starts),
and something else than that output (else the convolution is the whole problem, written in Triton).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from gpuyantra.authors.opengen.spec import OpenSpec, Unsupported

_CONVS: dict[type, str] = {
    nn.Conv1d: "conv1d",
    nn.Conv2d: "conv2d",
    nn.Conv3d: "conv3d",
    nn.ConvTranspose1d: "conv_transpose1d",
    nn.ConvTranspose2d: "conv_transpose2d",
    nn.ConvTranspose3d: "conv_transpose3d",
}


@dataclass
class LeadingConvolution:
    path: str  # the submodule's dotted name in the Model
    function: str  # torch.nn.functional's name for it
    arguments: str  # its call's arguments after input, weight and bias (stride, padding, ...)
    weight: str  # kernel params of its weight and bias (bias None: the module has none)
    bias: str | None
    tail: OpenSpec  # everything after it, as an open target of its output


def leading_convolution(spec: OpenSpec) -> LeadingConvolution | None:
    """The convolution the forward starts with and the rest of it, or None where it has none."""
    if len(spec.input_names) != 1 or spec.arguments or spec.updated_buffers:
        return None
    convs = [(path, m) for path, m in spec.module.named_modules() if type(m) in _CONVS]
    if len(convs) != 1 or convs[0][1].padding_mode != "zeros":
        return None
    path, conv = convs[0]
    params = dict((attr, kp) for kp, attr in spec.tensor_params)
    weight, bias = params.get(f"{path}.weight"), params.get(f"{path}.bias")
    if weight is None or (conv.bias is not None and bias is None):
        return None
    tail_module = copy.deepcopy(spec.module)
    tail_module.set_submodule(path, nn.Identity())
    x = spec.example_inputs[0]
    try:
        with torch.no_grad():
            y = conv(x)
            want, got = spec.module(x), tail_module(y)
    except Exception:  # noqa: BLE001 - a forward that does not take the convolution's output
        return None
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor) or got.shape != want.shape:
        return None
    if not torch.allclose(got, want, atol=1e-5, rtol=1e-5):
        return None  # the convolution is not (only) the forward's first step on its input
    if got.shape == y.shape and torch.equal(got, y):
        return None  # the convolution is the whole forward: nothing to fuse, the kernel is the convolution
    tail = replace(
        spec,
        module=tail_module,
        example_inputs=(y,),
        tensor_params=tuple((kp, attr) for kp, attr in spec.tensor_params if kp not in (weight, bias)),
        calls=tuple((_output_shape(conv, call[0]),) for call in spec.calls),
    )
    return LeadingConvolution(path, _CONVS[type(conv)], _conv_arguments(conv), weight, bias, tail)


def _output_shape(conv: nn.Module, shape: Any) -> tuple[int, ...]:
    """The convolution's output shape for an input of `shape` (meta device: nothing allocated)."""
    meta = copy.deepcopy(conv).to("meta")
    with torch.no_grad():
        return tuple(meta(torch.empty(tuple(shape), device="meta")).shape)


def _conv_arguments(conv: Any) -> str:
    order: tuple[Any, ...]
    if type(conv) in (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d):
        order = (conv.stride, conv.padding, conv.output_padding, conv.groups, conv.dilation)
    else:
        order = (conv.stride, conv.padding, conv.dilation, conv.groups)
    return ", ".join(repr(tuple(v) if isinstance(v, list) else v) for v in order)


def write_library_conv_source(spec: OpenSpec, strategy: dict[str, Any] | None = None) -> str:
    """The candidate file: the tail's Triton kernels (written by the open author) behind an entry
    that runs the convolution through torch's library first. Raises Unsupported."""
    from gpuyantra.authors.opengen.source import write_open_source

    lead = leading_convolution(spec)
    if lead is None:
        raise Unsupported("no convolution the forward starts with on its only input")
    source = write_open_source(lead.tail, strategy)
    source, renamed = re.subn(r"^def entry\(", "def _epilogue(", source, count=1, flags=re.M)
    adapter = "ADAPTER = [\n" + "".join(f"    {_json(b)},\n" for b in spec.adapter) + "]\n"
    source, replaced = re.subn(r"^ADAPTER = \[\n.*?^\]\n", lambda _: adapter, source, count=1, flags=re.S | re.M)
    if not renamed or not replaced:
        raise Unsupported("the epilogue's file has no entry or ADAPTER to wrap")
    x = spec.input_names[0]
    keywords = spec.keywords
    tail_keywords = lead.tail.keywords
    signature = x + (", *, " + ", ".join(keywords) if keywords else "")
    passed = ", ".join(f"{k}={k}" for k in tail_keywords)
    call = f"{x}, {lead.weight}, {lead.bias or 'None'}, {lead.arguments}"
    entry = (
        f"def entry({signature}):\n"
        "    # The convolution stays in the library (cuDNN on a GPU); the rest is one Triton pass over its output.\n"
        f"    _conv = torch.nn.functional.{lead.function}({call})\n"
        f"    return _epilogue(_conv{', ' + passed if passed else ''})\n"
    )
    note = f"# Library + epilogue: {lead.path} runs as torch.nn.functional.{lead.function}; entry fuses the rest.\n"
    return source.rstrip("\n") + "\n\n\n" + note + entry


def _json(binding: dict[str, str]) -> str:
    import json

    return json.dumps(binding)
