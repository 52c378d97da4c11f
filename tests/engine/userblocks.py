"""A user's own model of blocks, outside the package, as docs/distributed.md tells a user to bring
it to --tp and --pp: a `parallelize(tp_mesh)` method (each block's up column-wise, down
row-wise) and a `pipeline_split(n)` whose stages keep the model's parameter names.
`--model tests.engine.userblocks:make --data tests.engine.userblocks:data`; `seq_split` is the
split into nn.Sequential slices that --pp refuses (its stages rename the model's parameters)."""

import torch
from torch import nn


def _split_blocks(blocks, tp_mesh) -> None:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for block in blocks:
        parallelize_module(block, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


class Block(nn.Module):
    def __init__(self, d: int, h: int):
        super().__init__()
        self.norm, self.up, self.act, self.down = (nn.LayerNorm(d), nn.Linear(d, h), nn.GELU(),
                                                   nn.Linear(h, d))

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


class ResMLP(nn.Module):
    def __init__(self, d_in: int = 16, d: int = 32, h: int = 64, n_blocks: int = 4,
                 n_classes: int = 10):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n_blocks))
        self.out = nn.Linear(d, n_classes)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)

    def parallelize(self, tp_mesh) -> None:
        _split_blocks(self.blocks, tp_mesh)

    def pipeline_split(self, n: int) -> list[nn.Module]:
        k = len(self.blocks) // n
        return [Stage(self, range(i * k, (i + 1) * k), i == 0, i == n - 1) for i in range(n)]


class Stage(nn.Module):
    def __init__(self, model: ResMLP, index: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.inp = model.inp
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in index})
        if last:
            self.out = model.out

    def parallelize(self, tp_mesh) -> None:
        _split_blocks(self.blocks.values(), tp_mesh)

    def forward(self, x):
        if self.first:
            x = self.inp(x)
        for block in self.blocks.values():
            x = block(x)
        return self.out(x) if self.last else x


class SeqSplit(ResMLP):
    def pipeline_split(self, n: int) -> list[nn.Module]:
        k = len(self.blocks) // n
        return [nn.Sequential(*([self.inp] if i == 0 else []), *self.blocks[i * k:(i + 1) * k],
                              *([self.out] if i == n - 1 else [])) for i in range(n)]


def make() -> nn.Module:
    return ResMLP()


def seq_split() -> nn.Module:
    return SeqSplit()


def data() -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(640, 16, generator=g)
    y = (x @ torch.randn(16, 10, generator=g)).argmax(1)
    return {"train": (x[:512], y[:512]), "test": (x[512:], y[512:])}


def uneven() -> nn.Module:
    """A 63-unit hidden layer: the plan's column/row split over 2 ranks would be 32 + 31."""
    return ResMLP(h=63)


def data_1025() -> dict:
    """1025 test samples: over 2 data-parallel ranks, shares of 513 and 512 in 3 evaluation
    batches each, of 171 rows on one rank and 171, 171, 170 on the other."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512 + 1025, 16, generator=g)
    y = (x @ torch.randn(16, 10, generator=g)).argmax(1)
    return {"train": (x[:512], y[:512]), "test": (x[512:], y[512:])}
