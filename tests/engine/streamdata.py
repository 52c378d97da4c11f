"""Datasets for the streamed-path tests, importable by torchrun subprocesses
(--data tests.engine.streamdata:ordered)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset


class Flipped(Dataset):
    """Sample i: a 1×4×4 uint8 image of value i % 251 with a random flip (torch's RNG, as a
    torchvision transform draws it) and class i % 4; counts its reads."""

    classes = ["a", "b", "c", "d"]

    def __init__(self, n: int = 512):
        self.n, self.reads = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.reads += 1
        x = torch.arange(16, dtype=torch.uint8).reshape(1, 4, 4) + i % 200
        if torch.rand(()) < 0.5:
            x = x.flip(2)
        return x, i % 4


class Numbers(IterableDataset):
    """The integers [0, n) as (tensor([i]), i % 4): a stream without length."""

    def __init__(self, n: int = 96):
        self.n = n

    def __iter__(self):
        return ((torch.tensor([float(i)]), i % 4) for i in range(self.n))


class SplitNumbers(Numbers):
    """The same stream, reading only its share (as a stream split by files would)."""

    splits_itself = True

    def __iter__(self):
        from fasttrain.engine.sampling import shard

        k, n = shard()
        return ((torch.tensor([float(i)]), i % 4) for i in range(k, self.n, n))


class Ordered(Flipped):
    """Flipped without the flip: no random transform, so N processes equal one exactly."""

    def __getitem__(self, i: int):
        return torch.arange(16, dtype=torch.uint8).reshape(1, 4, 4) + i % 200, i % 4


def ordered():
    return Ordered(256)


def numbers():
    return {"train": Numbers(256), "test": Numbers(32)}


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.Dropout(0.1), nn.ReLU(),
                         nn.Linear(32, 4))


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(1, 4)


def plain() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


class Ids(torch.utils.data.Dataset):
    """Map-style: sample i is (tensor([i]), i % 4)."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        return torch.tensor([float(i)]), i % 4


def ids():
    return Ids()


class Recording(nn.Linear):
    """Linear(1, 4) that appends the sample ids it trains on to $FT_SEEN/rank<RANK>.txt."""

    def forward(self, x):
        import os

        if self.training:
            with open(f"{os.environ['FT_SEEN']}/rank{os.environ.get('RANK', '0')}.txt", "a") as f:
                f.write("".join(f"{int(v)}\n" for v in x[:, 0].tolist()))
        return super().forward(x)


def recording() -> nn.Module:
    torch.manual_seed(0)
    return Recording(1, 4)


class Uneven(IterableDataset):
    """No length, split by itself into uneven shares, as files of different sizes make them:
    reader 0 of 2 gets 40 items a pass, reader 1 gets 24 (5 and 3 steps of 8); alone, 64.
    Appends each epoch it is given to $FT_SEEN/epochs-rank<RANK>.txt."""

    splits_itself = True

    def set_epoch(self, epoch: int) -> None:
        import os

        with open(f"{os.environ['FT_SEEN']}/epochs-rank{os.environ.get('RANK', '0')}.txt",
                  "a") as f:
            f.write(f"{epoch}\n")

    def __iter__(self):
        from fasttrain.engine.sampling import shard

        k, n = shard()
        count = 64 if n == 1 else (40 if k == 0 else 24)
        return ((torch.tensor([float(i)]), i % 4) for i in range(count))


def uneven():
    return Uneven()
