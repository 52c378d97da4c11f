"""Deterministic, learnable stand-ins for MNIST, CIFAR-10 and a character corpus, for machines
without the real files.

Images: ten smooth random class prototypes; each sample is the prototype of its class with a random
contrast and brightness plus pixel noise. Logistic regression reaches about 91% test accuracy on the
MNIST stand-in (MNIST: about 92%), so timings and learning curves behave like the real thing, but
the numbers are not the real datasets': they carry `synthetic=True` and every output must say so.

Text: characters sampled from a fixed random order-2 Markov chain, so a model that sees two
characters of context can beat a unigram model by a wide, known margin.
"""

from __future__ import annotations

import bisect

import numpy as np

from fasttrain.data.idx import IMAGE_SHAPE, ImageDataset

_NUM_CLASSES = 10
_GRID = 8  # prototypes are bilinear upsamplings of an 8x8 random grid: smooth blobs, like strokes
# How far each prototype sits from the mean of all ten (1 = fully apart). This sets the difficulty:
# 0.18 puts a linear model near MNIST's accuracy instead of at 100%.
_CLASS_SPREAD = 0.18
_NOISE_STD = 60.0  # grey levels
_CONTRAST = 0.2  # per-sample contrast factor drawn from 1 +- this
_BRIGHTNESS = 10.0  # per-sample brightness shift drawn from +- this, grey levels
_CHUNK = 4096  # samples per float32 block: ~13 MB of scratch instead of ~190 MB for all of train

CIFAR_SHAPE = (3, 32, 32)  # channels (red, green, blue), height, width
# Three channels carry more signal than MNIST's one grey plane at the same spread: at 0.08 a linear
# model (ridge regression on 4x4-pooled pixels, 10000 samples) reaches about 80%, not 100%.
_CIFAR_SPREAD = 0.08

TEXT_CHARS = "abcdefghijklmnopqrstuvwxyz .,\n"  # the stand-in corpus's 30 characters
# Dirichlet concentration of each context's next-character distribution: small means few likely
# successors. 0.1 gives an expected entropy of about 1.7 nats per character (a unigram model: about
# 3.4), near what char-level models reach on Tiny Shakespeare.
_TEXT_ALPHA = 0.1


def _smooth_planes(rng: np.random.Generator, n: int, side: int) -> np.ndarray:
    """float64 [n, side, side], each plane stretched to [0, 255]: bilinear upsamplings of random
    8x8 grids, smooth blobs like strokes."""
    grid = rng.standard_normal((n, _GRID, _GRID))
    pos = np.linspace(0, _GRID - 1, side)
    lo = np.minimum(pos.astype(int), _GRID - 2)
    frac = pos - lo
    rows = grid[:, lo] * (1 - frac)[:, None] + grid[:, lo + 1] * frac[:, None]  # [n, side, 8]
    img = rows[:, :, lo] * (1 - frac) + rows[:, :, lo + 1] * frac  # [n, side, side]
    img -= img.min(axis=(1, 2), keepdims=True)
    img *= 255 / img.max(axis=(1, 2), keepdims=True)
    return img


def _pull_together(img: np.ndarray, spread: float) -> np.ndarray:
    """float32 prototypes moved towards their mean: `spread` 1 keeps them apart, 0 makes them
    identical. This sets how hard the classes are to tell apart."""
    mean = img.mean(axis=0)
    return (mean + spread * (img - mean)).astype(np.float32)


def _prototypes(rng: np.random.Generator) -> np.ndarray:
    """float32 [10, 28, 28] in [0, 255]."""
    return _pull_together(_smooth_planes(rng, _NUM_CLASSES, IMAGE_SHAPE[0]), _CLASS_SPREAD)


def _split(rng: np.random.Generator, protos: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images [n, *protos.shape[1:]] and uint8 labels [n], both read-only."""
    shape = protos.shape[1:]
    per_sample = (slice(None),) + (None,) * len(shape)  # [n] -> [n, 1, ...] for broadcasting
    y = rng.integers(0, _NUM_CLASSES, n, dtype=np.uint8)
    contrast = rng.uniform(1 - _CONTRAST, 1 + _CONTRAST, n).astype(np.float32)
    brightness = rng.uniform(-_BRIGHTNESS, _BRIGHTNESS, n).astype(np.float32)
    # Uniform noise from raw bytes: ~10x faster than standard_normal, and its shape does not matter.
    noise = np.frombuffer(rng.bytes(n * protos[0].size), np.uint8).reshape(n, *shape)
    scale = np.float32(_NOISE_STD * np.sqrt(3) / 127.5)  # uniform on +-a has std a / sqrt(3)
    x = np.empty((n, *shape), np.uint8)
    for i in range(0, n, _CHUNK):
        s = slice(i, i + _CHUNK)
        block = noise[s].astype(np.float32)
        block -= 127.5
        block *= scale
        block += protos[y[s]] * contrast[s][per_sample]
        block += brightness[s][per_sample]
        np.clip(block, 0, 255, out=block)
        x[s] = block
    # Read-only like the IDX datasets, so code that mutates its inputs fails on both alike.
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def synthetic_dataset(seed: int = 0, n_train: int = 60000, n_test: int = 10000) -> ImageDataset:
    """MNIST-shaped uint8 images and labels, the same bytes for the same arguments."""
    rng = np.random.Generator(np.random.PCG64(seed))
    protos = _prototypes(rng)
    train_x, train_y = _split(rng, protos, n_train)
    test_x, test_y = _split(rng, protos, n_test)
    return ImageDataset(
        name="synthetic",
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=_NUM_CLASSES,
        source=f"synthetic (seed {seed})",
        synthetic=True,
    )


def synthetic_cifar(
    seed: int = 0, n_train: int = 10000, n_test: int = 2000
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CIFAR-10-shaped train_x uint8 [n_train, 3, 32, 32], train_y uint8 [n_train], test_x, test_y,
    read-only; the same bytes for the same arguments.

    Smaller than CIFAR-10 by default (10000 / 2000) so that it generates in a fraction of a second.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    planes = _smooth_planes(rng, _NUM_CLASSES * CIFAR_SHAPE[0], CIFAR_SHAPE[1])  # one per channel
    protos = _pull_together(planes.reshape(_NUM_CLASSES, *CIFAR_SHAPE), _CIFAR_SPREAD)
    train_x, train_y = _split(rng, protos, n_train)
    test_x, test_y = _split(rng, protos, n_test)
    return train_x, train_y, test_x, test_y


def synthetic_text(seed: int = 0, n_chars: int = 200_000) -> str:
    """`n_chars` characters of TEXT_CHARS from a random order-2 Markov chain fixed by `seed`.

    Sampled one character at a time (each depends on the two before): a plain-Python loop over
    lists with `bisect`, ~0.1 s for 200k characters, several times faster than numpy per step.
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    v = len(TEXT_CHARS)
    # cum[a * v + b] is the cumulative distribution of the character that follows "ab": [v * v, v].
    cum = np.cumsum(rng.dirichlet(np.full(v, _TEXT_ALPHA), size=v * v), axis=1)
    cum[:, -1] = 1.0  # so that every draw in [0, 1) lands below the last bound despite rounding
    table = cum.tolist()
    out = bytearray(n_chars)
    a = b = 0
    for i, u in enumerate(rng.random(n_chars).tolist()):
        a, b = b, bisect.bisect_right(table[a * v + b], u)
        out[i] = b
    return out.translate(bytes.maketrans(bytes(range(v)), TEXT_CHARS.encode())).decode()
