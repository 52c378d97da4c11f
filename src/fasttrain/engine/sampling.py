"""The pieces of the streamed path (stream.py): splits, samplers, seeding, batch checks.

See stream.py's docstring for the order and randomness guarantees these implement.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    default_collate,
    default_convert,
    get_worker_info,
)

from fasttrain.engine import tree
from fasttrain.engine.batches import epoch_order
from fasttrain.errors import UserError

_LOADER_KEEPS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn",
                 "multiprocessing_context", "prefetch_factor", "persistent_workers")


def mix(*parts: int) -> int:
    """One 63-bit seed from several integers (seed, epoch, index, ...), well spread."""
    h = 0x9E3779B97F4A7C15
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        h ^= h >> 31
    return h >> 1


def _seed_all(seed: int) -> None:
    """Seed the three streams a transform may draw from, for one batch: about 10 µs, where
    torch.manual_seed would take 100+ (it also queues the seeding of every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch.default_generator.manual_seed(seed)


def _rng_state():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _set_rng_state(state) -> None:
    torch.set_rng_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])


# -- a split and how it is read ------------------------------------------------------------------


@dataclass
class Split:
    """One split: the dataset, the DataLoader settings kept from the user, and the user's
    loader itself where it must be used exactly as built (a custom sampler, one process)."""

    dataset: Any
    iterable: bool
    loader_kw: dict
    batch_size: int | None = None  # the user's DataLoader's, checked against the micro-batch
    as_built: DataLoader | None = None
    shuffle: bool = True
    batched: bool = False  # a stream whose items are whole batches (DataLoader batch_size=None)

    def __len__(self) -> int:
        return len(self.dataset)


def make_split(obj, name: str, world: int) -> Split:
    if isinstance(obj, tuple | list) and len(obj) == 2 and all(map(torch.is_tensor, obj)):
        obj = torch.utils.data.TensorDataset(*obj)
    if isinstance(obj, DataLoader):
        kw = {k: getattr(obj, k) for k in _LOADER_KEEPS}
        if not kw["num_workers"]:
            kw["prefetch_factor"], kw["persistent_workers"] = None, False
        if isinstance(obj.dataset, IterableDataset):
            return Split(obj.dataset, True, kw, obj.batch_size, batched=obj.batch_size is None)
        sampler = obj.sampler if obj.batch_size is not None else obj.batch_sampler
        if isinstance(sampler, RandomSampler | SequentialSampler):
            return Split(obj.dataset, False, kw, obj.batch_size,
                         shuffle=isinstance(sampler, RandomSampler))
        if world > 1:
            raise UserError(f"{name} data: a DataLoader with a {type(sampler).__name__} cannot be "
                            f"split over {world} processes; build it with batch_size and "
                            f"shuffle=True/False (the engine deals the samples out) or give the "
                            f"Dataset itself")
        return Split(obj.dataset, False, kw, obj.batch_size, as_built=obj)
    if isinstance(obj, IterableDataset):
        return Split(obj, True, {})
    if isinstance(obj, Dataset):
        try:
            len(obj)
        except TypeError:
            raise UserError(f"{name} data: a map-style Dataset needs __len__; give it one, or "
                            f"make it an IterableDataset") from None
        return Split(obj, False, {})
    raise UserError(f"{name} data: give (x, y) tensors, a Dataset, an IterableDataset or a "
                    f"DataLoader, not {type(obj).__name__}")


class Keys(list):
    """One batch's sample indices, and the seed its reading draws from: (seed, epoch, rank,
    position of the batch in the rank's epoch). Travels to the worker with the indices."""

    def __init__(self, indices: list[int], seed: int):
        super().__init__(indices)
        self.seed = seed


class StepSampler(Sampler):
    """This rank's batches of indices: the epoch's order cut to whole steps of the global
    batch, dealt over ranks like DistributedSampler, from a start step. Mutable (`set_epoch`)
    because a DataLoader's sampler cannot be replaced once it is built."""

    def __init__(self, n: int, micro: int, accum: int, world: int, rank: int, seed: int,
                 shuffle: bool):
        self.n, self.micro, self.accum, self.world, self.rank = n, micro, accum, world, rank
        self.seed, self.shuffle = seed, shuffle
        self.steps = n // (micro * accum * world)
        self.epoch = self.start = 0

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epoch, self.start = epoch, start_step

    def __iter__(self) -> Iterator[Keys]:
        order = (epoch_order(self.seed, self.epoch, self.n) if self.shuffle
                 else torch.arange(self.n))
        order = order[:self.steps * self.micro * self.accum * self.world][self.rank::self.world]
        order = order[self.start * self.micro * self.accum:].reshape(-1, self.micro)
        for b, row in enumerate(order.tolist(), self.start * self.accum):
            yield Keys(row, mix(self.seed, self.epoch, self.rank, b))

    def __len__(self) -> int:
        return (self.steps - self.start) * self.accum


class EvalSampler(Sampler):
    """This rank's share of a split in order (samples r, r + world, ...) in the same number of
    batches on every rank (FSDP's forward is a collective), none empty."""

    def __init__(self, n: int, batch_size: int, world: int, rank: int, seed: int):
        count = max(1, math.ceil(math.ceil(n / world) / batch_size))
        self.rows = [Keys(idx.tolist(), mix(seed, -1, rank, b))
                     for b, idx in enumerate(torch.arange(rank, n, world).tensor_split(count))]

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


class Seeded(Dataset):
    """Reads a batch of `dataset` (the DataLoader hands `__getitems__` the sampler's Keys) with
    torch's, NumPy's and Python's random streams seeded from the batch's key first: its random
    transforms are a function of (seed, epoch, rank, batch) alone, whichever worker reads it.
    Seeded per batch, not per sample: seeding costs ~8 µs, as much as reading a small sample."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.batched = getattr(dataset, "__getitems__", None)  # e.g. Hugging Face datasets

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        return self.dataset[i]

    def __getitems__(self, keys: Keys) -> list:
        _seed_all(keys.seed)
        if self.batched:
            return self.batched(list(keys))
        return [self.dataset[i] for i in keys]


class ShareByName:
    """The worker_init_fn of the engine's DataLoaders: the worker hands its batches to the main
    process as shared memory named in the message (torch's "file_system" sharing strategy),
    then the user's worker_init_fn runs, if there is one.

    Why: under Linux's default ("file_descriptor") the main process receives each tensor of a
    batch over a new socket to the worker, with an HMAC challenge both ways: 527 Python calls per
    (input, target) batch on the thread that runs the step, against 171 by name (torch 2.13;
    ~1.1 against ~0.8 ms of that thread's CPU per batch on a 2-core EPYC), and the worker serves
    no socket (~350 calls fewer per batch). While the data is the bottleneck, all of it is taken
    from the workers' cores. Only the workers' strategy changes (the main process unpickles
    either kind). Segments of a crashed run are freed by torch's torch_shm_manager daemons
    (torch.multiprocessing's docs): the first workers start one each, and restarted loaders
    (each evaluation, each pass of a stream) start no more."""

    def __init__(self, then=None):
        self.then = then  # the user's worker_init_fn (picklable if theirs is: spawn contexts)

    def __call__(self, worker_id: int) -> None:
        torch.multiprocessing.set_sharing_strategy("file_system")
        if self.then is not None:
            self.then(worker_id)


_SHARE = (0, 1)  # (index, count) of the reader running in this process: see shard()


def shard() -> tuple[int, int]:
    """(k, n) for an IterableDataset with `splits_itself = True`, called in its __iter__: this
    reader is k of n (ranks × DataLoader workers); yield only your share (e.g. files k::n)."""
    return _SHARE


def alone() -> None:
    """This process the only reader (shard() → (0, 1)), for a read outside Sharded (the build's
    probe of the first sample): not the share the last loader read in this process left."""
    global _SHARE
    _SHARE = (0, 1)


class Sharded(IterableDataset):
    """One pass of an IterableDataset, dealt over ranks × workers (see the module docstring)."""

    def __init__(self, dataset, rank: int, world: int, epoch: int = 0):
        self.dataset, self.rank, self.world, self.epoch = dataset, rank, world, epoch

    def __iter__(self):
        global _SHARE
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        k, n = self.rank * workers + worker, self.world * workers
        _SHARE = (k, n)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.epoch)
        items = iter(self.dataset)
        if getattr(self.dataset, "splits_itself", False) or n == 1:
            return items
        return itertools.islice(items, k, None, n)


class Untouched:
    """Around a batch read in the main process that seeds the streams itself (Seeded): the
    model's random streams are put back after it (~25 µs a batch)."""

    def __init__(self):
        self.saved = None

    def reset(self, *parts: int) -> None:
        pass

    def __enter__(self):
        self.saved = _rng_state()

    def __exit__(self, *exc):
        _set_rng_state(self.saved)


class OwnRandom(Untouched):
    """The data's random streams in the main process (no workers), kept apart from the
    model's: entered around each batch read, they swap states, not seeds (a stream's items
    are not seeded one by one)."""

    def __init__(self, seed: int):
        super().__init__()
        self.seed, self.state = seed, None

    def reset(self, *parts: int) -> None:
        outer = _rng_state()
        _seed_all(mix(self.seed, *parts))
        self.state = _rng_state()
        _set_rng_state(outer)

    def __enter__(self):
        self.saved = _rng_state()
        _set_rng_state(self.state)

    def __exit__(self, *exc):
        self.state = _rng_state()
        _set_rng_state(self.saved)


# -- batching ------------------------------------------------------------------------------------


def collate_of(split: Split, where: str):
    """The collate_fn of the engine's DataLoaders of `split`: the user's DataLoader's as it is,
    else torch's default (a stream of whole batches: default_convert) wrapped in Collate."""
    fn = split.loader_kw.get("collate_fn") or (default_convert if split.batched
                                                else default_collate)
    return Collate(where, fn) if fn in (default_collate, default_convert) else fn


def as_batch(split: Split, samples: list, where: str) -> Any:
    """The first `samples` as the split's collate_fn batches them (a whole batch of a batched
    stream: its first item): what the step will see, so the engine reads the input's dtype and
    shape after the user's collate_fn has converted or normalized it, not before."""
    collate = collate_of(split, where)
    items = samples[0] if split.batched else samples
    if isinstance(collate, Collate):
        return collate(items)
    from fasttrain.engine import usercode

    return usercode.call(collate, f"your collate_fn ({usercode.name_of(collate)})", items)


class Collate:
    """torch's default collate_fn, with a batch it cannot make (samples of different shapes, a
    PIL image, ...) one line naming the fix instead of torch's traceback from inside it: raised
    where it happens, in a DataLoader worker too (usercode.pulled unwraps it there)."""

    def __init__(self, where: str, fn=default_collate):
        self.where, self.fn = where, fn

    def __call__(self, samples):
        try:
            return self.fn(samples)
        except (TypeError, RuntimeError) as e:
            line = unbatchable(samples, self.where, e)
            if line is None:
                raise
            raise UserError(line) from None


def unbatchable(samples: Any, where: str, error: Exception) -> str | None:
    """One line: which samples torch's default collate_fn could not batch, and the fixes; None
    for a RuntimeError among samples of one shape (not theirs: e.g. out of shared memory)."""
    what = (str(error).strip().splitlines() or [type(error).__name__])[-1]
    shown = [tree.shapes(s) for s in samples] if isinstance(samples, list) else [
        tree.shapes(samples)]
    differ = next((i for i, s in enumerate(shown) if s != shown[0]), None)
    if differ:
        return (f"{where}: samples of different shapes cannot be stacked into a batch (sample 0 "
                f"is {shown[0]}, sample {differ} {shown[differ]}); resize or crop them to one "
                f"size in the Dataset's transform, or give a DataLoader with a collate_fn that "
                f"pads them")
    if isinstance(error, RuntimeError):
        return None
    return (f"{where}: torch's default collate_fn cannot batch a sample {shown[0]} ({what}); "
            f"return tensors, NumPy arrays or numbers from the Dataset (e.g. a ToTensor() "
            f"transform for PIL images), or give a DataLoader with a collate_fn of your own")


# -- checking a batch ----------------------------------------------------------------------------


def check_sample(sample: Any, where: str, what: str = "sample") -> None:
    """One line naming the fix for a sample or batch holding what cannot be batched or moved."""
    bad = _collect(sample, [])
    if bad is not None:
        raise UserError(f"{where}: a {what} holds a {bad} ({tree.shapes(sample)}); return "
                        f"tensors in tuples, lists, dicts, namedtuples or dataclasses from the "
                        f"Dataset or collate_fn")


def check_batch(batch: Any, where: str) -> list[torch.Tensor]:
    """The batch's tensors; one line naming the fix for a batch the engine cannot move or
    split. Runs for every batch on the step's thread: one walk of the tree does it all."""
    tensors: list[torch.Tensor] = []
    if _collect(batch, tensors) is not None:
        check_sample(batch, where, "batch")  # raises, with the message
    if not tensors:
        raise UserError(f"{where}: a batch holds no tensor ({tree.shapes(batch)}); return "
                        f"tensors (or numbers and arrays the default collate_fn makes tensors)")
    if len({t.shape[0] for t in tensors if t.dim()}) > 1:
        raise UserError(f"{where}: a batch's tensors have different leading sizes "
                        f"({tree.shapes(batch)}); every tensor's dim 0 must be the batch's "
                        f"samples: fix the Dataset's samples or the collate_fn")
    return tensors


def _collect(obj: Any, tensors: list) -> str | None:
    """Append `obj`'s tensor leaves to `tensors`; what it holds that cannot be batched, or None.
    Tensors are tested first: they are most of what a batch holds."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return None
    if isinstance(obj, dict):
        children: Iterable = obj.values()
    elif isinstance(obj, tuple | list):
        children = obj
    elif isinstance(obj, set | frozenset):
        return "set (no order to keep)"
    elif isinstance(obj, Iterator):
        return f"{type(obj).__name__} (read once, not a container)"
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    else:
        return None  # strings, numbers, None: passed through untouched
    for child in children:
        bad = _collect(child, tensors)
        if bad is not None:
            return bad
    return None
