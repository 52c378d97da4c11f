"""Claiming a run directory so that two runs never mix in it and a killed run never blocks it.

    claim = rundir.claim("runs/cnn", resume=False)   # raises UserError (one line) or holds it
    ...                                               # train, write, checkpoint
    claim.release()                                   # or let the process exit

Policy ("Never losing a run", README): one `--out` holds one run. Starting a run in a folder that
already holds one (a config, metrics, weights or a checkpoint) is refused unless `--resume` is
given: continue it with `--resume auto`, or choose a new `--out`. Nothing is renamed or numbered
behind the user's back, so the path a user typed is always the run they get.

What `claim` does, in this order, before anything is written:
  1. type checks: `--out` and each entry fasttrain writes must be of the kind it writes (a folder
     where a folder goes, a file where a file goes), or the run would fail hours later;
  2. lock: `fcntl.flock` on `OUT/.lock`. The kernel drops the lock when its holder dies (SIGKILL
     included), so a killed run never leaves the folder stuck, and a second live process is
     refused at once;
  3. reuse: a folder holding a run without `--resume` is refused (see above);
  4. clean-up, under the lock: temp files and folders of writes that were killed halfway
     (`.<name>.tmp`, `.step-N.old`) are removed — they are never complete, never resumed from;
  5. metrics.jsonl (on resume): a foreign or garbled file is refused before training starts; a
     torn last line (a kill or a full disk mid-append) is cut off.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from fasttrain.engine import metrics_log
from fasttrain.errors import UserError

LOCK = ".lock"
# What a run writes into OUT, and what kind of entry each is.
FILES = ("config.toml", "metrics.jsonl", "weights.safetensors", "loss.png", "model.json",
         "diverged.json")
FOLDERS = ("checkpoints", "tensorboard")


@dataclass
class Claim:
    """A run directory held by this process (the lock lives as long as `fd` is open)."""

    path: Path
    fd: int
    metrics_records: int  # complete records already in metrics.jsonl (0 for a new run)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the file drops the flock
            self.fd = -1


def claim(path: str | os.PathLike, resume: bool) -> Claim:
    """Check, lock and tidy `path` for a run; see the module docstring."""
    out = Path(path)
    check_types(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise UserError(f"--out {out}: cannot write there ({e.strerror or e}); choose another "
                        f"folder") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise UserError(f"--out {out} is in use by another fasttrain process (pid {holder}); "
                        f"wait for it to end, or choose another --out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the message above, in the other process
    try:
        # After the lock: a folder in use says so, rather than "holds a run".
        if not resume and holds_run(out):
            raise UserError(f"--out {out} already holds a run; continue it with --resume auto "
                            f"(resume='auto' from Python), or choose a new --out (fasttrain "
                            f"never mixes two runs in a folder)")
        remove_stale_temps(out)
        records = metrics_log.prepare(out / "metrics.jsonl") if resume else 0
    except BaseException:
        os.close(fd)
        raise
    return Claim(out, fd, records)


def check_types(out: Path) -> None:
    """`out` and the entries a run writes there must be of the kind fasttrain writes."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder; choose a folder (new or one "
                        f"holding a run)")
    for name in FILES:
        if (out / name).is_dir():
            raise UserError(f"--out {out}: {name} is a folder where the run writes a file; move "
                            f"it away or choose another --out")
    for name in FOLDERS:
        p = out / name
        if p.exists() and not p.is_dir():
            raise UserError(f"--out {out}: {name} is a file where the run keeps a folder; move "
                            f"it away or choose another --out")


def holds_run(out: Path) -> bool:
    """Does `out` hold (part of) a run: anything fasttrain writes, or a checkpoint?"""
    if not out.is_dir():
        return False
    if any((out / name).exists() for name in FILES):
        return True
    ckpts = out / "checkpoints"
    return ckpts.is_dir() and any(p.name.startswith("step-") for p in ckpts.iterdir())


def remove_stale_temps(out: Path) -> list[Path]:
    """Delete what killed writes left behind: `.NAME.tmp` files (files.write_atomic), sharded
    `.step-N.tmp/` and `.step-N.old/` folders (checkpoint.save_sharded). Only under the lock:
    a live writer's temp files are never touched."""
    removed = []
    for folder in (out, out / "checkpoints"):
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if p.name.startswith(".") and p.name.endswith((".tmp", ".old")):
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
    return removed
