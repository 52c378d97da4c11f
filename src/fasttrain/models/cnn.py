"""`cnn`: an MNIST-class convnet — VGG-style stages of two 3×3 convolutions and a 2×2 max-pool,
then a two-layer classifier on the flattened feature map.

[B, C, H, W] → per stage: (Conv3×3 → ReLU) × 2 → MaxPool2 (halves H and W) → flatten →
Linear(channels[-1]·(H/2^s)·(W/2^s), hidden) → ReLU → Linear(hidden, num_classes). Options:
`channels` (one width per stage) and `hidden`. The classifier is sized from `in_shape` at build
time, so one model takes one image size: (1, 28, 28) and (3, 32, 32) both work (H and W must be at
least 2^stages). No BatchNorm: plain enough to compare switches on.

Size with the defaults (channels (32, 64), hidden 128), 10 classes:
- (1, 28, 28): 467,818 parameters; forward ≈ 37 MFLOP per sample.
- (3, 32, 32): 591,274 parameters; forward ≈ 50 MFLOP per sample.
"""

from __future__ import annotations

from itertools import pairwise

import torch
from torch import nn

from fasttrain.errors import UserError
from fasttrain.models import positive_int, positive_ints


def _stage(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(),
        nn.Conv2d(c_out, c_out, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
    )


class CNN(nn.Module):
    def __init__(self, in_shape: tuple[int, ...], num_classes: int, *,
                 channels: tuple[int, ...] = (32, 64), hidden: int = 128):
        super().__init__()
        channels = positive_ints("cnn", "channels", channels)
        hidden = positive_int("cnn", "hidden", hidden)
        c, h, w = in_shape
        h_out, w_out = h >> len(channels), w >> len(channels)  # each pool floors the size
        if h_out < 1 or w_out < 1:
            raise UserError(f"cnn: {len(channels)} pooling stages need images of at least "
                            f"{2 ** len(channels)}×{2 ** len(channels)}, got {h}×{w}; pass fewer "
                            f"channels (one per stage)")
        self.blocks = nn.ModuleList(_stage(a, b) for a, b in pairwise((c, *channels)))
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels[-1] * h_out * w_out, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:  # [B, C, H, W] -> [B, channels[-1], H/2^s, W/2^s]
            x = block(x)
        return self.head(x)  # [B, num_classes]
