"""The batch size that trains fastest in the memory there is: each try builds a Run, measures its
step (`fasttrain.lab.memory`) and times a few real steps; the search doubles, then bisects, on
samples/s among the batches that fit. `fasttrain memory --find-batch-size` prints it.

On CUDA a batch fits when the allocator's measured peak stays under the usable memory; on the CPU,
whose allocator keeps no statistics, when the predicted peak does.

Every try must give back all it allocated, or the tries after it run in less memory than there is
and fail where they would fit. So each try runs in a frame of its own, an out-of-memory error's
frames are cleared (a traceback pins every tensor its frames reference: the Run, the half-built
graph), compiled code and cycles are collected, and on CUDA what is still allocated afterwards
beyond what was before the try is recorded with it (`held_after`, bytes): 0 unless something
outside the search keeps a reference.
"""

from __future__ import annotations

import dataclasses
import statistics
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fasttrain.engine.loop import endless_batches, endless_steps, warm_up
from fasttrain.lab.memory import free_memory, measure, users_code

if TYPE_CHECKING:
    from fasttrain.engine.config import TrainConfig

_MIN_GAIN = 0.02  # throughput must beat the best by 2% to count as better: timing noise


@dataclass
class Try:
    """One batch size tried: did it fit, how fast was it, and the peak it was judged on."""

    batch: int
    fits: bool
    samples_per_s: float | None = None
    peak: int | None = None  # CUDA: measured; CPU: predicted (what "fits" was judged on)
    predicted: int | None = None
    reason: str | None = None  # why it does not fit
    held_after: int | None = None  # CUDA: bytes still allocated after the try's cleanup


def try_batch(cfg: TrainConfig, task, batch: int, usable: int, steps: int) -> Try:
    """Build a run at `batch`, measure it and time `steps` real steps after the warm-up.
    Out of memory — anywhere, construction included — is "does not fit", never a crash."""
    from fasttrain.env import resolve_device

    before = _allocated() if resolve_device(cfg.device) == "cuda" else None
    try:
        result = _try(cfg, task, batch, usable, steps)
    except torch.OutOfMemoryError as e:
        # Whatever still holds the error (or its traceback) must not hold the try's tensors.
        traceback.clear_frames(e.__traceback__)
        result = Try(batch, False, reason="out of memory")
    # After the except block: the error, its traceback and the frames holding tensors are gone.
    free_memory()
    if before is not None:
        result.held_after = max(0, _allocated() - before)
    return result


def _allocated() -> int:
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def _try(cfg: TrainConfig, task, batch: int, usable: int, steps: int) -> Try:
    from fasttrain.engine.run import build

    run = build(dataclasses.replace(cfg, batch_size=batch), data=task, verbose=False)
    with users_code(run):
        return _time(run, batch, usable, steps)


def _time(run, batch: int, usable: int, steps: int) -> Try:
    """The try on its built Run: measured, then timed where it fits."""
    from fasttrain.timing import synchronizer, time_call

    dev = run.device
    cuda = dev.type == "cuda"
    batches = endless_batches(run)
    b = measure(run, batches)
    if not cuda and b.predicted_peak > usable:
        return Try(batch, False, peak=b.predicted_peak, predicted=b.predicted_peak,
                   reason="predicted peak over the limit")
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    sync = synchronizer(dev.type)
    inputs = endless_steps(run)  # what run.train_step takes: the whole-step graph's, if any
    warm_up(run, inputs, 0)
    ms = [time_call(lambda: run.train_step(run, next(inputs)), sync)[1] for _ in range(steps)]
    peak = max(b.measured_peak, torch.cuda.max_memory_allocated(dev)) if cuda else b.predicted_peak
    sps = batch / (statistics.median(ms) / 1e3)
    if peak > usable:
        return Try(batch, False, sps, peak, b.predicted_peak, "peak over the safety margin")
    return Try(batch, True, sps, peak, b.predicted_peak)


def search(try_fn: Callable[[int], Try], floor: int, unit: int, cap: int,
           min_gain: float = _MIN_GAIN) -> tuple[Try | None, list[Try]]:
    """The batch with the highest samples/s that fits — not merely the largest.

    Doubles from `floor` while the batch fits and throughput improves by more than `min_gain`,
    then bisects (in multiples of `unit`) between the best batch and the first one that failed or
    was slower. `cap` (the training set) bounds every try. Returns (best or None, every try)."""
    tries: list[Try] = []

    def attempt(b: int) -> Try:
        t = try_fn(b)
        tries.append(t)
        return t

    def better(t: Try, best: Try | None) -> bool:
        return t.fits and (best is None or t.samples_per_s > best.samples_per_s * (1 + min_gain))

    best, b = None, floor
    while b <= cap:
        t = attempt(b)
        if not better(t, best):
            break
        best, b = t, 2 * b
    if best is None:
        return None, tries
    lo, hi = best.batch, min(b, cap + unit)  # hi: failed, slower, or past the training set
    while hi - lo > unit:
        mid = lo + max(unit, (hi - lo) // 2 // unit * unit)
        if mid > cap:  # the engine cannot build a batch larger than the training set
            hi = mid
            continue
        t = attempt(mid)
        if better(t, best):
            best, lo = t, mid
        else:
            hi = mid
    return best, tries


def refuse_fixed_batch(task, flag: str) -> None:
    """A user's DataLoader batches as it was built: a command that varies the batch (a search,
    a sweep) cannot, and would stop at its second try telling the user to change --batch-size."""
    splits = getattr(task, "splits", None)  # streamed data (engine/streamdata.py StreamData)
    train = splits["train"] if splits is not None else None
    if train is not None and (train.batch_size is not None or train.batched):
        from fasttrain.errors import UserError

        size = f"batch_size={train.batch_size}" if train.batch_size else "its own batches"
        raise UserError(f"{flag} varies the batch size, but the training data is a DataLoader "
                        f"with {size}, which it cannot change: return the DataLoader's dataset "
                        f"instead (fasttrain batches it with --workers, --pin-memory)")


def rebatchable(task, micro: int):
    """`task` with a user's DataLoader's batch size lifted from its training split, for a
    command that predicts the step at other batch sizes (plan: the largest batch, accumulation);
    the loader's other settings (collate_fn, workers) stay. The configuration as given must
    still match the loader, as train checks."""
    import dataclasses

    from fasttrain.errors import UserError

    splits = getattr(task, "splits", None)  # streamed data (engine/streamdata.py StreamData)
    train = splits["train"] if splits is not None else None
    if train is None or (train.batch_size is None and train.as_built is None):
        return task
    if train.batched:
        raise UserError("the training data is a DataLoader with batch_size=None (its items are "
                        "whole batches): the batch cannot be varied; return its dataset instead")
    if train.batch_size is not None and train.batch_size != micro:
        raise UserError(f"the train DataLoader's batch_size is {train.batch_size}, but one GPU's "
                        f"micro-batch is {micro}: build it with batch_size={micro} or change "
                        f"--batch-size")
    lifted = dataclasses.replace(train, batch_size=None, as_built=None)
    return dataclasses.replace(task, splits={**splits, "train": lifted})


def train_samples(task, block_size: int, what: str = "the batch-size search") -> int:
    """How many samples one epoch has: the largest batch the engine can build. `what`: what
    needs it, for the message a stream without length gets."""
    splits = getattr(task, "splits", None)  # streamed data (engine/streamdata.py StreamData)
    if splits is not None:
        try:
            return len(splits["train"])
        except TypeError:
            from fasttrain.errors import UserError

            raise UserError(f"the training data is a stream without length: {what} needs "
                            f"its size; give a map-style Dataset (with __len__)") from None
    if task.kind == "language":
        return (len(task.train_x) - 1) // block_size
    return len(task.train_y)
