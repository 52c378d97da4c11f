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


def compile_sm90(src: Path, out_dir: Path) -> tuple[str, Path]:
    """`nvcc -O3 -std=c++17 -arch=sm_90a -cubin -Xptxas -v` of `src` (a .cu, its includes from
    csrc/): ptxas's report and the cubin. Skips the test without nvcc, fails it with nvcc's own
    message when the source does not compile."""
    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found on PATH")
    cubin = out_dir / (Path(src).stem + ".cubin")
    done = subprocess.run([nvcc, "-O3", "-std=c++17", "-arch=sm_90a", "-cubin", "-Xptxas", "-v",
                           f"-I{build.CSRC}", str(src), "-o", str(cubin)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr, cubin


def registers(report: str, kernel: str) -> list[int]:
    """The registers of every function whose mangled name matches the regex `kernel` in ptxas's
    `report`; fails the test if one of them has a stack frame or spills."""
    import re

    found = re.findall(rf"Function properties for \w*{kernel}\w*\n\s*(\d+) bytes stack frame, "
                       rf"(\d+) bytes spill stores, (\d+) bytes spill loads\n.*?Used (\d+) "
                       rf"registers", report, re.S)
    assert found, f"no function matching {kernel!r} in ptxas's report"
    for stack, stores, loads, _ in found:
        assert (stack, stores, loads) == ("0", "0", "0"), (kernel, report[-3000:])
    return [int(regs) for *_, regs in found]


def sass_functions(cubin: Path) -> dict[str, str]:
    """The cubin's SASS by function, mangled name → body, from Triton's cuobjdump; skips the test
    where Triton (or its cuobjdump) is missing."""
    import re

    try:
        import triton
    except ImportError:
        pytest.skip("no Triton, so no cuobjdump to read the SASS")
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip(f"this Triton has no {cuobjdump}")
    sass = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True,
                          text=True).stdout
    return {body.split("\n")[0].strip(): body for body in re.split(r"\n\s*Function : ", sass)[1:]}
