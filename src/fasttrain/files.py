"""Writing files so that nothing already on disk is ever lost or left half-written."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(path: str | os.PathLike, data: bytes | Callable[[BinaryIO], object]) -> None:
    """Write `data` (bytes, or a function that writes into the open file) to a temp file beside
    `path`, fsync, then rename: a crash or a full disk never leaves a half-written file, and an
    existing file is replaced only by a complete new one. Temp names start with '.' and end in
    '.tmp', so readers that look for final names never see them."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent if str(p.parent) else ".", prefix=f".{p.name}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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
