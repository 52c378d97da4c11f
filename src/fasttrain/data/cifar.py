"""CIFAR-10 from its binary distribution: a verified archive, a safe extraction, a strict parser.

The binary version (`cifar-10-binary.tar.gz`), never the Python one: that one is pickled, and
unpickling a downloaded file runs whatever code it holds. On disk, under any data root:

    <root>/cifar10/cifar-10-binary.tar.gz                      verified against its sha256
    <root>/cifar10/cifar-10-batches-bin/data_batch_{1..5}.bin  extracted from it (or by the user)
    <root>/cifar10/cifar-10-batches-bin/test_batch.bin

Each .bin is 10000 records of 3073 bytes: the label (0..9), then 3x32x32 pixels, the red, green
and blue planes, each row-major, i.e. exactly one uint8 [3, 32, 32] image in C order.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path, PureWindowsPath

import numpy as np

from fasttrain.data import sources
from fasttrain.errors import UserError

NAME = "cifar10"  # the folder under each data root
ARCHIVE = "cifar-10-binary.tar.gz"
BATCHES = "cifar-10-batches-bin"  # the archive's top-level folder
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILE = "test_batch.bin"
IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 10
RECORD_BYTES = 1 + 3 * 32 * 32  # label byte + pixels
RECORDS_PER_BATCH = 10000  # in every .bin, train and test alike

# sha256 and size (170052171 bytes) as recorded by tensorflow/datasets in
# tensorflow_datasets/url_checksums/cifar10.txt for this URL; the same digest is used by other
# independent loaders (gomlx's Go CIFAR downloader, torchvision-ruby).
SOURCE = sources.Source(
    files={ARCHIVE: "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"},
    mirrors=("https://www.cs.toronto.edu/~kriz/",),
)

_FIX = f"delete the {BATCHES} folder to extract it again from {ARCHIVE}, or check --data-dir"
# Python >= 3.11.4 / 3.12 can refuse unsafe members itself; _check_members runs in all cases.
_DATA_FILTER: dict[str, str] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def _complete(batches: Path) -> bool:
    return all((batches / file).is_file() for file in (*TRAIN_FILES, TEST_FILE))


def _check_members(archive: Path, members: list[tarfile.TarInfo]) -> None:
    """Refuse the whole archive if any member could land outside the target or is not a plain
    file or folder; `filter="data"` would catch most of these, but not on every Python we run on."""
    for member in members:
        # Windows rules split on both "/" and "\\" and see drive letters: stricter than POSIX.
        path = PureWindowsPath(member.name)
        if path.anchor:
            why = "an absolute path"
        elif ".." in path.parts:
            why = "a path with '..'"
        elif member.issym() or member.islnk():
            why = f"a link to {member.linkname!r}"
        elif member.isdev():
            why = "a device or FIFO"
        elif not (member.isfile() or member.isdir()):
            why = "not a regular file or folder"
        else:
            continue
        raise UserError(
            f"{archive}: member {member.name!r} is {why}, refusing to extract anything; delete "
            f"{archive.name} and download it again"
        )


def _extract_into(archive: Path, tmp: Path, dest: Path) -> Path:
    """Extract `archive` into the empty folder `tmp`, then rename its BATCHES folder to `dest`.

    The rename is atomic (same parent filesystem), so `dest` is either absent or complete; `tmp`
    is removed on every path out, including failures and Ctrl-C.
    """
    try:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                members = tar.getmembers()  # reads every header first: nothing is written yet
                _check_members(archive, members)
                tar.extractall(tmp, members=members, **_DATA_FILTER)
        except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise UserError(
                f"{archive}: corrupt archive ({e}); delete it and download it again"
            ) from None
        except OSError as e:  # disk full, permissions
            raise UserError(
                f"cannot extract {archive} into {tmp.parent}: {e.strerror or e}; free some space "
                f"or pass --data-dir DIR with a writable DIR"
            ) from None
        missing = [f for f in (*TRAIN_FILES, TEST_FILE) if not (tmp / BATCHES / f).is_file()]
        if missing:
            raise UserError(
                f"{archive}: no {BATCHES}/{missing[0]} inside; delete it and download it again"
            )
        try:
            os.rename(tmp / BATCHES, dest)
        except OSError as e:
            if not _complete(dest):  # else a concurrent extraction finished first: use it
                raise UserError(
                    f"cannot move the extracted files to {dest}: {e.strerror or e}; {_FIX}"
                ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _extract(archive: Path, fallback: Path) -> Path:
    """The BATCHES folder made from the verified `archive`: beside it, or in `fallback` (the
    download folder) when its folder is read-only, e.g. a shared $FASTTRAIN_DATA."""
    errors = []
    for into in dict.fromkeys((archive.parent, fallback)):
        dest = into / BATCHES
        if _complete(dest):
            return dest
        if dest.exists():  # never overwrite what the user has put there
            missing = next(f for f in (*TRAIN_FILES, TEST_FILE) if not (dest / f).is_file())
            raise UserError(f"{dest} lacks {missing}; delete it to extract it again from {archive}")
        try:
            into.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=into, prefix=f".{BATCHES}.", suffix=".part"))
        except OSError as e:
            errors.append(f"{into}: {e.strerror or e}")
            continue
        print(f"extracting {archive} -> {dest} ...", file=sys.stderr, flush=True)
        return _extract_into(archive, tmp, dest)
    raise UserError(
        f"cannot extract {archive} ({'; '.join(errors)}); pass --data-dir DIR with a writable DIR"
    )


def locate_cifar10(
    data_dir: str | os.PathLike[str] | None = None, *, download: bool = True
) -> Path:
    """The folder holding the six .bin batches.

    Each root in lookup order (`sources.roots`) is asked for an extracted folder, then for the
    archive (verified, then extracted); if none has either, the archive is downloaded into
    `sources.download_root(data_dir)/cifar10` and extracted there.
    """
    places = [root / NAME for root in sources.roots(data_dir)]
    target = sources.download_root(data_dir) / NAME
    for place in places:
        if _complete(place / BATCHES):
            return place / BATCHES
        archive = place / ARCHIVE
        if archive.is_file():
            sources.verify(archive, SOURCE.files[ARCHIVE])
            return _extract(archive, target)
    holds = f"{ARCHIVE} or {BATCHES}/"
    if not download:
        raise UserError(sources.not_found(NAME, places, "downloads are off", holds))
    try:
        sources.download_files(SOURCE, target)
    except sources.DownloadFailed as e:
        raise UserError(sources.not_found(NAME, places, f"download failed: {e}", holds)) from None
    return _extract(target / ARCHIVE, target)


def read_batch(path: Path, records: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 [N, 3, 32, 32] and labels uint8 [N] of one .bin, N = `records` (default
    RECORDS_PER_BATCH): read-only views on the file's bytes, the images not contiguous (each
    record's label byte sits between two images)."""
    records = RECORDS_PER_BATCH if records is None else records
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}; check --data-dir") from None
    n, rest = divmod(len(raw), RECORD_BYTES)
    if rest:
        raise UserError(
            f"{path}: {len(raw)} bytes is not a whole number of {RECORD_BYTES}-byte records "
            f"(truncated?); {_FIX}"
        )
    if n != records:
        raise UserError(f"{path}: {n} records, expected {records}; {_FIX}")
    table = np.frombuffer(raw, np.uint8).reshape(n, RECORD_BYTES)
    labels = table[:, 0]
    bad = np.flatnonzero(labels >= NUM_CLASSES)
    if bad.size:
        i = int(bad[0])
        raise UserError(
            f"{path}: label {labels[i]} in record {i} is not below {NUM_CLASSES} classes; {_FIX}"
        )
    return table[:, 1:].reshape(n, *IMAGE_SHAPE), labels


def read_cifar10(batches: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """train_x uint8 [50000, 3, 32, 32], train_y uint8 [50000], test_x [10000, 3, 32, 32],
    test_y [10000] from a folder of .bin batches; contiguous, writable, owning their memory."""

    def split(files: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        parts = [read_batch(batches / file) for file in files]
        # concatenate copies, once: the result is contiguous and no longer a view on file bytes.
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])

    train_x, train_y = split(TRAIN_FILES)
    test_x, test_y = split((TEST_FILE,))
    return train_x, train_y, test_x, test_y
