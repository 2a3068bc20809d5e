"""A module class no registered family binds, for `gpuyantra verify --module`: a + scale * b, with
its inputs and init inputs on the class itself."""

import torch
from torch import nn


class ScaledAdd(nn.Module):
    def __init__(self, scale: float = 0.75):
        super().__init__()
        self.scale = scale

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + self.scale * b

    @staticmethod
    def get_inputs():
        return [torch.randn(8, 32), torch.randn(8, 32)]


class NoInputs(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
