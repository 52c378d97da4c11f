"""Lookup, verification and download of the real datasets, offline: mirrors are file:// folders
serving tiny IDX files, and the registry's hashes are patched to match them."""

import gzip
import hashlib
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from fasttrain.data import DATASETS, default_cache_dir, fetch, load_dataset, locate, sources
from fasttrain.errors import UserError

# Read before the autouse fixture below clears it for every test.
REAL_DATA = os.environ.get("FASTTRAIN_DATA")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """No test may see the user's cache or data, or write outside tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTTRAIN_DATA", raising=False)


def idx_gz(a: np.ndarray) -> bytes:
    return gzip.compress(struct.pack(f">2xBB{a.ndim}I", 0x08, a.ndim, *a.shape) + a.tobytes())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def mirror(tmp_path, monkeypatch) -> Path:
    """A folder serving a tiny "mnist" (5 train, 3 test images), registered as its only mirror."""
    rng = np.random.default_rng(0)
    arrays = [
        rng.integers(0, 256, (5, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, 5, dtype=np.uint8),
        rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
        rng.integers(0, 10, 3, dtype=np.uint8),
    ]
    folder = tmp_path / "mirror"
    folder.mkdir()
    files = {}
    for name, a in zip(sources.FILE_NAMES, arrays, strict=True):
        data = idx_gz(a)
        (folder / name).write_bytes(data)
        files[name] = sha256(data)
    source = sources.Source(files=files, mirrors=(folder.as_uri() + "/",))
    monkeypatch.setitem(sources.REGISTRY, "mnist", source)
    return folder


def put(mirror: Path, place: Path) -> Path:
    """A local copy of the mirror's files in `place` (a `<root>/mnist` folder)."""
    shutil.copytree(mirror, place)
    return place


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_download_writes_verified_files_and_loads_them(mirror, tmp_path, capsys):
    ds = load_dataset("mnist", tmp_path / "data")
    target = tmp_path / "data" / "mnist"
    # Exactly the four files, byte-identical to the mirror: no temporary file left behind.
    assert snapshot(target).keys() == set(sources.FILE_NAMES)
    for name in sources.FILE_NAMES:
        assert (target / name).read_bytes() == (mirror / name).read_bytes()
    assert ds.train_x.shape == (5, 28, 28) and ds.test_y.shape == (3,)
    assert ds.source == str(target.resolve()) and not ds.synthetic and ds.name == "mnist"
    assert capsys.readouterr().err.count("sha256 ok") == 4
    # Found locally and read once per process from now on.
    assert load_dataset("mnist", tmp_path / "data", download=False) is ds


def test_download_goes_to_cache_not_fastrain_data(mirror, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTTRAIN_DATA", str(tmp_path / "shared"))
    assert fetch("mnist") == default_cache_dir() / "mnist" == tmp_path / "cache/fasttrain/mnist"
    assert not (tmp_path / "shared").exists()


def test_next_mirror_is_tried_after_a_failure(mirror, monkeypatch, tmp_path):
    good = sources.REGISTRY["mnist"]
    dead = (tmp_path / "dead").as_uri() + "/"
    source = sources.Source(good.files, (dead, *good.mirrors))
    monkeypatch.setitem(sources.REGISTRY, "mnist", source)
    assert fetch("mnist", tmp_path / "data") == tmp_path / "data" / "mnist"


def test_mismatching_download_keeps_existing_files_and_leaves_no_temp(mirror, tmp_path):
    target = tmp_path / "data" / "mnist"
    target.mkdir(parents=True)
    shutil.copy(mirror / sources.FILE_NAMES[0], target)
    before = snapshot(target)
    # The mirror now serves labels whose hash is not the registered one.
    (mirror / sources.FILE_NAMES[1]).write_bytes(idx_gz(np.zeros(5, np.uint8)))
    with pytest.raises(UserError, match=f"download failed: .*{sources.FILE_NAMES[1]}: sha256 is"):
        fetch("mnist", tmp_path / "data")
    assert snapshot(target) == before


def test_mismatching_download_never_replaces_the_destination(tmp_path):
    (tmp_path / "served").write_bytes(b"tampered")
    dest = tmp_path / "dest"
    dest.write_bytes(b"good")
    with pytest.raises(ValueError, match="sha256 is"):
        sources._download_file((tmp_path / "served").as_uri(), dest, sha256(b"good"))
    assert dest.read_bytes() == b"good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "served"]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: gzip.compress(b"\x08\x03" + gzip.decompress(data)), id="magic"),
    ],
)
def test_corrupt_local_file_names_the_file(mirror, tmp_path, monkeypatch, damage):
    place = put(mirror, tmp_path / "data" / "mnist")
    bad = place / sources.FILE_NAMES[2]
    bad.write_bytes(damage(bad.read_bytes()))
    # Registered with the damaged file's hash, so that the IDX reader is what catches it.
    files = {**sources.REGISTRY["mnist"].files, bad.name: sha256(bad.read_bytes())}
    monkeypatch.setitem(sources.REGISTRY, "mnist", sources.Source(files, ()))
    with pytest.raises(UserError, match="re-download") as e:
        load_dataset("mnist", tmp_path / "data")
    assert str(bad) in str(e.value)


def test_checksum_mismatch_of_local_file_errors_and_touches_nothing(mirror, tmp_path):
    place = put(mirror, tmp_path / "data" / "mnist")
    bad = place / sources.FILE_NAMES[3]
    bad.write_bytes(idx_gz(np.zeros(3, np.uint8)))
    before = snapshot(place)
    expected = sources.REGISTRY["mnist"].files[bad.name]
    with pytest.raises(UserError) as e:
        load_dataset("mnist", tmp_path / "data")
    message = str(e.value)
    assert str(bad) in message and expected in message and sha256(bad.read_bytes()) in message
    assert "delete it to re-download" in message
    assert snapshot(place) == before


@pytest.mark.parametrize("download", [True, False])
def test_nothing_found_lists_every_place_looked(mirror, tmp_path, monkeypatch, download):
    shutil.rmtree(mirror)  # offline: the only mirror is gone
    monkeypatch.setenv("FASTTRAIN_DATA", str(tmp_path / "env"))
    with pytest.raises(UserError) as e:
        load_dataset("mnist", tmp_path / "data", download=download)
    message = str(e.value)
    for place in ("data/mnist", "env/mnist", "cache/fasttrain/mnist"):
        assert str(tmp_path / place) in message
    assert "--data-dir DIR" in message and "FASTTRAIN_DATA=DIR" in message
    assert ("download failed" in message) is download and "\n" not in message


def test_lookup_order_data_dir_then_env_then_cache(mirror, tmp_path, monkeypatch):
    for root in ("data", "env", "cache/fasttrain"):
        put(mirror, tmp_path / root / "mnist")
    monkeypatch.setenv("FASTTRAIN_DATA", str(tmp_path / "env"))
    assert locate("mnist", tmp_path / "data") == tmp_path / "data" / "mnist"
    assert locate("mnist") == tmp_path / "env" / "mnist"
    monkeypatch.delenv("FASTTRAIN_DATA")
    assert locate("mnist") == tmp_path / "cache" / "fasttrain" / "mnist"
    # A root holding only some of the files is passed over.
    (tmp_path / "data" / "mnist" / sources.FILE_NAMES[0]).unlink()
    assert locate("mnist", tmp_path / "data") == tmp_path / "cache" / "fasttrain" / "mnist"


def test_unknown_dataset_lists_known_names():
    with pytest.raises(UserError, match="unknown dataset 'cifar'.*mnist, fashion-mnist, synthetic"):
        load_dataset("cifar")
    assert DATASETS == ("mnist", "fashion-mnist", "synthetic")


def test_synthetic_needs_no_files():
    ds = load_dataset("synthetic", seed=3)
    assert ds.synthetic and ds.source == "synthetic (seed 3)"


@pytest.mark.skipif(
    not REAL_DATA or not (Path(REAL_DATA) / "mnist").is_dir(),
    reason="set FASTTRAIN_DATA to a folder holding mnist/ to test the real files",
)
def test_real_mnist(monkeypatch):
    monkeypatch.setenv("FASTTRAIN_DATA", REAL_DATA)
    place = Path(REAL_DATA) / "mnist"
    assert locate("mnist") == place  # every file's sha256 checked against the registry
    ds = load_dataset("mnist", download=False)
    assert ds.train_x.shape == (60000, 28, 28) and ds.test_x.shape == (10000, 28, 28)
    assert ds.train_y.shape == (60000,) and ds.test_y.shape == (10000,)
    assert set(np.unique(ds.train_y)) == set(range(10)) and ds.test_y.max() < 10
    assert ds.source == str(place.resolve()) and not ds.synthetic
    assert load_dataset("mnist", download=False) is ds  # cached in-process


def test_a_failed_download_leaves_no_folder_it_created(mirror, tmp_path):
    """A mistyped --data-dir with no way to download: nothing is left behind, and a folder that
    was there before stays."""
    (mirror / sources.FILE_NAMES[0]).unlink()  # the mirror cannot serve every file
    typo = tmp_path / "dtaa" / "dir"
    with pytest.raises(UserError, match="download failed"):
        fetch("mnist", typo)
    assert not (tmp_path / "dtaa").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(UserError, match="download failed"):
        fetch("mnist", kept)
    assert kept.is_dir() and not any(kept.iterdir())


@pytest.mark.parametrize("via", ["data_dir", "env"])
def test_a_root_holding_the_files_itself_names_its_parent_and_downloads_nothing(
        mirror, tmp_path, monkeypatch, via):
    """--data-dir (or FASTTRAIN_DATA) pointed at the mnist folder instead of the folder above
    it: one line naming the parent, and no second copy downloaded into <it>/mnist/."""
    place = put(mirror, tmp_path / "data" / "mnist")
    before = snapshot(place)
    if via == "env":
        monkeypatch.setenv("FASTTRAIN_DATA", str(place))
    with pytest.raises(UserError) as e:
        load_dataset("mnist", place if via == "data_dir" else None)
    message = str(e.value)
    assert f"{place} holds the mnist files itself" in message and "\n" not in message
    assert str(tmp_path / "data") in message.split("holds", 1)[1]  # the parent, the fix
    assert snapshot(place) == before and not (place / "mnist").exists()
    assert not (tmp_path / "cache" / "fasttrain" / "mnist").exists()


def test_a_root_holding_another_datasets_files_is_not_named_as_this_one(mirror, tmp_path):
    """Fashion-MNIST's files have MNIST's names: only matching hashes make the hint."""
    place = put(mirror, tmp_path / "data" / "mnist")
    (place / sources.FILE_NAMES[0]).write_bytes(idx_gz(np.zeros((5, 28, 28), np.uint8)))
    shutil.rmtree(mirror)  # offline
    with pytest.raises(UserError, match="download failed"):
        load_dataset("mnist", place)
