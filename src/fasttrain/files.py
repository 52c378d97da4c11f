"""Writing files so that nothing already on disk is ever lost or left half-written."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from fasttrain.errors import UserError


def _umask() -> int:
    """The process's umask (only readable by setting it: set it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, data: bytes | Callable[[BinaryIO], object]) -> None:
    """Write `data` (bytes, or a function that writes into the open file) to a temp file beside
    `path`, fsync, then rename: a crash or a full disk never leaves a half-written file, and an
    existing file is replaced only by a complete new one. Temp names start with '.' and end in
    '.tmp', so readers that look for final names never see them. The file gets the permissions
    `open()` would give it (mkstemp's are owner-only), so all files of a run read alike.

    A write that fails (full disk, no permission) is a one-line UserError naming the file; the
    file that was there before is untouched."""
    p = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".",
                                   prefix=f".{p.name}.", suffix=".tmp")
    except OSError as e:
        raise write_error(p, e) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise write_error(p, e) from None
        raise


def write_png(path: str | os.PathLike, fig, dpi: int = 110) -> None:
    """Render a matplotlib figure to `path` atomically and close it: the one PNG writer."""
    from io import BytesIO

    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    write_atomic(Path(path), buf.getvalue())


def write_error(p: Path, e: OSError) -> UserError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return UserError(f"cannot write {p}: the disk is full ({e.strerror}); free space and run "
                         f"again (complete files and checkpoints already there are kept)")
    return UserError(f"cannot write {p} ({e.strerror or e}); check the folder and its "
                     f"permissions (files already there are kept)")
