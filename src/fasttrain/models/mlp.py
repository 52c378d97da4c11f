"""`mlp`: a fully connected ReLU network on the flattened image.

[B, C, H, W] → flatten → (Linear → ReLU) × depth → Linear → logits [B, num_classes]. Options:
`hidden` (width of every hidden layer) and `depth` (number of hidden layers).

Size at (1, 28, 28), 10 classes and the defaults (784→256→256→10): 269,322 parameters; forward
≈ 0.54 MFLOP per sample (2 FLOPs per weight).
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
from torch import nn

from fasttrain.models import positive_int


class MLP(nn.Module):
    def __init__(self, in_shape: tuple[int, ...], num_classes: int, *, hidden: int = 256,
                 depth: int = 2):
        super().__init__()
        hidden = positive_int("mlp", "hidden", hidden)
        depth = positive_int("mlp", "depth", depth)
        widths = [math.prod(in_shape)] + [hidden] * depth
        layers: list[nn.Module] = [
            nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in pairwise(widths)
        ]
        layers.append(nn.Linear(hidden, num_classes))
        self.blocks = nn.ModuleList(layers)  # one checkpointing unit per layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)  # [B, C, H, W] -> [B, C·H·W]
        for block in self.blocks:
            x = block(x)
        return x
