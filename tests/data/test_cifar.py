"""CIFAR-10 offline: a tiny archive (4 records per batch) served from a file:// mirror, with the
registry's sha256 patched to match; the archive's layout is the real one."""

import hashlib
import io
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fasttrain.data import cifar, load_task, sources
from fasttrain.errors import UserError

RECORDS = 4  # per batch, instead of 10000


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """No test may see the user's cache or data, or write outside tmp_path; batches are tiny."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTTRAIN_DATA", raising=False)
    monkeypatch.setattr(cifar, "RECORDS_PER_BATCH", RECORDS)


def batch_bytes(seed: int, n: int = RECORDS) -> bytes:
    """n records: label byte, then 3072 pixel bytes."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, (n, 1), dtype=np.uint8)
    pixels = rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8)
    return np.concatenate([labels, pixels], axis=1).tobytes()


BATCHES = {file: batch_bytes(i) for i, file in enumerate((*cifar.TRAIN_FILES, cifar.TEST_FILE))}


def tar_gz(members: dict[str, bytes], extra: tuple[tarfile.TarInfo, ...] = ()) -> bytes:
    """A .tar.gz with a folder entry, the given files and any extra (hostile) entries."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        folder = tarfile.TarInfo(cifar.BATCHES)
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return out.getvalue()


def archive_of(batches: dict[str, bytes], extra: tuple[tarfile.TarInfo, ...] = ()) -> bytes:
    files = {f"{cifar.BATCHES}/{name}": data for name, data in batches.items()}
    return tar_gz({**files, f"{cifar.BATCHES}/batches.meta.txt": b"airplane\n"}, extra)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def serve(tmp_path: Path, monkeypatch, data: bytes) -> Path:
    """`data` as the archive of the only mirror, registered with its sha256."""
    mirror = tmp_path / "mirror"
    mirror.mkdir(exist_ok=True)
    (mirror / cifar.ARCHIVE).write_bytes(data)
    source = sources.Source({cifar.ARCHIVE: sha256(data)}, (mirror.as_uri() + "/",))
    monkeypatch.setattr(cifar, "SOURCE", source)
    return mirror


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def expected(files: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    table = np.frombuffer(b"".join(BATCHES[f] for f in files), np.uint8).reshape(-1, 3073)
    return table[:, 1:].reshape(-1, 3, 32, 32), table[:, 0]


def test_download_verify_extract_and_parse(tmp_path, monkeypatch, capsys):
    mirror = serve(tmp_path, monkeypatch, archive_of(BATCHES))
    task = load_task("cifar10", tmp_path / "data")
    place = tmp_path / "data" / "cifar10"
    batches = place / cifar.BATCHES
    # The verified archive is kept, the folder is complete, no temporary folder is left.
    assert tree(place) == {
        cifar.ARCHIVE,
        cifar.BATCHES,
        *(f"{cifar.BATCHES}/{f}" for f in (*BATCHES, "batches.meta.txt")),
    }
    assert (place / cifar.ARCHIVE).read_bytes() == (mirror / cifar.ARCHIVE).read_bytes()
    assert task.kind == "classification" and task.num_classes == 10 and not task.synthetic
    assert task.in_shape == (3, 32, 32) and task.source == str(batches) and task.vocab is None
    assert task.train_x.shape == (5 * RECORDS, 3, 32, 32) and task.test_x.shape == (
        RECORDS,
        3,
        32,
        32,
    )
    assert task.train_x.dtype == task.test_x.dtype == torch.uint8
    assert task.train_y.dtype == task.test_y.dtype == torch.int64
    train_x, train_y = expected(cifar.TRAIN_FILES)
    test_x, test_y = expected((cifar.TEST_FILE,))
    np.testing.assert_array_equal(task.train_x.numpy(), train_x)
    np.testing.assert_array_equal(task.train_y.numpy(), train_y)
    np.testing.assert_array_equal(task.test_x.numpy(), test_x)
    np.testing.assert_array_equal(task.test_y.numpy(), test_y)
    assert "sha256 ok" in capsys.readouterr().err
    # Offline from now on: the extracted folder is found first.
    (mirror / cifar.ARCHIVE).unlink()
    assert cifar.locate_cifar10(tmp_path / "data", download=False) == batches


def test_found_archive_is_verified_then_extracted_beside_it(tmp_path, monkeypatch):
    data = archive_of(BATCHES)
    serve(tmp_path, monkeypatch, data)
    place = tmp_path / "env" / "cifar10"
    place.mkdir(parents=True)
    (place / cifar.ARCHIVE).write_bytes(data)
    monkeypatch.setenv("FASTTRAIN_DATA", str(tmp_path / "env"))
    assert cifar.locate_cifar10(download=False) == place / cifar.BATCHES
    assert not (tmp_path / "cache").exists()


def test_read_only_root_extracts_into_the_download_folder(tmp_path, monkeypatch):
    data = archive_of(BATCHES)
    serve(tmp_path, monkeypatch, data)
    shared = tmp_path / "shared" / "cifar10"
    shared.mkdir(parents=True)
    (shared / cifar.ARCHIVE).write_bytes(data)
    monkeypatch.setenv("FASTTRAIN_DATA", str(tmp_path / "shared"))
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*args, dir=None, **kwargs):  # chmod is no guard when the tests run as root
        if Path(dir) == shared:
            raise PermissionError(13, "Permission denied")
        return real_mkdtemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    found = cifar.locate_cifar10(download=False)
    assert found == tmp_path / "cache" / "fasttrain" / "cifar10" / cifar.BATCHES
    assert tree(shared) == {cifar.ARCHIVE}


def test_user_extracted_folder_needs_no_archive(tmp_path, monkeypatch):
    batches = tmp_path / "data" / "cifar10" / cifar.BATCHES
    batches.mkdir(parents=True)
    for name, data in BATCHES.items():
        (batches / name).write_bytes(data)
    task = load_task("cifar10", tmp_path / "data", download=False)
    assert task.train_x.shape == (5 * RECORDS, 3, 32, 32) and task.source == str(batches)


def _member(name: str, kind: bytes, linkname: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, linkname, size
    return info


@pytest.mark.parametrize(
    ("hostile", "why"),
    [
        pytest.param(lambda t: _member("../evil", tarfile.REGTYPE, size=4), "'..'", id="parent"),
        pytest.param(
            lambda t: _member(f"{cifar.BATCHES}/../../evil", tarfile.REGTYPE, size=4),
            "'..'",
            id="nested-parent",
        ),
        pytest.param(
            lambda t: _member(str(t / "evil"), tarfile.REGTYPE, size=4), "absolute", id="absolute"
        ),
        pytest.param(
            lambda t: _member(f"{cifar.BATCHES}/evil", tarfile.SYMTYPE, linkname=str(t / "x")),
            "a link to",
            id="symlink",
        ),
        pytest.param(
            lambda t: _member(f"{cifar.BATCHES}/evil", tarfile.LNKTYPE, linkname="/etc/passwd"),
            "a link to",
            id="hardlink",
        ),
        pytest.param(
            lambda t: _member(f"{cifar.BATCHES}/evil", tarfile.CHRTYPE), "device", id="device"
        ),
    ],
)
def test_unsafe_archive_is_refused_whole(tmp_path, monkeypatch, hostile, why):
    member = hostile(tmp_path)
    serve(tmp_path, monkeypatch, archive_of(BATCHES, (member,)))
    with pytest.raises(UserError) as e:
        load_task("cifar10", tmp_path / "data")
    message = str(e.value)
    assert repr(member.name) in message and why in message and "\n" not in message
    # Nothing extracted, anywhere: the verified download alone is left.
    assert tree(tmp_path / "data") == {"cifar10", f"cifar10/{cifar.ARCHIVE}"}
    assert not [p for p in tmp_path.rglob("evil*")]


def test_truncated_batch_names_the_file(tmp_path, monkeypatch):
    short = {**BATCHES, "data_batch_3.bin": BATCHES["data_batch_3.bin"][:-1]}
    serve(tmp_path, monkeypatch, archive_of(short))
    with pytest.raises(UserError) as e:
        load_task("cifar10", tmp_path / "data")
    bad = tmp_path / "data" / "cifar10" / cifar.BATCHES / "data_batch_3.bin"
    assert str(bad) in str(e.value) and "3073-byte records" in str(e.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(batch_bytes(0, RECORDS + 1), "5 records, expected 4", id="count"),
        pytest.param(b"\x0a" + batch_bytes(0)[1:], "label 10 in record 0", id="label"),
    ],
)
def test_malformed_batch_names_the_file(tmp_path, data, message):
    path = tmp_path / "test_batch.bin"
    path.write_bytes(data)
    with pytest.raises(UserError, match=message) as e:
        cifar.read_batch(path)
    assert str(path) in str(e.value)


def test_archive_missing_a_batch_is_refused(tmp_path, monkeypatch):
    serve(tmp_path, monkeypatch, archive_of({k: v for k, v in BATCHES.items() if "5" not in k}))
    with pytest.raises(UserError, match=f"no {cifar.BATCHES}/data_batch_5.bin inside"):
        load_task("cifar10", tmp_path / "data")
    assert tree(tmp_path / "data" / "cifar10") == {cifar.ARCHIVE}


def test_corrupt_archive_is_user_error(tmp_path, monkeypatch):
    data = archive_of(BATCHES)
    serve(tmp_path, monkeypatch, data[: len(data) // 2])  # registered with the damaged hash
    with pytest.raises(UserError, match="corrupt archive.*download it again"):
        load_task("cifar10", tmp_path / "data")
    assert tree(tmp_path / "data" / "cifar10") == {cifar.ARCHIVE}


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def test_checksum_mismatch_of_local_archive_touches_nothing(tmp_path, monkeypatch):
    serve(tmp_path, monkeypatch, archive_of(BATCHES))
    place = tmp_path / "data" / "cifar10"
    place.mkdir(parents=True)
    (place / cifar.ARCHIVE).write_bytes(archive_of({}))
    (place / "notes.txt").write_text("mine")
    before = snapshot(place)
    with pytest.raises(UserError, match="sha256 is .*delete it to re-download") as e:
        load_task("cifar10", tmp_path / "data")
    assert str(place / cifar.ARCHIVE) in str(e.value)
    assert snapshot(place) == before and tree(place) == {cifar.ARCHIVE, "notes.txt"}


def test_checksum_mismatch_of_download_touches_nothing(tmp_path, monkeypatch):
    mirror = serve(tmp_path, monkeypatch, archive_of(BATCHES))
    (mirror / cifar.ARCHIVE).write_bytes(archive_of({}))  # the mirror now serves something else
    place = tmp_path / "data" / "cifar10"
    place.mkdir(parents=True)
    (place / "notes.txt").write_text("mine")
    before = snapshot(place)
    with pytest.raises(UserError, match=f"download failed: .*{cifar.ARCHIVE}: sha256 is"):
        load_task("cifar10", tmp_path / "data")
    assert snapshot(place) == before and tree(place) == {"notes.txt"}


def test_incomplete_folder_is_never_overwritten(tmp_path, monkeypatch):
    serve(tmp_path, monkeypatch, archive_of(BATCHES))
    batches = tmp_path / "data" / "cifar10" / cifar.BATCHES
    batches.mkdir(parents=True)
    (batches / "data_batch_1.bin").write_bytes(b"mine")
    with pytest.raises(UserError, match="lacks data_batch_2.bin; delete it to extract it again"):
        load_task("cifar10", tmp_path / "data")
    assert (
        tree(batches) == {"data_batch_1.bin"}
        and (batches / "data_batch_1.bin").read_bytes() == b"mine"
    )


def test_nothing_found_offline_lists_places(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTTRAIN_DATA", str(tmp_path / "env"))
    with pytest.raises(UserError) as e:
        load_task("cifar10", tmp_path / "data", download=False)
    message = str(e.value)
    for place in ("data/cifar10", "env/cifar10", "cache/fasttrain/cifar10"):
        assert str(tmp_path / place) in message
    assert cifar.ARCHIVE in message and "downloads are off" in message


def test_registered_archive_is_the_published_one():
    # tensorflow_datasets/url_checksums/cifar10.txt: this URL, 170052171 bytes, this sha256.
    assert cifar.SOURCE.mirrors == ("https://www.cs.toronto.edu/~kriz/",)
    assert cifar.SOURCE.files == {
        "cifar-10-binary.tar.gz": "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"
    }
