"""Where a training step's micro-batches come from: the device-resident path or a DataLoader.

Both paths visit the same samples in the same order — a permutation drawn from (seed, epoch)
alone — so a run can be resumed at any step of any epoch, and the two paths are interchangeable.
An epoch is `steps_per_epoch` optimizer steps of `accum_steps` micro-batches; the last partial
batch is dropped so every step has the same shapes (what compile and CUDA graphs need).

Across processes (--parallel ddp/fsdp/zero1) the batch size is the global one. The epoch's order
is cut to whole steps exactly as for one process, then dealt out like DistributedSampler: rank r
takes positions r, r + world, r + 2·world, ... Since the global batch B is a multiple of
world · accum_steps, rank r's step s is positions [s·B, (s+1)·B) of the one-process order that
are ≡ r (mod world): the ranks together see exactly the one-process batch of step s, and their
micro-step a together is exactly the one-process micro-batch a. On the device path each rank
keeps the whole dataset on its device (small enough here) and gathers only its own indices.
Evaluation is sharded the same way (ranks take test samples r, r + world, ...) and summed.

Images travel as uint8 (a quarter of float32's bytes, over PCIe too) and become [0, 1] floats on
the device: uint8 inputs, and only they, are scaled; float and int64 inputs pass unchanged. Then
--augment (augment.py) flips and shifts them, on the device, per micro-batch. A language sample
i (data without targets) is the window tokens[i*T : i*T + T] and its targets shifted by one.

This is the in-memory path (tensors, the bundled datasets, a Dataset under --data-in-memory);
any other Dataset, IterableDataset or DataLoader is streamed (stream.py), in the same order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader

from fasttrain.engine.inputs import tokens_per_sample

Batch = tuple[torch.Tensor, torch.Tensor]


def epoch_order(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The sample order of one epoch: a function of (seed, epoch) only, never of history."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


class _Samples:
    """Gathers whole micro-batches of samples by index, from tensors on any device."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor | None, block_size: int):
        self.x, self.y, self.block = x, y, block_size
        if y is None:  # language: windows of the token stream
            self.n = (len(x) - 1) // block_size
            self.offsets = torch.arange(block_size, device=x.device)
        else:
            self.n = len(y)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: torch.Tensor) -> Batch:
        if self.y is None:
            pos = idx.to(self.x.device)[:, None] * self.block + self.offsets  # [B, T]
            return self.x[pos], self.x[pos + 1]
        idx = idx.to(self.x.device)
        return self.x[idx], self.y[idx]


class Batches:
    """This rank's micro-batches for optimizer steps [start_step, steps_per_epoch) of an epoch.
    `batch_size` is the global batch; `micro` is this rank's micro-batch."""

    path = "in memory"

    def __init__(self, task, device: torch.device, batch_size: int, accum_steps: int,
                 seed: int, on_device: bool, workers: int = 0, pin_memory: bool = False,
                 channels_last: bool = False, block_size: int = 128, rank: int = 0,
                 world: int = 1, augment=None, why: str = "tensors"):
        self.device, self.seed, self.why = device, seed, why
        # augment(x, epoch, index) or None, applied to the scaled training batches only
        self.augment = augment or (lambda x, epoch, index: x)
        self.augmenting = augment is not None
        self.rank, self.world, self.batch_size = rank, world, batch_size
        self.micro, self.accum = batch_size // accum_steps // world, accum_steps
        self.language = task.train_y is None
        # Tokens a sample holds: the bundled stream's windows, or a user's token sequences.
        self.tokens_per_sample = (block_size if self.language
                                  else tokens_per_sample((task.train_x, task.train_y)))
        self.sequences = bool(self.tokens_per_sample)  # token sequences: perplexity (run.py)
        self.scale = task.train_x.dtype == torch.uint8  # pixels; anything else is left alone
        self.memory_format = (torch.channels_last if channels_last and task.train_x.dim() == 4
                              else torch.contiguous_format)
        self.on_device = on_device
        src = (lambda t: None if t is None else t.to(device)) if on_device else (lambda t: t)
        self.train = _Samples(src(task.train_x), src(task.train_y), block_size)
        self.test = _Samples(src(task.test_x), src(task.test_y), block_size)
        val_x = getattr(task, "val_x", None)
        self.val = (_Samples(src(val_x), src(task.val_y), block_size) if val_x is not None
                    else None)
        self.workers, self.pin = workers, pin_memory
        self.steps_per_epoch = len(self.train) // batch_size
        if self.steps_per_epoch == 0:
            from fasttrain.errors import UserError

            raise UserError(f"--batch-size {batch_size} is larger than the {len(self.train)} "
                            f"training samples of this dataset; use a smaller batch")
        if 0 < len(self.test) < world:
            from fasttrain.errors import UserError

            raise UserError(f"the test set has {len(self.test)} samples, fewer than the {world} "
                            f"processes that share its evaluation; use fewer processes")

    def _prepare(self, x: torch.Tensor, y: torch.Tensor, at: tuple[int, int] | None = None
                 ) -> Batch:
        """(x, y) on the device, scaled; augmented when `at` = (epoch, micro-batch index)."""
        if not self.on_device:  # the DataLoader's host batches (on the device path they are
            # there already: two no-op .to calls, ~1.4 µs of host each, a step)
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
        if self.scale:  # uint8 pixels → [0, 1] floats, on the device
            x = x.float() / 255
        if at is not None:  # float images are augmented too, as uint8 ones are
            x = self.augment(x, *at)
        if self.scale or self.augmenting or self.memory_format is torch.channels_last:
            x = x.contiguous(memory_format=self.memory_format)
        return x, y

    def step_indices(self, epoch: int, start_step: int = 0) -> torch.Tensor:
        """This rank's sample indices of the remaining steps of `epoch`, int64 [steps, accum,
        micro], on the device where the data is (on the host for the DataLoader): what
        micro_batches gathers (and a captured step, by `gather`: graphed.py)."""
        order = epoch_order(self.seed, epoch, len(self.train))
        order = order[:self.steps_per_epoch * self.batch_size]  # whole steps, as for 1 process
        order = order[self.rank::self.world]  # this rank's share (a no-op view for one process)
        order = order[start_step * self.micro * self.accum:].reshape(-1, self.accum, self.micro)
        return order.to(self.device) if self.on_device else order

    def gather(self, idx: torch.Tensor) -> Batch:
        """The training micro-batch of samples `idx` (on the data's device), prepared as
        micro_batches prepares it but without --augment: device work only, so it can be
        captured in a CUDA graph (graphed.py)."""
        return self._prepare(*self.train[idx])

    def micro_batches(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        order = self.step_indices(epoch, start_step).reshape(-1, self.micro)
        first = start_step * self.accum  # index of the first micro-batch in the epoch
        if self.on_device:
            for i, idx in enumerate(order, first):  # a device-side gather: no host work, no copy
                yield self._prepare(*self.train[idx], (epoch, i))
            return
        # Host path: workers gather whole micro-batches (one indexing op each, not one Python
        # call per sample) into pinned memory, overlapping with the device's work.
        loader = DataLoader(self.train, batch_size=None, sampler=list(order),
                            num_workers=self.workers, pin_memory=self.pin,
                            persistent_workers=False)
        for i, (x, y) in enumerate(loader, first):
            yield self._prepare(x, y, (epoch, i))

    def close(self) -> None:
        """Nothing outlives an epoch here: each epoch's DataLoader ends with it."""

    def has_split(self, split: str) -> bool:
        samples = getattr(self, split)
        return samples is not None and len(samples) > 0

    def state(self, step_in_epoch: int) -> dict:
        """Checkpoint key "data": the position is (epoch, step_in_epoch) alone."""
        return {"path": self.path, "resume": "sampler", "micro_batches": step_in_epoch * self.accum}

    def eval_batches(self, batch_size: int, split: str = "test") -> Iterator[Batch]:
        """The whole split ("test" or "val") in order, in batches of `batch_size` (the last one
        smaller)."""
        samples = getattr(self, split)
        for start in range(0, len(samples), batch_size):
            idx = torch.arange(start, min(start + batch_size, len(samples)))
            yield self._prepare(*samples[idx])

    def eval_shard(self, batch_size: int, split: str = "test") -> Iterator[Batch]:
        """This rank's share of a split: samples r, r + world, ... in the SAME number of
        batches on every rank (FSDP's forward is a collective), none larger than `batch_size`
        and none empty (shares differ by at most one sample; batch_size ≥ 2)."""
        if self.world == 1:
            yield from self.eval_batches(batch_size, split)
            return
        samples = getattr(self, split)
        n = len(samples)
        count = math.ceil(math.ceil(n / self.world) / batch_size)  # the largest share's batches
        for idx in torch.arange(self.rank, n, self.world).tensor_split(count):
            yield self._prepare(*samples[idx])
