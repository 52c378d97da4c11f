"""What the GPU tests share: the skip, in-process CLI runs, and counting host–device syncs.

The tests drive fasttrain through its command line (`fasttrain.cli.main`, in this process, so
that CUDA's sync debug mode and the allocator's statistics can be read around a run) and check
what it writes (metrics.jsonl, --json results): they do not depend on the engine's internals.
Without CUDA every test skips with the reason; the default CPU run is unchanged.
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch


def why_no_cuda() -> str:
    build = (f"torch {torch.__version__} is built with CUDA {torch.version.cuda} but sees no GPU"
             if torch.version.cuda else f"torch {torch.__version__} is a CPU-only build")
    return f"CUDA not available: {build} (these tests need an NVIDIA GPU)"


HAS_CUDA = torch.cuda.is_available()
# Every GPU test module sets `pytestmark = GPU`.
GPU = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason=why_no_cuda())]


def cli(*argv) -> int:
    """`fasttrain ARGV` in this process; returns its exit status."""
    from fasttrain.cli import main

    return main([str(a) for a in argv])


def train(out: Path, *flags) -> list[dict]:
    """`fasttrain train --out OUT FLAGS`; returns the records of OUT/metrics.jsonl."""
    code = cli("train", "--out", out, "--no-progress", *flags)
    assert code == 0, f"fasttrain train {' '.join(map(str, flags))} exited {code}"
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


@dataclass
class Syncs:
    """Synchronizing CUDA calls seen while `counting_syncs()` was open, by file:line."""

    sites: Counter = field(default_factory=Counter)

    @property
    def count(self) -> int:
        return sum(self.sites.values())

    def __str__(self) -> str:
        return ", ".join(f"{where} ×{n}" for where, n in self.sites.most_common(8)) or "none"


@contextlib.contextmanager
def counting_syncs():
    """Count every host–device synchronization torch makes while open, with CUDA's sync debug
    mode: each one (`.item()`, a blocking copy, a stream sync, GradScaler's inf check, ...) emits
    a warning "called a synchronizing CUDA operation", which is recorded here with the Python line
    it came from. Warnings from the autograd engine's threads are replayed on the calling thread,
    so backward's syncs are seen as well. An explicit `torch.cuda.synchronize()` (a device sync,
    which the debug mode does not report) is counted by wrapping it."""
    syncs = Syncs()
    previous = torch.cuda.get_sync_debug_mode()
    original = torch.cuda.synchronize

    def synchronize(*args, **kwargs):
        caller = sys._getframe(1)
        syncs.sites[f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"] += 1
        return original(*args, **kwargs)

    torch.cuda.synchronize = synchronize
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # every occurrence, not once per line
            yield syncs
    finally:
        torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.synchronize = original
    for w in caught:
        if "synchroniz" in str(w.message):
            syncs.sites[f"{Path(w.filename).name}:{w.lineno}"] += 1
