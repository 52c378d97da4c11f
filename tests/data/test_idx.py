"""The IDX reader accepts exactly the MNIST family's files and rejects each kind of damage."""

import gzip
import struct

import numpy as np
import pytest

from fasttrain.data import load_split, read_idx
from fasttrain.errors import UserError


def idx_bytes(a: np.ndarray, dtype_code: int = 0x08) -> bytes:
    return struct.pack(f">2xBB{a.ndim}I", dtype_code, a.ndim, *a.shape) + a.tobytes()


def write(path, data: bytes, gz: bool = True):
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


IMAGES = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
LABELS = np.array([0, 9, 4], dtype=np.uint8)


@pytest.mark.parametrize("gz", [True, False])
def test_reads_gzipped_and_raw_by_content_not_name(tmp_path, gz):
    # The names lie on purpose: gzip is detected from the magic bytes.
    path = write(tmp_path / ("images" if gz else "images.gz"), idx_bytes(IMAGES), gz=gz)
    a = read_idx(path)
    assert a.dtype == np.uint8 and a.shape == (3, 28, 28) and a.flags.c_contiguous
    np.testing.assert_array_equal(a, IMAGES)
    assert not a.flags.writeable


def _header(dtype_code: int, dims: tuple[int, ...]) -> bytes:
    return struct.pack(f">2xBB{len(dims)}I", dtype_code, len(dims), *dims)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"", "not an IDX file", id="empty"),
        pytest.param(b"\x01\x02\x08\x01" + bytes(8), "magic bytes 01020801", id="magic"),
        pytest.param(_header(0x0D, (2,)) + bytes(8), "dtype is float32 (code 0x0d)", id="dtype"),
        pytest.param(_header(0x08, (2, 2)) + bytes(4), "2 dimensions", id="ndim"),
        pytest.param(_header(0x08, (0,)), "include a zero", id="zero-dim"),
        pytest.param(b"\0\0\x08\x03" + bytes(4), "header truncated", id="short-header"),
        pytest.param(
            idx_bytes(LABELS)[:-1],
            "truncated: header (3,) needs 11 bytes, found 10",
            id="truncated",
        ),
        pytest.param(
            idx_bytes(LABELS) + b"\0",
            "trailing bytes: header (3,) needs 11 bytes, found 12",
            id="trailing",
        ),
    ],
)
def test_rejects_malformed_idx(tmp_path, data, message):
    path = write(tmp_path / "labels.gz", data)
    with pytest.raises(UserError) as e:
        read_idx(path)
    assert message in str(e.value) and str(path) in str(e.value)
    assert "\n" not in str(e.value)


def test_rejects_corrupt_gzip(tmp_path):
    good = gzip.compress(idx_bytes(IMAGES))
    bad_crc = good[:-8] + bytes([good[-8] ^ 0xFF]) + good[-7:]  # CRC32 sits in the 8-byte trailer
    for name, data in [("truncated.gz", good[: len(good) // 2]), ("crc.gz", bad_crc)]:
        path = write(tmp_path / name, data, gz=False)
        with pytest.raises(UserError, match="corrupt gzip data.*re-download") as e:
            read_idx(path)
        assert str(path) in str(e.value)


def test_missing_file_is_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read .*check --data-dir"):
        read_idx(tmp_path / "nope.gz")


def test_load_split_returns_matching_images_and_labels(tmp_path):
    images = write(tmp_path / "i.gz", idx_bytes(IMAGES))
    labels = write(tmp_path / "l.gz", idx_bytes(LABELS))
    x, y = load_split(images, labels)
    np.testing.assert_array_equal(x, IMAGES)
    np.testing.assert_array_equal(y, LABELS)


@pytest.mark.parametrize(
    ("images", "labels", "bad", "message"),
    [
        (IMAGES[:, 1:], LABELS, "i.gz", r"shape \[N, 28, 28\], found \[3, 27, 28\]"),
        (IMAGES, IMAGES, "l.gz", r"1-D labels, found shape \[3, 28, 28\]"),
        (IMAGES, LABELS[:2], "l.gz", "3 images but .* has 2 labels"),
        (IMAGES, np.array([0, 1, 10], np.uint8), "l.gz", "label 10 at index 2 is not below 10"),
    ],
)
def test_load_split_rejects_inconsistent_files(tmp_path, images, labels, bad, message):
    with pytest.raises(UserError, match=message) as e:
        load_split(
            write(tmp_path / "i.gz", idx_bytes(images)),
            write(tmp_path / "l.gz", idx_bytes(labels)),
        )
    assert str(tmp_path / bad) in str(e.value)
