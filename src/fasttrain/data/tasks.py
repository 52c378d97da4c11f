"""Every dataset the training engine can train on, as one type of torch tensors: `load_task`.

Classification tasks give uint8 images [N, C, H, W] and int64 labels [N]; language tasks give one
int64 stream of token ids per split, cut into windows of `block_size` by the engine. Scaling,
normalization and moving to the device are the engine's business: the tensors here are raw, on the
CPU, and each owns its memory, so callers may change them in place without touching shared copies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from fasttrain.data import cifar, text
from fasttrain.data.sources import load_dataset
from fasttrain.data.synthetic import synthetic_cifar, synthetic_text
from fasttrain.errors import UserError

TASKS: tuple[str, ...] = (
    "mnist",
    "fashion-mnist",
    "cifar10",
    "tinyshakespeare",
    "synthetic",
    "synthetic-cifar",
    "synthetic-text",
)


@dataclass(frozen=True)
class TaskData:
    """One task's train and test data, and what a model needs to know about it."""

    name: str  # one of TASKS, or a user's label
    kind: str  # "classification" | "language" | "regression" (a user's float targets)
    train_x: torch.Tensor  # classification: uint8 [N, C, H, W]; language: int64 [T_train] token ids
    train_y: torch.Tensor | None  # classification: int64 [N], values < num_classes; language: None
    test_x: torch.Tensor  # uint8 [M, C, H, W] | int64 [T_test]
    test_y: torch.Tensor | None  # int64 [M] | None
    num_classes: int  # classes, or vocabulary size for language
    in_shape: tuple[int, ...]  # (C, H, W) for images; (block_size,) for language
    source: str  # directory/file it came from, or "synthetic (seed S)"
    synthetic: bool  # True for the stand-ins: every output must say so
    vocab: str | None = None  # language: the characters, index = token id
    # A validation set apart from the test set (early stopping reads it): same forms as test.
    val_x: torch.Tensor | None = None
    val_y: torch.Tensor | None = None


def _tensor(a: np.ndarray, dtype: type[np.generic]) -> torch.Tensor:
    """`a` as a tensor of its own: copied only when `a` is read-only (load_dataset's shared cache,
    file bytes), a view or of another dtype, which also keeps torch's non-writable warning away."""
    return torch.from_numpy(np.require(a, dtype, ["C", "W", "O"]))


def _images(
    name: str,
    arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    source: str,
    synthetic: bool,
) -> TaskData:
    """TaskData from train_x [N, C, H, W] (or [N, H, W], given one channel), train_y [N], test_x,
    test_y."""
    train_x, train_y, test_x, test_y = arrays
    if train_x.ndim == 3:  # the MNIST family: grey images get their channel axis
        train_x, test_x = train_x[:, None], test_x[:, None]
    return TaskData(
        name=name,
        kind="classification",
        train_x=_tensor(train_x, np.uint8),
        train_y=_tensor(train_y, np.int64),
        test_x=_tensor(test_x, np.uint8),
        test_y=_tensor(test_y, np.int64),
        num_classes=10,
        in_shape=tuple(train_x.shape[1:]),
        source=source,
        synthetic=synthetic,
    )


def _language(name: str, corpus: str, block_size: int, source: str, synthetic: bool) -> TaskData:
    ids, vocab = text.char_tokens(corpus)
    train, test = text.split_tokens(ids, block_size, what=source)
    return TaskData(
        name=name,
        kind="language",
        train_x=_tensor(train, np.int64),
        train_y=None,
        test_x=_tensor(test, np.int64),
        test_y=None,
        num_classes=len(vocab),
        in_shape=(block_size,),
        source=source,
        synthetic=synthetic,
        vocab=vocab,
    )


def load_task(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    seed: int = 0,
    block_size: int = 128,
    download: bool = True,
) -> TaskData:
    """The task `name`: real files found under data_dir, $FASTTRAIN_DATA or the cache (else
    downloaded unless `download` is False), or a stand-in generated from `seed`.

    `seed` only affects the synthetic tasks, `block_size` only the language ones, where it is
    validated against the length of both splits.
    """
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    if name in ("tinyshakespeare", "synthetic-text"):
        text.check_block_size(block_size)  # before a download, not after
    seeded = f"synthetic (seed {seed})"
    if name in ("mnist", "fashion-mnist", "synthetic"):
        ds = load_dataset(name, data_dir, download=download, seed=seed)
        return _images(
            name, (ds.train_x, ds.train_y, ds.test_x, ds.test_y), ds.source, ds.synthetic
        )
    if name == "cifar10":
        batches = cifar.locate_cifar10(data_dir, download=download)
        return _images(name, cifar.read_cifar10(batches), str(batches), synthetic=False)
    if name == "synthetic-cifar":
        return _images(name, synthetic_cifar(seed), seeded, synthetic=True)
    if name == "tinyshakespeare":
        corpus, path = text.read_tinyshakespeare(data_dir, download=download)
        return _language(name, corpus, block_size, str(path), synthetic=False)
    return _language(name, synthetic_text(seed), block_size, seeded, synthetic=True)
