"""THE timing method: every time fasttrain reports comes from here.

- Setup (allocation, transfers, compilation, graph capture) is timed apart and never mixed in.
- The device is synchronized before every clock read, so a clock never stops while queued GPU work
  is still running (CUDA is asynchronous: without the sync we would time kernel launches).
- Epoch time is the mean over the latter half of the epochs (the report's method: the first half
  absorbs warm-up), reported with min / median / max; total is the wall time of all epochs.
- Evaluation happens outside the clock.
- A row is run several times (repeats, interleaved with the other rows by the bench): its figure
  is the median over repeats of each repeat's epoch time, its spread the min–max over repeats.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


def synchronizer(device: str) -> Callable[[], None]:
    """A function that waits until all queued work on `device` has finished."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None  # CPU work is synchronous by the time Python gets control back


@dataclass(frozen=True)
class EpochTimes:
    """Wall times of consecutive epochs, in milliseconds."""

    ms: tuple[float, ...]

    @property
    def steady(self) -> tuple[float, ...]:
        """The latter half of the epochs (all of them when there is only one)."""
        return self.ms[len(self.ms) // 2 :]

    @property
    def epoch_ms(self) -> float:
        return statistics.fmean(self.steady)

    @property
    def total_ms(self) -> float:
        return sum(self.ms)

    def summary(self) -> dict[str, float]:
        return {
            "epoch_ms": self.epoch_ms,
            "epoch_ms_min": min(self.ms),
            "epoch_ms_median": statistics.median(self.ms),
            "epoch_ms_max": max(self.ms),
            "total_ms": self.total_ms,
        }


def time_call(fn: Callable[[], object], sync: Callable[[], None]) -> tuple[object, float]:
    """Run `fn` once between two synchronized clock reads; returns (its result, milliseconds)."""
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, (time.perf_counter() - t0) * 1e3


def time_epochs(
    train_epoch: Callable[[int], object],
    epochs: int,
    sync: Callable[[], None],
    on_epoch: Callable[[int, float, object], None] | None = None,
) -> tuple[EpochTimes, list[object]]:
    """Time `train_epoch(e)` for e in 0..epochs-1; returns the times and what each epoch returned.

    `on_epoch(epoch, ms, result)` runs after the clock has stopped (progress display): it adds no
    synchronization beyond the one every clock read already needs.
    """
    times, results = [], []
    for epoch in range(epochs):
        result, ms = time_call(lambda e=epoch: train_epoch(e), sync)
        times.append(ms)
        results.append(result)
        if on_epoch is not None:
            on_epoch(epoch, ms, result)
    return EpochTimes(tuple(times)), results


def repeat_summary(epoch_ms: list[float]) -> dict[str, float]:
    """Median and spread of a row's per-repeat epoch times (each a latter-half mean). The median
    is robust to one disturbed repeat; `spread` is (max − min) / median."""
    if not epoch_ms:
        raise ValueError("no repeats to summarize")
    med = statistics.median(epoch_ms)
    return {
        "epoch_ms": med,
        "epoch_ms_repeat_min": min(epoch_ms),
        "epoch_ms_repeat_max": max(epoch_ms),
        "spread": (max(epoch_ms) - min(epoch_ms)) / med,
    }
