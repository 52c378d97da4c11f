"""Strict reader for the IDX files of the MNIST family, and the in-memory dataset they make.

IDX layout (big-endian): two zero bytes, a dtype code, the number of dimensions, one uint32 per
dimension, then the values in C order. MNIST and Fashion-MNIST ship it gzipped, uint8 only: labels
are 1-D (magic 2049), images 3-D [N, 28, 28] (magic 2051). Every deviation is a `UserError`: a
silently short or misread file would train on garbage and report a wrong accuracy.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fasttrain.errors import UserError

IMAGE_SHAPE = (28, 28)

_GZIP_MAGIC = b"\x1f\x8b"
_DTYPE_NAMES = {
    0x08: "uint8",
    0x09: "int8",
    0x0B: "int16",
    0x0C: "int32",
    0x0D: "float32",
    0x0E: "float64",
}
_FIX = "delete it and run again to re-download, or check --data-dir"


@dataclass(frozen=True)
class ImageDataset:
    """An MNIST-shaped classification dataset held in memory.

    The arrays are read-only: `load_dataset` shares one copy between callers, so copy before
    changing pixels in place (`torch.from_numpy` warns on read-only arrays; `torch.tensor` copies).
    """

    name: str  # "mnist" | "fashion-mnist" | "synthetic"
    train_x: np.ndarray  # uint8 [N, 28, 28], C-contiguous
    train_y: np.ndarray  # uint8 [N], values < num_classes
    test_x: np.ndarray  # uint8 [M, 28, 28], C-contiguous
    test_y: np.ndarray  # uint8 [M]
    num_classes: int
    source: str  # the directory it was read from, or "synthetic (seed S)"
    synthetic: bool  # True for the stand-in: every output must say so


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}; check --data-dir") from None
    # Decided by content, not by name: a renamed or pre-extracted file still reads correctly.
    if raw[:2] != _GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:  # bad CRC or length, truncated or garbled stream
        raise UserError(f"{path}: corrupt gzip data ({e}); {_FIX}") from None


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """The array stored in an IDX file (gzipped or raw), read-only, shape from its header."""
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4 or data[:2] != b"\0\0":
        raise UserError(f"{path}: not an IDX file (magic bytes {data[:4].hex() or 'none'}); {_FIX}")
    dtype_code, ndim = data[2], data[3]
    if dtype_code != 0x08:
        found = _DTYPE_NAMES.get(dtype_code, "unknown")
        raise UserError(
            f"{path}: IDX dtype is {found} (code 0x{dtype_code:02x}), but the MNIST family is "
            f"uint8 (0x08); {_FIX}"
        )
    if ndim not in (1, 3):
        raise UserError(
            f"{path}: IDX has {ndim} dimensions, expected 1 (labels, magic 2049) or 3 "
            f"(images, magic 2051); {_FIX}"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise UserError(f"{path}: IDX header truncated ({len(data)} of {header} bytes); {_FIX}")
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    if 0 in dims:
        raise UserError(f"{path}: IDX dimensions {dims} include a zero; {_FIX}")
    expected = header + math.prod(dims)  # itemsize is 1 for uint8
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "trailing bytes"
        raise UserError(
            f"{path}: {what}: header {dims} needs {expected} bytes, found {len(data)}; {_FIX}"
        )
    # A view on the decompressed bytes: no copy, and read-only because `bytes` is immutable.
    return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


def load_split(
    images_path: Path, labels_path: Path, num_classes: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """Images [N, 28, 28] and labels [N] of one split, checked against each other.

    Pinning every split to 28x28 also makes train and test agree in image shape.
    """
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.shape[1:] != IMAGE_SHAPE:
        raise UserError(
            f"{images_path}: expected images of shape [N, 28, 28], found {list(images.shape)}; "
            f"check that --data-dir holds the right dataset"
        )
    if labels.ndim != 1:
        raise UserError(
            f"{labels_path}: expected 1-D labels, found shape {list(labels.shape)}; "
            f"check that --data-dir holds the right dataset"
        )
    if len(images) != len(labels):
        raise UserError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels; "
            f"{_FIX}"
        )
    bad = np.flatnonzero(labels >= num_classes)
    if bad.size:
        i = int(bad[0])
        raise UserError(
            f"{labels_path}: label {labels[i]} at index {i} is not below {num_classes} classes; "
            f"{_FIX}"
        )
    return images, labels
