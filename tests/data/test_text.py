"""Tiny Shakespeare offline: a tiny text served from a file:// mirror with its sha256 patched in;
one test reads the real file when $FASTTRAIN_DATA holds tinyshakespeare/."""

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fasttrain.data import load_task, sources, text
from fasttrain.errors import UserError

# Read before the autouse fixture below clears it for every test.
REAL_DATA = os.environ.get("FASTTRAIN_DATA")

CORPUS = "To be, or not to be: that is the question.\n" * 10  # 430 characters, 18 distinct


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """No test may see the user's cache or data, or write outside tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FASTTRAIN_DATA", raising=False)


def serve(tmp_path: Path, monkeypatch, data: bytes) -> Path:
    """`data` as input.txt of the only mirror, registered with its sha256."""
    mirror = tmp_path / "mirror"
    mirror.mkdir(exist_ok=True)
    (mirror / text.FILE).write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    monkeypatch.setattr(
        text, "SOURCE", sources.Source({text.FILE: digest}, (mirror.as_uri() + "/",))
    )
    return mirror


def test_download_vocab_and_split(tmp_path, monkeypatch):
    serve(tmp_path, monkeypatch, CORPUS.encode())
    task = load_task("tinyshakespeare", tmp_path / "data", block_size=8)
    path = tmp_path / "data" / "tinyshakespeare" / text.FILE
    assert path.read_text() == CORPUS and task.source == str(path)
    assert task.vocab == "".join(sorted(set(CORPUS))) and task.num_classes == len(task.vocab) == 18
    assert task.kind == "language" and task.in_shape == (8,) and not task.synthetic
    assert task.train_y is None and task.test_y is None
    assert task.train_x.dtype == task.test_x.dtype == torch.int64
    assert len(task.train_x) == 387 and len(task.test_x) == 43  # int(430 * 0.9), the rest
    decoded = "".join(task.vocab[i] for i in torch.cat([task.train_x, task.test_x]).tolist())
    assert decoded == CORPUS


def test_char_tokens_handles_any_unicode():
    ids, vocab = text.char_tokens("héllo wörld ✓")
    assert vocab == "".join(sorted(set("héllo wörld ✓")))
    assert "".join(vocab[i] for i in ids) == "héllo wörld ✓" and ids.dtype == np.int64


def test_block_size_must_fit_both_splits(tmp_path, monkeypatch):
    serve(tmp_path, monkeypatch, CORPUS.encode())
    # The test split is the shorter one: 43 tokens hold a window of 41 inputs + 1 shifted target.
    assert load_task("tinyshakespeare", tmp_path / "data", block_size=41).in_shape == (41,)
    with pytest.raises(UserError, match="test split has 43 tokens .* pass --block-size 41 or less"):
        load_task("tinyshakespeare", tmp_path / "data", block_size=42)


def test_block_size_zero_fails_before_any_download(tmp_path, monkeypatch):
    serve(tmp_path, monkeypatch, CORPUS.encode())
    with pytest.raises(UserError, match="block_size must be at least 1, got 0; pass --block-size"):
        load_task("tinyshakespeare", tmp_path / "data", block_size=0)
    assert not (tmp_path / "data").exists()


def test_checksum_mismatch_of_local_file_touches_nothing(tmp_path, monkeypatch):
    serve(tmp_path, monkeypatch, CORPUS.encode())
    place = tmp_path / "data" / "tinyshakespeare"
    place.mkdir(parents=True)
    (place / text.FILE).write_text("something else")
    with pytest.raises(UserError, match="sha256 is .*delete it to re-download") as e:
        load_task("tinyshakespeare", tmp_path / "data")
    assert str(place / text.FILE) in str(e.value)
    assert (place / text.FILE).read_text() == "something else"


def test_not_utf8_names_the_file(tmp_path, monkeypatch):
    serve(tmp_path, monkeypatch, b"caf\xe9 " * 100)  # Latin-1, registered with its own hash
    with pytest.raises(UserError, match="not UTF-8 text") as e:
        load_task("tinyshakespeare", tmp_path / "data")
    assert str(tmp_path / "data" / "tinyshakespeare" / text.FILE) in str(e.value)


def test_offline_and_missing_lists_places(tmp_path):
    with pytest.raises(UserError, match="tinyshakespeare.*downloads are off.*input.txt"):
        load_task("tinyshakespeare", tmp_path / "data", download=False)


@pytest.mark.skipif(
    not REAL_DATA or not (Path(REAL_DATA) / "tinyshakespeare").is_dir(),
    reason="set FASTTRAIN_DATA to a folder holding tinyshakespeare/ to test the real file",
)
def test_real_tinyshakespeare(monkeypatch):
    monkeypatch.setenv("FASTTRAIN_DATA", REAL_DATA)
    task = load_task("tinyshakespeare", download=False)  # sha256 checked against the registry
    assert task.num_classes == len(task.vocab) == 65
    assert len(task.train_x) == 1_003_854 and len(task.test_x) == 111_540  # 1,115,394 characters
    assert task.source == str(Path(REAL_DATA) / "tinyshakespeare" / text.FILE)
