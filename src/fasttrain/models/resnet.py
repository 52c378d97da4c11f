"""`resnet`: a small ResNet for 32×32 RGB (CIFAR-10), in the style of He et al.'s CIFAR nets.

[B, C, H, W] → stem Conv3×3(C→w) → BN → ReLU → three stages of `depth` basic residual blocks at
widths w, 2w, 4w (the 2nd and 3rd stages start with stride 2) → global average pool → Linear →
logits [B, num_classes]. A basic block is Conv3×3 → BN → ReLU → Conv3×3 → BN, plus the input
(through a 1×1 conv + BN where the shape changes), then ReLU. Options: `width` (w) and `depth`.

Built for (3, 32, 32), but adaptive: the global pool makes the classifier independent of H and
W, so any image shape works (e.g. (1, 28, 28) for MNIST).

Size with the defaults (width 32, depth 1) at (3, 32, 32), 10 classes: 308,650 parameters;
forward ≈ 98 MFLOP per sample (74 at (1, 28, 28)).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from fasttrain.models import positive_int


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int) -> nn.Sequential:
    # No conv bias: the BatchNorm that follows subtracts the mean, which would cancel it.
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(c_out),
    )


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = _conv_bn(c_in, c_out, 3, stride)
        self.conv2 = _conv_bn(c_out, c_out, 3, 1)
        same = stride == 1 and c_in == c_out
        self.shortcut = nn.Identity() if same else _conv_bn(c_in, c_out, 1, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [B, c_in, H, W] -> [B, c_out, H/stride, W/stride]
        return F.relu(self.conv2(F.relu(self.conv1(x))) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, in_shape: tuple[int, ...], num_classes: int, *, width: int = 32,
                 depth: int = 1):
        super().__init__()
        width = positive_int("resnet", "width", width)
        depth = positive_int("resnet", "depth", depth)
        self.stem = nn.Sequential(_conv_bn(in_shape[0], width, 3, 1), nn.ReLU())
        blocks, c = [], width
        for stage, c_out in enumerate((width, 2 * width, 4 * width)):
            for i in range(depth):
                blocks.append(BasicBlock(c, c_out, stride=2 if stage and i == 0 else 1))
                c = c_out
        self.blocks = nn.ModuleList(blocks)  # stage after stage; checkpointed one block each
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)  # [B, w, H, W]
        for block in self.blocks:
            x = block(x)  # ... -> [B, 4w, H/4, W/4]
        return self.fc(x.mean(dim=(2, 3)))  # global average pool -> [B, num_classes]
