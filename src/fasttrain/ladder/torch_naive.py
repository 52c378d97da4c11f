"""`torch-naive`: the report's "Python + PyTorch" row, written the way most tutorials do.

A map-style Dataset that converts each uint8 image to [0, 1] floats when it is fetched (what
torchvision's MNIST with `ToTensor()` does), `DataLoader(batch_size=128)` that fetches and collates
128 single samples per step, `nn.Linear`, `nn.CrossEntropyLoss`, `optim.SGD`, a host→device copy of
every batch, and the loss read every epoch. The DataLoader visits the ladder's shared shuffle order
(the effect of `shuffle=True`, made identical across rows). What limits it: per-sample Python in
`__getitem__` and `collate` (60,000 calls an epoch) and, on a GPU, a pageable copy every step.

Run alone:  python -m fasttrain bench --impl torch-naive [--device cuda]
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from fasttrain.ladder.common import Impl, LadderConfig, LadderData


class _MNIST(Dataset):
    """Raw uint8 images, converted per item as torchvision's `MNIST` + `ToTensor()` do."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x = torch.tensor(x)  # uint8 [N, 784]
        self.y = torch.tensor(y)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i].float() / 255, self.y[i]


class _EpochOrder(Sampler):
    """Yields the ladder's shuffle order of the current epoch (set before iterating)."""

    def __init__(self, orders: np.ndarray):
        self.orders, self.epoch = orders, 0

    def __iter__(self):
        return iter(self.orders[self.epoch].tolist())

    def __len__(self) -> int:
        return self.orders.shape[1]


class TorchNaive(Impl):
    name = "torch-naive"
    reproduces = "Python + Pytorch (GPU)"
    report_ms = 10500.0

    def __init__(self, device: str = "cpu"):
        self.device = device

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        self.sampler = _EpochOrder(data.orders)
        self.loader = DataLoader(
            _MNIST(data.train_x, data.train_y), batch_size=cfg.batch_size, sampler=self.sampler
        )
        self.model = nn.Linear(784, 10).to(self.device)
        with torch.no_grad():
            self.model.weight.copy_(torch.from_numpy(data.w0))
            self.model.bias.copy_(torch.from_numpy(data.b0))
        self.loss_fn = nn.CrossEntropyLoss()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.lr)

    def train_epoch(self, epoch: int) -> float:
        self.sampler.epoch = epoch
        total = torch.zeros((), device=self.device)
        for x, y in self.loader:
            x, y = x.to(self.device), y.to(self.device)
            loss = self.loss_fn(self.model(x), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            total += loss.detach() * len(y)
        return total.item() / self.data.n_train  # the one host read of the epoch

    def params(self):
        return (
            self.model.weight.detach().cpu().numpy().copy(),
            self.model.bias.detach().cpu().numpy().copy(),
        )
