"""The CPU tests of the cluster kernel's arithmetic (v5's tensor-core tiles, v6's register
tiles): a harness under tests/ladder/csrc/ that includes the kernel's own headers, compiled by
nvcc for the host into a shared library the test calls through ctypes."""

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from fasttrain.ladder import build

ROOT = Path(__file__).resolve().parents[2]


def compile_harness(harness: str, out_dir: Path) -> ctypes.CDLL:
    """`harness` (a path from the repository root) built for the host and loaded; skips the test
    without nvcc, fails it with nvcc's own message when the harness does not compile."""
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found on PATH")
    so = out_dir / (Path(harness).stem + ".so")
    cmd = [nvcc, "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC", f"-I{build.CSRC}",
           str(ROOT / harness), "-o", str(so)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return ctypes.CDLL(str(so))


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    """A C-contiguous array's data, for the harness's pointer arguments."""
    assert a.flags.c_contiguous
    return ctypes.c_void_p(a.ctypes.data)
