"""A user's own model, data and loss, outside the package: what `--model tests.engine.usermodel:
make` imports. A float regression target: y = sum of a fixed projection of x, plus noise."""

import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, width),
                                  nn.Tanh())
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


def make() -> nn.Module:
    return Regressor()


def data(n: int = 512, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n + 128, 8, generator=g)
    w = torch.linspace(-1, 1, 8)
    y = torch.sin(x @ w) + 0.05 * torch.randn(n + 128, generator=g)
    return {"train": (x[:n], y[:n]), "test": (x[n:], y[n:])}


def huber(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A custom loss: anything (output, target) -> scalar."""
    return nn.functional.smooth_l1_loss(output.float(), target, beta=0.5)
