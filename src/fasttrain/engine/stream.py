"""The streamed data path: any Dataset, IterableDataset or DataLoader, read afresh every epoch.

    build(cfg, model=net, data=ImageFolder("photos/", transform=RandomCrop(32, 4)))
    build(cfg, model=net, data={"train": loader, "val": ds, "test": (x, y)})

A map-style Dataset is batched by a DataLoader built from --workers, --pin-memory and
--prefetch-factor, one micro-batch of this rank per batch. A user's DataLoader keeps its workers,
collate_fn, pin_memory, persistent_workers, prefetch_factor and worker_init_fn; its batch_size
must be this rank's micro-batch. Its sampler is replaced only when it is the RandomSampler /
SequentialSampler that `shuffle=True/False` makes, by the engine's seeded one (dealt over ranks
like DistributedSampler, with a start offset); another sampler is kept as built for one process
and refused for several (the engine cannot split it).

Order and randomness (what makes resume exact and N processes equal one):
- map-style: the epoch's order is `epoch_order(seed, epoch)` (the in-memory path's), cut to whole
  steps, rank r taking positions r, r + world, ...; a resumed epoch starts the sampler at its
  step, reading nothing twice. Before each batch is read, torch's, NumPy's and Python's random
  streams are seeded from (seed, epoch, rank, batch), so its random transforms depend on nothing
  else: not on the worker that reads it, the prefetching or a resume. (Per batch, not per
  sample: seeding costs as much as reading a small sample. So N processes equal one process
  sample for sample where the data has no random transform, and in distribution where it has.)
- IterableDataset: each pass is one `iter()` of it (its `set_epoch(epoch)` called first, if it has
  one). The stream is dealt over ranks × workers by skipping: reader k of n keeps items k, k + n,
  ... (each reader reads the whole stream, so any iterable splits correctly, at n× the reading).
  A dataset that splits itself cheaply (by file, by shard) sets `splits_itself = True` and yields
  only its share, `fasttrain.engine.sampling.shard()` → (k, n). Workers are seeded from (seed,
  epoch, rank) + worker and restarted each pass (persistent_workers is off for a stream: a worker
  must learn the epoch). A resumed pass skips the micro-batches already trained on by reading
  them: the same batches come back if the stream yields the same items for the same epoch.
  Ranks must step together, and the shares of a stream may differ: under torchrun a stream
  with length restarts each rank's share where it ends (Stream.endless), so every rank's pass
  is the same steps; a stream without length ends each pass on every rank at the first step
  some rank cannot fill (agree.steps_together: the ranks' counts gathered once per step, on
  the host).
- A stream without length is --max-steps long, in one process as under torchrun: fit starts
  pass after pass, each a new epoch (set_epoch, the seeds, the epoch of the logs and
  checkpoints), and a resumed pass skips only its own steps; --epochs, given, ends the run
  sooner (whichever first, as Lightning's max_epochs and max_steps). A pass read from its start
  that holds no whole step (on any rank) is one line (a stream read once: fit would start empty
  passes without end).
- With no workers the data's random draws run on their own saved streams, apart from the model's
  dropout stream: neither moves the other.

Batches are trees (tree.py). On CUDA the next batch's host→device copy is issued on a side stream
before the current batch is handed out, so it overlaps the step; the step's stream waits for it
with an event (no host sync). In an (input, target) pair a uint8 input is scaled to [0, 1] floats
on the device, as on the in-memory path (the same Dataset trains the same either way); nothing
else is rescaled.

The main process's work per batch is kept small: while the data is the bottleneck, whatever the
step's thread does is taken from the workers' cores. Workers hand batches over by name
(sampling.ShareByName: a third of the Python calls of receiving over file descriptors); the
sampler hands out a step's indices as one list (no Python call per sample, as a RandomSampler
under a BatchSampler makes); a batch is checked and its tensors found in one walk, and on a CPU
run it is not rebuilt. tests/engine/test_stream_overhead.py counts these calls.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from fasttrain.engine import tree
from fasttrain.engine.agree import steps_together
from fasttrain.engine.inputs import tokens_in
from fasttrain.engine.sampling import (
    EvalSampler,
    OwnRandom,
    Seeded,
    Sharded,
    ShareByName,
    Split,
    StepSampler,
    Untouched,
    check_batch,
    collate_of,
    mix,
)
from fasttrain.engine.sidestream import SideStreamCopies
from fasttrain.engine.streamdata import StreamData
from fasttrain.errors import UserError

_END = object()


class Stream:
    """This rank's micro-batches of a streamed training set, and its evaluation batches: the
    same interface as batches.Batches (contracts: run.batches)."""

    path = "streamed"
    on_device = False
    language = False  # the bundled token stream only (perplexity)

    def __init__(self, data: StreamData, cfg, device: torch.device, rank: int = 0,
                 world: int = 1, int_gather: Callable[[], Callable] | None = None):
        self.device, self.rank, self.world, self.seed = device, rank, world, cfg.seed
        self.batch_size, self.accum = cfg.batch_size, cfg.accum_steps
        self.micro = cfg.batch_size // cfg.accum_steps // world
        self.splits, self.why = data.splits, data.why
        self.tokens_per_sample = data.tokens  # tokens/s in the log where samples are tokens
        self.sequences = data.sequences  # token sequences: perplexity (run.py)
        # Batches padded by a collate_fn of the user's differ in length: their tokens are
        # counted as the loop takes them (take_tokens), for tokens/s.
        self.counting = data.sequences and not data.tokens
        self.tokens_taken = 0
        self.workers, self.pin, self.prefetch = cfg.workers, cfg.pin_memory, cfg.prefetch_factor
        self.generator = torch.Generator()  # worker seeds; never the global stream
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.finish = _finisher(data, cfg.channels_last)
        train = self.splits["train"]
        if cfg.data_on_device == "on":
            raise UserError("--data-on-device on keeps in-memory data on the device; this data "
                            "is streamed: add --data-in-memory, or drop --data-on-device")
        if train.batch_size is not None and train.batch_size != self.micro:
            raise UserError(f"the train DataLoader's batch_size is {train.batch_size}, but this "
                            f"process's micro-batch is {self.micro} (--batch-size "
                            f"{cfg.batch_size} / {cfg.accum_steps} accumulation / {world} "
                            f"process(es)); build it with batch_size={self.micro} or change "
                            f"--batch-size")
        own = train.loader_kw.get("num_workers")
        if own is not None and cfg.workers and cfg.workers != own and rank == 0:
            print(f"warning: --workers {cfg.workers} does not apply to the train DataLoader, "
                  f"which keeps its own num_workers={own} (only Datasets given as such take "
                  f"--workers); build it with num_workers={cfg.workers}, or give the Dataset "
                  f"itself", file=sys.stderr)
        self.sampler: StepSampler | None = None
        self.loader = self._train_loader(train)
        self.steps_per_epoch = self._steps(train)
        # Ranks must stop a pass at the same step (each step is a collective); a stream's shares
        # may end at different steps. With length (or split by itself into shares of its own
        # sizes over workers), each rank's stream restarts where it ends and a pass is still
        # steps_per_epoch steps (a short share topped up from its next pass, with a warning).
        # Without length, the ranks agree at every step whether all still have one, and end the
        # pass together (agree.steps_together): each pass an epoch, as in one process.
        uneven = (getattr(train.dataset, "splits_itself", False) and self.loader.num_workers > 1
                  and self.steps_per_epoch is not None)
        self.endless = train.iterable and ((world > 1 and self.steps_per_epoch is not None)
                                           or uneven)
        self._short_warned = False
        if self.steps_per_epoch is None and not cfg.max_steps:
            raise UserError("the training data is a stream without length: give --max-steps N, "
                            "the run's length in optimizer steps (the stream restarts as often "
                            "as it takes, each pass an epoch)")
        self.counts = None  # every rank's micro-batches for the next step (agree.int_gather)
        if self.steps_per_epoch is None and world > 1:  # made here: a collective at build
            self.counts = int_gather() if int_gather is not None else lambda n: [n]
        if self.steps_per_epoch == 0:
            raise UserError(f"--batch-size {cfg.batch_size} is larger than the {len(train)} "
                            f"training samples; use a smaller batch")
        self._warn_dropped(train)
        if world > 1 and cfg.parallel == "fsdp" and any(
                s.iterable for k, s in self.splits.items() if k != "train"):
            raise UserError("--parallel fsdp evaluates in lock-step and a stream's shares may "
                            "differ in length: give val/test as map-style Datasets or tensors")

    # -- building loaders ------------------------------------------------------------------------

    def _kw(self, split: Split, where: str, persistent: bool = True) -> dict:
        if split.loader_kw:
            kw = dict(split.loader_kw)
        else:
            kw = {"num_workers": self.workers, "pin_memory": self.pin,
                  "prefetch_factor": self.prefetch if self.workers else None,
                  "persistent_workers": self.workers > 0}
        # A stream's workers must be restarted to learn the epoch; evaluation loaders live for
        # one evaluation.
        kw["persistent_workers"] = kw["persistent_workers"] and persistent and not split.iterable
        if kw["num_workers"]:  # batches handed over by name: see ShareByName
            kw["worker_init_fn"] = ShareByName(kw.get("worker_init_fn"))
        kw["collate_fn"] = collate_of(split, where)  # torch's: its failure made one line
        return kw

    def _train_loader(self, split: Split) -> DataLoader:
        if split.as_built is not None:
            return split.as_built
        if split.iterable:  # the last partial batch of a pass is dropped, as for map-style data
            batching = ({"batch_size": None} if split.batched
                        else {"batch_size": self.micro, "drop_last": True})
            return DataLoader(Sharded(split.dataset, self.rank, self.world),
                              generator=self.generator, **batching, **self._kw(split, "train data"))
        self.sampler = StepSampler(len(split), self.micro, self.accum, self.world, self.rank,
                                   self.seed, split.shuffle)
        return DataLoader(Seeded(split.dataset), batch_sampler=self.sampler,
                          generator=self.generator, **self._kw(split, "train data"))

    def _warn_dropped(self, split: Split) -> None:
        """A stream is batched by each of its readers (ranks × workers), and each drops its
        last partial batch: with several readers, say so where that leaves more than 5% of a
        pass untrained (it also makes the steps of a pass depend on --workers; one reader drops
        one partial batch, as map-style data does)."""
        if (not split.iterable or split.batched or split.as_built is not None
                or self.steps_per_epoch is None):
            return
        n = len(split.dataset)
        unused = n - self.steps_per_epoch * self.accum * self.micro * self.world
        readers = self.world * max(1, self.loader.num_workers)
        if self.rank == 0 and readers > 1 and n and unused / n > 0.05:
            print(f"warning: this stream is batched by each of its {readers} readers (processes "
                  f"× workers), and each drops its last partial batch: {unused:,} of its "
                  f"{n:,} items a pass ({unused / n:.0%}) are not trained on; fewer --workers "
                  f"or a batch that divides each reader's share trains on more", file=sys.stderr)

    def _steps(self, split: Split) -> int | None:
        """Optimizer steps per pass that every rank is sure to have (None: unknown)."""
        if self.sampler is not None:
            return self.sampler.steps
        try:
            n = len(split.dataset)  # a stream's __len__ is its own promise
        except TypeError:
            return None
        if split.as_built is not None:
            return len(split.as_built) // self.accum
        # Reader k of `readers` gets at least n // readers items, and drops its partial batch.
        workers = max(1, self.loader.num_workers)
        per_worker = n // (self.world * workers) // (1 if split.batched else self.micro)
        return per_worker * workers // self.accum

    # -- the batches -----------------------------------------------------------------------------

    def micro_batches(self, epoch: int, start_step: int = 0) -> Iterator[Any]:
        """This rank's micro-batches from optimizer step `start_step` of `epoch`, on the
        device."""
        skip = start_step * self.accum
        if self.sampler is not None:
            self.sampler.set_epoch(epoch, start_step)
            skip = 0  # the sampler starts there: nothing is read twice
        elif isinstance(self.loader.dataset, Sharded):
            self.loader.dataset.epoch = epoch
        elif hasattr(self.loader.sampler, "set_epoch"):
            self.loader.sampler.set_epoch(epoch)
        host = self._endless(epoch) if self.endless else self._read(self.loader, epoch)
        # A stream with length stops at the steps every rank is sure to have (a pass).
        end = self.steps_per_epoch * self.accum if self.steps_per_epoch is not None else None
        host = itertools.islice(host, skip, end)
        if self.counts is not None:  # without length under torchrun: the ranks end it together
            host = steps_together(host, self.accum, self.counts,
                                  None if start_step else lambda c: self._short(epoch, c))
        elif not (self.endless or start_step):  # a pass read from its start: not empty
            host = self._whole_step(host, epoch)
        batches = self._ahead(host, "train data")
        yield from self._counted(batches) if self.counting else batches

    def _whole_step(self, host: Iterator[Any], epoch: int) -> Iterator[Any]:
        """The pass's micro-batches; one line where it holds no whole step: fit would start the
        next pass, and the next, without end (a stream without length is restarted until
        --max-steps) — a stream read once (its __iter__ handing back a generator made once) or
        smaller than a step."""
        got = 0
        for got, batch in enumerate(host, 1):  # noqa: B007 - counted for after the loop
            yield batch
        if got < self.accum:
            raise self._short(epoch, [got])

    def _short(self, epoch: int, counts: list[int]) -> UserError:
        """The one line for a pass that holds no whole step; under torchrun (every rank's
        `counts`, each rank building the same line) naming the first rank short."""
        got = min(counts)
        rank = counts.index(got) if len(counts) > 1 else self.rank
        who = (f"rank {rank}'s share of " if self.world > 1 else "") + "the training stream"
        fix = (f"its __iter__ must start it afresh on every call (not hand back a generator made "
               f"once) and it must hold at least --batch-size {self.batch_size} samples (or give "
               f"a smaller --batch-size" + (", or fewer --workers or processes)" if self.world > 1
                                            else ")"))
        if not got and self.world > 1 and getattr(self.splits["train"].dataset, "splits_itself",
                                                  False):
            fix = ("a stream with splits_itself = True must give every reader (process × worker) "
                   "items; use fewer --workers or processes, or split it into more shards")
        return UserError(f"pass {epoch} of {who} gave {got} micro-batch(es) of {self.micro}, less "
                         f"than the {self.accum} of one step: {fix}")

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:  # counted as the loop takes it (after the copy ahead)
            self.tokens_taken += tokens_in(batch)
            yield batch

    def take_tokens(self) -> int:
        """This rank's tokens trained on since the last call (counted batches only)."""
        taken, self.tokens_taken = self.tokens_taken, 0
        return taken

    def _endless(self, epoch: int) -> Iterator[Any]:
        """This rank's stream from pass `epoch` on, each pass restarted where it ends."""
        for p in itertools.count():
            self.loader.dataset.epoch = epoch + p  # each restart: a new pass
            empty = True
            for batch in self._read(self.loader, epoch + p):
                empty = False
                yield batch
            if empty and p:  # it gave items on its pass before
                raise UserError(f"rank {self.rank}'s share of the training stream gave nothing "
                                f"on pass {epoch + p}, after items on the one before: its "
                                f"__iter__ must start it afresh on every call (not hand back a "
                                f"generator made once)")
            if empty and getattr(self.loader.dataset.dataset, "splits_itself", False):
                raise UserError(f"rank {self.rank}'s share of the training stream is empty: a "
                                f"stream with splits_itself = True must give every reader "
                                f"(process × worker) items; use fewer --workers or processes, "
                                f"or split it into more shards")
            if empty:  # dealt by skipping: fewer items than readers × a micro-batch
                raise UserError(f"rank {self.rank}'s share of the training stream is empty: it "
                                f"holds less than a micro-batch of {self.micro} for each reader "
                                f"(process × worker); use a smaller --batch-size, or fewer "
                                f"--workers or processes")
            if self.steps_per_epoch is not None and not self._short_warned:
                self._short_warned = True
                print(f"warning: rank {self.rank}'s share of the training stream ended before "
                      f"the {self.steps_per_epoch} steps a pass has (len(dataset) dealt over "
                      f"processes × workers); it was topped up from its next pass. Give each "
                      f"reader an equal share, e.g. a number of shards divisible by their count",
                      file=sys.stderr)

    def _read(self, loader: DataLoader, epoch: int) -> Iterator[Any]:
        self.generator.manual_seed(mix(self.seed, epoch, self.rank))
        # A DataLoader of the user's (kept as built) draws from torch's global stream in this
        # process, workers or not: its workers' base seed, and its sampler where that has no
        # generator. On the model's stream those draws would make a resumed epoch differ.
        if loader.num_workers and loader is not self.splits["train"].as_built:
            return iter(loader)  # the loader's own iterator: no generator frame per batch
        return self._in_process(loader, epoch)

    def _in_process(self, loader: DataLoader, epoch: int) -> Iterator[Any]:
        own = (OwnRandom(self.seed) if isinstance(loader.dataset, Sharded) or loader is
               self.splits["train"].as_built else Untouched())
        own.reset(epoch, self.rank)
        with own:  # iter() draws the workers' base seed (from loader.generator, else torch's)
            batches = iter(loader)
        while True:
            with own:  # the data's random draws, on their own streams
                batch = next(batches, _END)
            if batch is _END:
                return
            yield batch

    def _ahead(self, batches: Iterator[Any], where: str) -> Iterator[Any]:
        """Batches on the device; on CUDA one copy ahead, on a side stream."""
        if self.copy_stream is None:
            for batch in batches:
                tensors = check_batch(batch, where)
                # Where every tensor is on the device already (a CPU run), nothing to rebuild.
                here = {t.device for t in tensors} == {self.device}
                yield self.finish(batch if here else tree.to_device(batch, self.device))
            return
        copies = self._copies()
        pending = None
        for batch in batches:
            check_batch(batch, where)
            issued = copies.issue(batch)  # batch k+1's copy is queued before batch k's step
            if pending is not None:
                yield self.finish(copies.ready(*pending))
            pending = issued
        if pending is not None:
            yield self.finish(copies.ready(*pending))

    def _copies(self) -> SideStreamCopies:
        return SideStreamCopies(self.device, self.copy_stream)

    def close(self) -> None:
        """Stop persistent workers now (at the end of fit): forked, they hold copies of every
        open file, the run directory's lock among them, until they exit."""
        workers = getattr(self.loader, "_iterator", None)  # DataLoader keeps them there
        if workers is not None and hasattr(workers, "_shutdown_workers"):
            workers._shutdown_workers()
            self.loader._iterator = None

    # -- evaluation ------------------------------------------------------------------------------

    def has_split(self, split: str) -> bool:
        return split in self.splits

    def eval_batches(self, batch_size: int, split: str = "test") -> Iterator[Any]:
        """The whole split in order, in batches of `batch_size` (the last one smaller)."""
        yield from self._eval(batch_size, split, 0, 1)

    def eval_shard(self, batch_size: int, split: str = "test") -> Iterator[Any]:
        """This rank's share of a split (map-style: samples r, r + world, ... in the same number
        of batches on every rank; a stream: dealt as in training)."""
        yield from self._eval(batch_size, split, self.rank, self.world)

    def _eval(self, batch_size: int, name: str, rank: int, world: int) -> Iterator[Any]:
        split = self.splits.get(name)
        if split is None:
            return
        kw = self._kw(split, f"{name} data", persistent=False)
        if split.iterable:
            loader = DataLoader(Sharded(split.dataset, rank, world, epoch=-1),
                                batch_size=None if split.batched else batch_size,
                                generator=self.generator, **kw)
        else:
            loader = DataLoader(Seeded(split.dataset), generator=self.generator, **kw,
                                batch_sampler=EvalSampler(len(split), batch_size, world, rank,
                                                          self.seed))
        yield from self._ahead(self._read(loader, -1), f"{name} data")

    # -- checkpoints (key "data") ----------------------------------------------------------------

    def state(self, step_in_epoch: int) -> dict:
        # A skipped-to position is exact only when the stream is dealt over as many readers
        # (processes × workers) as when it was written: checkpoint.resume warns otherwise.
        readers = None if self.sampler else self.world * max(1, self.loader.num_workers)
        return {"path": self.path, "resume": "sampler" if self.sampler else "skip",
                "micro_batches": step_in_epoch * self.accum, "readers": readers}


def _finisher(data: StreamData, channels_last: bool):
    """What becomes of a batch on the device, resolved once: a uint8 input of an (input,
    target) pair is scaled to [0, 1] (and NHWC if asked); any other tree passes as it is."""
    scale = data.in_dtype == torch.uint8
    nhwc = channels_last and data.in_shape is not None and len(data.in_shape) == 3
    if not (scale or nhwc):
        return lambda batch: batch
    fmt = torch.channels_last if nhwc else torch.contiguous_format

    def finish(batch):
        if not (isinstance(batch, tuple | list) and len(batch) == 2):
            return batch  # a collate_fn that made another structure: left as it is
        inputs, target = batch
        if scale:
            inputs = inputs.float() / 255
        inputs = inputs.contiguous(memory_format=fmt)
        return type(batch)([inputs, target])

    return finish

