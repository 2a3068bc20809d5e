"""A KernelBench-format problem for `gpuyantra verify --problem`: a + scale * b at small sizes."""

import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + self.scale * b


def get_inputs():
    return [torch.randn(8, 32), torch.randn(8, 32)]


def get_init_inputs():
    return [0.75]
