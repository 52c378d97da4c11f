"""metrics.jsonl kept honest across kills and resumes: each record once, never a torn line.

A run appends one JSON object per line ("train" at log steps, "eval" per epoch). Appends are not
atomic: a kill or a full disk can leave the last line cut short, and a resumed run repeats the
steps after its checkpoint. So, before a resumed run writes anything:
  - `prepare` checks every line is a fasttrain record (a foreign or garbled file is refused with
    one line, before any training) and cuts a torn last line off;
  - `truncate` keeps exactly the records the checkpoint had seen (the checkpoint stores their
    count); records past it — or, for a checkpoint without the count, past its step — go.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fasttrain.errors import UserError

KINDS = ("train", "eval")


def _is_record(line: bytes) -> bool:
    try:
        r = json.loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return False
    return (isinstance(r, dict) and r.get("kind") in KINDS and isinstance(r.get("step"), int)
            and not isinstance(r.get("step"), bool))


def _lines(path: Path) -> list[bytes]:
    try:
        return path.read_bytes().splitlines(keepends=True)
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror or e}); check its "
                        f"permissions") from None


def prepare(path: Path) -> int:
    """Validate `path` (if it exists), cut a torn last line off; the number of records in it."""
    if not path.exists():
        return 0
    lines = _lines(path)
    torn = bool(lines) and not lines[-1].endswith(b"\n") and not _is_record(lines[-1])
    if torn:
        lines = lines[:-1]
    for i, line in enumerate(lines, 1):
        if not _is_record(line):
            raise UserError(f"{path} line {i} is not a fasttrain metrics record; move the file "
                            f"away (it is not this run's) or start a new --out")
    if torn:
        _rewrite(path, lines)
    return len(lines)


def truncate(path: Path, records: int | None, step: int) -> int:
    """Keep the first `records` records (all if None), then drop any past `step`; returns how
    many remain. Run after `prepare`, so every line parses."""
    if not path.exists():
        return 0
    lines = _lines(path)
    kept = lines[:records] if records is not None else lines
    kept = [line for line in kept if json.loads(line)["step"] <= step]
    if len(kept) != len(lines):
        _rewrite(path, kept)
    return len(kept)


def _rewrite(path: Path, lines: list[bytes]) -> None:
    from fasttrain.files import write_atomic

    mode = path.stat().st_mode & 0o777
    write_atomic(path, b"".join(lines))
    os.chmod(path, mode)
