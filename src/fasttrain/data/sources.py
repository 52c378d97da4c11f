"""Where datasets come from: a registry, a lookup over local roots, and a verified download.

A dataset lives in `<root>/<name>/`; roots are searched in order: the explicit `data_dir`, then
$FASTTRAIN_DATA, then the user cache. Files are checked against their sha256 before use and nothing
found on disk is modified. A download streams into a temporary file beside its final name, is hashed
while written and renamed into place only when it matches, so a failed or tampered download can
neither replace a good file nor leave a bad one behind.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fasttrain import __version__
from fasttrain.data.idx import ImageDataset, load_split
from fasttrain.data.synthetic import synthetic_dataset
from fasttrain.errors import UserError

_CHUNK = 1 << 20  # bytes per read when hashing or downloading
_TIMEOUT_S = 30.0  # per socket operation, so a dead mirror fails over instead of hanging

# The MNIST family's file names, in the order train images, train labels, test images, test labels.
FILE_NAMES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


@dataclass(frozen=True)
class Source:
    """The files of one dataset and where to download them.

    Any file names: the MNIST family's are FILE_NAMES (in that order); other datasets (cifar.py,
    text.py) keep their own `Source` and reuse `find`, `verify`, `download_files`, `fetch_source`.
    """

    files: Mapping[str, str]  # file name -> sha256 hex digest
    mirrors: tuple[str, ...]  # base URLs tried in order; a file's URL is base + file name


def _files(*sha256: str) -> dict[str, str]:
    return dict(zip(FILE_NAMES, sha256, strict=True))


# Hashes from the SOURCE.txt of each dataset; files that do not match them are never used.
REGISTRY: dict[str, Source] = {
    "mnist": Source(
        files=_files(
            "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
            "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
            "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
            "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        ),
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
    ),
    "fashion-mnist": Source(
        files=_files(
            "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
            "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
            "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
            "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        ),
        mirrors=(
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/",
        ),
    ),
}

DATASETS: tuple[str, ...] = (*REGISTRY, "synthetic")


class DownloadFailed(Exception):
    """Every mirror failed for one file; the message lists each mirror's error."""


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/fasttrain, or ~/.cache/fasttrain."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "fasttrain"


def _source(name: str) -> Source:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}") from None


def roots(data_dir: str | os.PathLike[str] | None) -> list[Path]:
    """Where datasets are looked for, in order: `data_dir`, $FASTTRAIN_DATA, the cache."""
    paths = [Path(data_dir)] if data_dir is not None else []
    if env := os.environ.get("FASTTRAIN_DATA"):
        paths.append(Path(env))
    paths.append(default_cache_dir())
    return list(dict.fromkeys(path.expanduser() for path in paths))  # ordered, without repeats


@functools.lru_cache(maxsize=64)
def _sha256(path: Path, stamp: tuple[int, int, int]) -> str:
    """`stamp` (inode, size, mtime) keys the cache: a file is hashed again only once replaced."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, expected: str) -> None:
    """A UserError naming `path` and the fix unless its sha256 is `expected`; hashed once per
    version of the file per process."""
    try:
        st = path.stat()
        actual = _sha256(path, (st.st_ino, st.st_size, st.st_mtime_ns))
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}; check --data-dir") from None
    if actual != expected:
        raise UserError(
            f"{path}: sha256 is {actual}, expected {expected}; delete it to re-download, "
            f"or point --data-dir elsewhere"
        )


def _holds(path: Path, expected: str) -> bool:
    try:
        st = path.stat()
        return _sha256(path, (st.st_ino, st.st_size, st.st_mtime_ns)) == expected
    except OSError:
        return False


def find(
    name: str, source: Source, data_dir: str | os.PathLike[str] | None
) -> tuple[Path | None, list[Path]]:
    """The first `<root>/<name>` holding every file of `source` (verified), and all places
    looked at."""
    places = [root / name for root in roots(data_dir)]
    for place in places:
        if all((place / file).is_file() for file in source.files):
            for file, sha256 in source.files.items():
                verify(place / file, sha256)
            return place, places
    # A root pointed at the dataset's own folder (`--data-dir .../mnist`) would otherwise send
    # a second copy into `.../mnist/mnist/` (or fail offline with a list of wrong places). The
    # hashes decide: MNIST and Fashion-MNIST share file names.
    for place in places:
        if all(_holds(place.parent / file, sha256) for file, sha256 in source.files.items()):
            raise UserError(
                f"{place.parent} holds the {name} files itself, but datasets are looked for in "
                f"<root>/{name}/: pass --data-dir {place.parent.parent} (or set "
                f"FASTTRAIN_DATA={place.parent.parent})"
            )
    return None, places


def not_found(name: str, places: list[Path], why: str, holds: str) -> str:
    """The one-line message for a dataset found nowhere; `holds` describes the files needed."""
    return (
        f"dataset {name!r} not found in {', '.join(map(str, places))} ({why}); pass "
        f"--data-dir DIR or set FASTTRAIN_DATA=DIR where DIR/{name}/ holds "
        f"{holds}, or go online to download it"
    )


def locate(name: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding all files of `name`, verified; a UserError if there is none."""
    source = _source(name)
    found, places = find(name, source, data_dir)
    if found is None:
        raise UserError(not_found(name, places, "no download attempted", ", ".join(source.files)))
    return found


def _short(e: BaseException) -> str:
    # URLError wraps the real cause (DNS, refused, missing file); HTTPError's own text has the code.
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        e = e.reason if isinstance(e.reason, BaseException) else e
    return " ".join(str(e).split()) or type(e).__name__  # one line


def _download_file(url: str, dest: Path, sha256: str) -> int:
    """Download `url` onto `dest` if its sha256 matches; returns the size in bytes."""
    request = urllib.request.Request(url, headers={"User-Agent": f"fasttrain/{__version__}"})
    # Beside `dest`, so that os.replace is an atomic rename within one filesystem. Opened outside
    # a `with` so that the handler below can remove it; the `with tmp` closes it before the rename.
    tmp = tempfile.NamedTemporaryFile(  # noqa: SIM115
        dir=dest.parent, prefix=f".{dest.name}.", suffix=".part", delete=False
    )
    try:
        size, digest = 0, hashlib.sha256()
        with tmp, urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            while chunk := response.read(_CHUNK):
                digest.update(chunk)
                tmp.write(chunk)
                size += len(chunk)
            tmp.flush()
            os.fsync(tmp.fileno())  # the bytes reach the disk before the final name points at them
        if digest.hexdigest() != sha256:
            raise ValueError(f"sha256 is {digest.hexdigest()}, expected {sha256}")
        os.replace(tmp.name, dest)
    except BaseException:  # also Ctrl-C: never leave a partial file behind
        Path(tmp.name).unlink(missing_ok=True)
        raise
    return size


def download_files(source: Source, target: Path) -> None:
    """Fill `target` with the files it lacks; files already there are verified, never replaced.
    Folders it creates are removed again when a download fails and leaves them empty (a
    mistyped --data-dir leaves nothing behind)."""
    created = [d for d in (target, *target.parents) if not d.exists()]  # deepest first
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"cannot create {target}: {e.strerror or e}; pass --data-dir DIR with a writable DIR"
        ) from None
    try:
        _download_missing(source, target)
    except BaseException:
        for d in created:
            try:
                d.rmdir()  # only ever an empty folder
            except OSError:
                break
        raise


def _download_missing(source: Source, target: Path) -> None:
    for file, sha256 in source.files.items():
        dest = target / file
        if dest.is_file():  # left by an earlier, interrupted fetch
            verify(dest, sha256)
            continue
        errors = []
        for base in source.mirrors:
            url = base + file
            print(f"downloading {url} -> {target} ...", end="", file=sys.stderr, flush=True)
            try:
                size = _download_file(url, dest, sha256)
            except (OSError, ValueError, http.client.HTTPException) as e:
                print(f" failed: {_short(e)}", file=sys.stderr)
                errors.append(f"{url}: {_short(e)}")
                continue
            print(f" {size / 1e6:.1f} MB, sha256 ok", file=sys.stderr)
            break
        else:
            raise DownloadFailed("; ".join(errors) or "no mirrors")


def download_root(data_dir: str | os.PathLike[str] | None) -> Path:
    """Where downloads go: `data_dir`, else the cache; never $FASTTRAIN_DATA, which is often a
    shared, read-only copy."""
    return Path(data_dir).expanduser() if data_dir is not None else default_cache_dir()


def fetch_source(
    name: str,
    source: Source,
    data_dir: str | os.PathLike[str] | None = None,
    download: bool = True,
) -> Path:
    """`<root>/<name>` holding every file of `source` (verified), found or downloaded into
    `download_root(data_dir) / name`."""
    found, places = find(name, source, data_dir)
    if found is not None:
        return found
    holds = ", ".join(source.files)
    if not download:
        raise UserError(not_found(name, places, "downloads are off", holds))
    target = download_root(data_dir) / name
    try:
        download_files(source, target)
    except DownloadFailed as e:
        raise UserError(not_found(name, places, f"download failed: {e}", holds)) from None
    return target


def fetch(name: str, data_dir: str | os.PathLike[str] | None = None, download: bool = True) -> Path:
    """`locate(name)`, else download into `<data_dir>/<name>` (or the cache), verify, and return it.

    Never into $FASTTRAIN_DATA: it is often a shared, read-only copy.
    """
    return fetch_source(name, _source(name), data_dir, download)


@functools.lru_cache(maxsize=4)
def _read(name: str, directory: Path) -> ImageDataset:
    train_images, train_labels, test_images, test_labels = (
        directory / file for file in REGISTRY[name].files
    )
    # load_split pins both splits to [N, 28, 28], so train and test agree in image shape.
    train_x, train_y = load_split(train_images, train_labels)
    test_x, test_y = load_split(test_images, test_labels)
    return ImageDataset(
        name=name,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=10,
        source=str(directory),
        synthetic=False,
    )


def load_dataset(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
    seed: int = 0,
) -> ImageDataset:
    """The dataset `name`: found or downloaded files for the real ones, generated for "synthetic".

    `seed` only affects "synthetic". Real datasets are read once per directory per process.
    """
    if name == "synthetic":
        return synthetic_dataset(seed)
    return _read(name, fetch(name, data_dir, download).resolve())
