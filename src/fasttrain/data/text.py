"""Character-level corpora: Tiny Shakespeare from a verified file, tokenized one id per character.

On disk: `<root>/tinyshakespeare/input.txt` (1,115,394 bytes, 65 distinct characters), found or
downloaded like every dataset (see sources.py). The vocabulary is the sorted set of the text's
characters, so token id i is `vocab[i]`; the first 90% of the ids train, the last 10% test.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fasttrain.data import sources
from fasttrain.errors import UserError

NAME = "tinyshakespeare"  # the folder under each data root
FILE = "input.txt"
TRAIN_FRACTION = 0.9

# sha256 from the SOURCE.txt of the project's shared data copy: karpathy/char-rnn at 6f9487a,
# data/tinyshakespeare/input.txt, unchanged since it was added in 370cbcd.
SOURCE = sources.Source(
    files={FILE: "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"},
    mirrors=("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/",),
)


def read_tinyshakespeare(
    data_dir: str | os.PathLike[str] | None = None, *, download: bool = True
) -> tuple[str, Path]:
    """The whole text, and the verified file it was read from."""
    path = sources.fetch_source(NAME, SOURCE, data_dir, download) / FILE
    try:
        return path.read_text(encoding="utf-8"), path
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}; check --data-dir") from None
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); delete it to re-download"
        ) from None


def char_tokens(text: str) -> tuple[np.ndarray, str]:
    """Token ids int64 [len(text)] and the vocabulary, the sorted characters of `text`."""
    vocab = "".join(sorted(set(text)))
    # Code points as a vector (UTF-32 is one uint32 per character), then their ranks in the
    # sorted vocabulary: ~20 ms for 1M characters instead of ~100 ms for a per-character dict.
    points = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    table = np.frombuffer(vocab.encode("utf-32-le"), np.uint32)
    return np.searchsorted(table, points).astype(np.int64), vocab


def check_block_size(block_size: int) -> None:
    if block_size < 1:
        raise UserError(
            f"block_size must be at least 1, got {block_size}; pass --block-size N >= 1"
        )


def split_tokens(ids: np.ndarray, block_size: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The first TRAIN_FRACTION of `ids` and the rest, each long enough for one training window.

    A window is block_size inputs and, shifted by one, block_size targets, drawn at a random start:
    a split needs more than block_size + 1 tokens. `what` names the corpus in errors.
    """
    check_block_size(block_size)
    cut = int(len(ids) * TRAIN_FRACTION)
    train, test = ids[:cut], ids[cut:]
    short, shortest = min(("train", len(train)), ("test", len(test)), key=lambda s: s[1])
    if shortest <= block_size + 1:
        fix = f"pass --block-size {shortest - 2} or less" if shortest > 2 else "use a longer text"
        raise UserError(
            f"block_size {block_size} is too large for {what}: its {short} split has {shortest} "
            f"tokens and needs more than block_size + 1; {fix}"
        )
    return train, test
