"""One error, every rank: a check that fails on some ranks fails on all, with the same line.

Under torchrun a bad `--out` is found by rank 0 alone (only it writes the run directory) and a
bad checkpoint may be found by any rank. If that rank simply raised, the others would walk into
the next collective and die there (a timeout, a broken pipe, a traceback). `together` runs the
check on every rank, then all ranks exchange their outcome (one all_gather, at a point every rank
reaches) and each raises the first rank's error: every rank prints the same one line, exits 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fasttrain.errors import UserError

T = TypeVar("T")


def together(world, check: Callable[..., T], *args, **kwargs) -> T:
    """`check(*args, **kwargs)` on this rank; a UserError on any rank is raised on every rank."""
    error, result = None, None
    try:
        result = check(*args, **kwargs)
    except UserError as e:
        error = str(e)
    if world.size > 1:
        error = next((e for e in world.gather(error) if e), None)
    if error is not None:
        if result is not None and hasattr(result, "close"):
            result.close()  # e.g. a claimed run directory: give its lock back
        raise UserError(error)
    return result
