"""What streamed data is before training: its splits (a validation share held out if asked) and
a probe of its first batch, as the split's collate_fn makes it — the kind of task, the input's
shape and dtype, the target's dtype, the classes, the tokens a sample holds. The stream itself is
stream.py's."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Subset

from fasttrain.engine.inputs import held_out, tokens_per_sample
from fasttrain.engine.sampling import OwnRandom, Split, alone, as_batch, check_sample, make_split
from fasttrain.errors import UserError

# Samples the probe batches: a collate_fn may need a pair (timm's Mixup wants an even batch).
PROBE = 2


@dataclass(frozen=True)
class StreamData:
    """What the engine knows of streamed data before training: read from its first sample."""

    name: str
    kind: str  # "classification" | "regression" | "other" (samples are not (input, target))
    in_shape: tuple[int, ...] | None  # the first input's shape, for a pair
    num_classes: int  # len(dataset.classes) (or .num_classes) where it has one, else 0
    source: str
    why: str  # why the streamed path (the start line says it)
    splits: dict[str, Split] = field(repr=False)
    train_y: torch.Tensor | None = None  # the first sample's target: a probe of its dtype
    in_dtype: torch.dtype | None = None  # the first input's, for a pair
    synthetic: bool = False
    tokens: int = 0  # tokens a sample holds (token sequences: tokens/s), else 0
    sequences: bool = False  # batches of token sequences, of one length or padded per batch


def load(splits: dict[str, Any], cfg, world: int, label: str, why: str) -> StreamData:
    """The splits as Split objects, a validation share held out if asked, and a probe."""
    parts = {k: make_split(v, k, world) for k, v in splits.items()}
    for k, part in parts.items():  # (an empty train split: _first's line)
        if k != "train" and not part.iterable and not len(part):
            raise UserError(f"{k} data is empty: give it samples, or leave the {k!r} split out")
    train = parts["train"]
    if cfg.val_fraction and "val" not in parts:
        parts["train"], parts["val"] = _hold_out(train, cfg.val_fraction, cfg.seed)
    batch = _first(train, cfg.seed)
    pair = isinstance(batch, tuple | list) and len(batch) == 2
    x, y = batch if pair else (None, None)
    if not (torch.is_tensor(x) and torch.is_tensor(y) and x.dim()):
        kind, x, y = "other", None, None
    else:
        kind = "regression" if y.is_floating_point() else "classification"
    classes = getattr(train.dataset, "classes", None)
    classes = len(classes) if classes is not None else getattr(train.dataset, "num_classes", 0)
    # Samples of one length only batch with the default collate: a DataLoader's own collate
    # may pad to each batch's longest, where the first sample's length says nothing (its
    # batches' tokens are counted as they come: stream.py).
    sequence = tokens_per_sample(batch)
    tokens = 0 if train.loader_kw else sequence
    return StreamData(name=label, kind=kind,
                      in_shape=tuple(x.shape[1:]) if x is not None else None,
                      num_classes=int(classes or 0), source=label, why=why, splits=parts,
                      train_y=y, in_dtype=x.dtype if x is not None else None, tokens=tokens,
                      sequences=bool(sequence))


def _first(split: Split, seed: int):
    """The first training samples as their collate_fn batches them (read on the data's own
    random streams), checked."""
    own = OwnRandom(seed)
    own.reset(-2)
    alone()
    with own:
        if split.iterable:
            samples = list(itertools.islice(iter(split.dataset), 1 if split.batched else PROBE))
        else:
            samples = [split.dataset[i] for i in range(min(len(split), PROBE))]
        if not samples:
            raise UserError("train data is empty: give a Dataset with samples")
        for sample in samples:
            check_sample(sample, "train data")
        batch = as_batch(split, samples, "train data")
    check_sample(batch, "train data", "batch")
    return batch


def _hold_out(train: Split, fraction: float, seed: int) -> tuple[Split, Split]:
    """A seeded share of a map-style training set as the validation set (as split_validation
    does for tensors)."""
    if train.iterable or train.as_built is not None:
        raise UserError("--val-fraction cannot hold out part of a stream or of a DataLoader "
                        "with its own sampler; give a 'val' split instead")
    keep, val = (i.tolist() for i in held_out(len(train), fraction, seed))
    return (Split(Subset(train.dataset, keep), False, train.loader_kw, train.batch_size,
                  shuffle=train.shuffle),
            Split(Subset(train.dataset, val), False, train.loader_kw))
