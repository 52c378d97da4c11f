"""Ranks that agree: one error on every rank, and one end to a pass of a stream without length.

Under torchrun a bad `--out` is found by rank 0 alone (only it writes the run directory) and a
bad checkpoint may be found by any rank. If that rank simply raised, the others would walk into
the next collective and die there (a timeout, a broken pipe, a traceback). `together` runs the
check on every rank, then all ranks exchange their outcome (one all_gather, at a point every rank
reaches) and each raises the first rank's error: every rank prints the same one line, exits 2.

A stream without length is dealt over the ranks, and their shares may end at different steps
(a stream dealt by skipping, one split by files of different sizes); every step is a
collective, so a rank that ran out would leave the others waiting in it. `steps_together` hands
out this rank's micro-batches a step at a time, after every rank has said how many it has for
that step (one all_gather of an int, on the host: a gloo group, made by `int_gather`, apart from
an NCCL run's own), and ends the pass on every rank at the first step some rank cannot fill:
each pass then ends on every rank at the same step, and the run's epochs are the ranks' passes,
as in one process. The ranks with items left drop them for that pass (the shortest share sets
its length, as drop_last does for the last batch).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

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


def int_gather(world) -> Callable[[int], list[int]]:
    """A gather of one int from every rank of `world`, on the host: no device sync. Under NCCL
    on a gloo group of its own, made here: a collective every rank must reach at one point."""
    import torch
    import torch.distributed as dist

    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    out = [torch.zeros((), dtype=torch.int64) for _ in range(world.size)]

    def gather(n: int) -> list[int]:
        dist.all_gather(out, torch.tensor(n, dtype=torch.int64), group=group)
        return [int(t) for t in out]

    return gather


def steps_together(micro_batches: Iterator[Any], per_step: int,
                   gather: Callable[[int], list[int]],
                   short: Callable[[list[int]], Exception] | None = None) -> Iterator[Any]:
    """`micro_batches` a step (`per_step` of them) at a time while every rank has a whole step
    (`gather`: every rank's count). `short`: the error for a pass some rank cannot start (its
    first step short on some rank: every rank raises it, from the same counts)."""
    first = short is not None
    while True:
        step = list(itertools.islice(micro_batches, per_step))
        counts = gather(len(step))
        if min(counts) < per_step:
            if first:
                raise short(counts)
            return
        first = False
        yield from step
