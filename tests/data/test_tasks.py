"""load_task: every task as torch tensors of the documented shapes and dtypes; the stand-ins are
deterministic and learnable; the MNIST family is read from tiny IDX files made here."""

import gzip
import hashlib
import struct
import warnings

import numpy as np
import pytest
import torch

from fasttrain.data import TASKS, TaskData, load_dataset, load_task, sources
from fasttrain.data.synthetic import TEXT_CHARS
from fasttrain.errors import UserError


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """No test may see the user's cache or data, or write outside tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTTRAIN_DATA", raising=False)


def test_task_names():
    assert TASKS == (
        "mnist",
        "fashion-mnist",
        "cifar10",
        "tinyshakespeare",
        "synthetic",
        "synthetic-cifar",
        "synthetic-text",
    )


def test_unknown_task_lists_every_task():
    with pytest.raises(UserError, match="unknown task 'imagenet'; choose one of: mnist, .*") as e:
        load_task("imagenet")
    assert ", ".join(TASKS) in str(e.value)


IMAGES = {  # name -> (in_shape, train size, test size)
    "synthetic": ((1, 28, 28), 60000, 10000),
    "synthetic-cifar": ((3, 32, 32), 10000, 2000),
}


def tensors(task: TaskData) -> list[torch.Tensor]:
    return [t for t in (task.train_x, task.train_y, task.test_x, task.test_y) if t is not None]


def same(a: TaskData, b: TaskData) -> bool:
    return all(torch.equal(x, y) for x, y in zip(tensors(a), tensors(b), strict=True))


@pytest.mark.parametrize("name", IMAGES)
def test_synthetic_images(name):
    in_shape, n_train, n_test = IMAGES[name]
    a, b, c = load_task(name, seed=1), load_task(name, seed=1), load_task(name, seed=2)
    assert a.kind == "classification" and a.in_shape == in_shape and a.num_classes == 10
    assert a.train_x.shape == (n_train, *in_shape) and a.test_x.shape == (n_test, *in_shape)
    assert a.train_y.shape == (n_train,) and a.test_y.shape == (n_test,)
    assert a.train_x.dtype == a.test_x.dtype == torch.uint8
    assert a.train_y.dtype == a.test_y.dtype == torch.int64
    assert int(a.train_y.max()) == 9 and int(a.train_y.min()) == 0 and a.vocab is None
    assert a.synthetic and a.source == "synthetic (seed 1)" and a.name == name
    assert same(a, b) and not torch.equal(a.train_x, c.train_x)


def test_synthetic_text():
    a = load_task("synthetic-text", seed=1, block_size=64)
    b = load_task("synthetic-text", seed=1, block_size=64)
    c = load_task("synthetic-text", seed=2, block_size=64)
    assert a.kind == "language" and a.in_shape == (64,) and a.train_y is None and a.test_y is None
    assert a.vocab == "".join(sorted(TEXT_CHARS)) and a.num_classes == 30
    assert a.train_x.shape == (180_000,) and a.test_x.shape == (20_000,)
    assert a.train_x.dtype == a.test_x.dtype == torch.int64 and int(a.train_x.max()) == 29
    assert a.synthetic and a.source == "synthetic (seed 1)" and a.name == "synthetic-text"
    assert same(a, b) and not torch.equal(a.train_x, c.train_x)


def test_synthetic_cifar_learnable_by_a_linear_model_but_not_perfectly():
    task = load_task("synthetic-cifar")

    def features(x: torch.Tensor) -> np.ndarray:  # 4x4-pooled pixels in [0, 1] and a bias
        pooled = x.numpy().reshape(len(x), 3, 8, 4, 8, 4).mean(axis=(3, 5)) / 255.0
        return np.c_[pooled.reshape(len(x), -1), np.ones(len(x))]

    x = features(task.train_x)
    onehot = np.eye(10)[task.train_y.numpy()]
    w = np.linalg.solve(x.T @ x + np.eye(x.shape[1]), x.T @ onehot)
    accuracy = np.mean((features(task.test_x) @ w).argmax(1) == task.test_y.numpy())
    assert 0.5 < accuracy < 0.95, accuracy


def test_synthetic_text_rewards_two_characters_of_context():
    task = load_task("synthetic-text")
    v, train, test = task.num_classes, task.train_x.numpy(), task.test_x.numpy()

    def cross_entropy(context: int) -> float:
        """nats per test character of a count model (add-one smoothed) on `context` characters."""
        keys = [train[i : len(train) - context + i] for i in range(context)]
        state = sum(k * v**i for i, k in enumerate(keys)) if keys else np.zeros(len(train), int)
        counts = np.ones((v**context, v))
        np.add.at(counts, (state, train[context:]), 1)
        probs = counts / counts.sum(1, keepdims=True)
        keys = [test[i : len(test) - context + i] for i in range(context)]
        state = sum(k * v**i for i, k in enumerate(keys)) if keys else np.zeros(len(test), int)
        return float(-np.log(probs[state, test[context:]]).mean())

    unigram, order2 = cross_entropy(0), cross_entropy(2)
    assert unigram > 3.0 and order2 < 2.0  # about 3.4 (near uniform) and 1.8 nats


def idx_gz(a: np.ndarray) -> bytes:
    return gzip.compress(struct.pack(f">2xBB{a.ndim}I", 0x08, a.ndim, *a.shape) + a.tobytes())


def test_mnist_from_idx_files(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    arrays = [
        rng.integers(0, 256, (5, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, 5, dtype=np.uint8),
        rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, 3, dtype=np.uint8),
    ]
    place = tmp_path / "data" / "mnist"
    place.mkdir(parents=True)
    files = {}
    for name, a in zip(sources.FILE_NAMES, arrays, strict=True):
        (place / name).write_bytes(idx_gz(a))
        files[name] = hashlib.sha256(idx_gz(a)).hexdigest()
    monkeypatch.setitem(sources.REGISTRY, "mnist", sources.Source(files, ()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's "The given NumPy array is not writable"
        task = load_task("mnist", tmp_path / "data", download=False)
    assert task.kind == "classification" and task.in_shape == (1, 28, 28) and not task.synthetic
    assert task.train_x.shape == (5, 1, 28, 28) and task.test_x.shape == (3, 1, 28, 28)
    assert task.train_x.dtype == task.test_x.dtype == torch.uint8
    assert task.train_y.dtype == task.test_y.dtype == torch.int64
    np.testing.assert_array_equal(task.train_x.numpy()[:, 0], arrays[0])
    np.testing.assert_array_equal(task.test_y.numpy(), arrays[3])
    assert task.source == str(place.resolve())
    # The tensors are the caller's own: changing them leaves load_dataset's shared copy alone.
    task.train_x.zero_()
    np.testing.assert_array_equal(load_dataset("mnist", tmp_path / "data").train_x, arrays[0])
