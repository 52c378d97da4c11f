"""`logreg`: multinomial logistic regression, one linear layer on the flattened image.

The engine's version of the ladder's model, for any image shape: [B, C, H, W] → flatten →
Linear(C·H·W, num_classes) → logits [B, num_classes].

Size at (1, 28, 28) and 10 classes: 7,850 parameters; forward ≈ 16 kFLOP per sample (2·784·10).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LogReg(nn.Module):
    def __init__(self, in_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        # A one-layer "stack" so that activation checkpointing has the same handle as elsewhere.
        self.blocks = nn.ModuleList([nn.Linear(math.prod(in_shape), num_classes)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)  # [B, C, H, W] -> [B, C·H·W]
        for block in self.blocks:
            x = block(x)
        return x
