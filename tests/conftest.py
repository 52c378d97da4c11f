import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

# One OpenMP thread per process: pytest's own torch and every process a test starts (torchrun
# already gives its workers one). Set before torch is imported (OpenMP reads it as it loads); a
# value already set is kept. Two threads on tiny ops spin at OpenMP's barrier whenever a
# neighbour holds a core: on this 2-core machine, busy (load ~8), 12 steps of a test's cnn
# took 40-48 s wall and 11.5-12.7 s CPU with 2 threads, 4.5 s and 0.9 s with 1; a 20-step gpt
# `fasttrain train` 71-107 s and 17-23 s CPU, against 30-38 s and 5.3-5.7 s. The results do not
# depend on it beyond rounding: a comparison of runs is made between processes of one setting,
# or allows the rounding of another layout's sums (torchrun's workers ran with 1 already).
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): its pool is already sized
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def tiny_images(n_train=150, n_test=50, seed=0, name="tiny"):
    """A small learnable MNIST-shaped dataset made here (tests never need the real files)."""
    rng = np.random.default_rng(seed)
    protos = rng.integers(0, 256, size=(10, 28, 28))
    def split(n):
        y = rng.integers(0, 10, size=n).astype(np.uint8)
        noise = rng.integers(-60, 61, size=(n, 28, 28))
        return np.clip(protos[y] + noise, 0, 255).astype(np.uint8), y
    (train_x, train_y), (test_x, test_y) = split(n_train), split(n_test)
    return SimpleNamespace(name=name, train_x=train_x, train_y=train_y, test_x=test_x,
                           test_y=test_y, num_classes=10, source="tests", synthetic=True)


@pytest.fixture
def tiny():
    return tiny_images()


# The build cache of the ladder's CUDA and C++ rows (ladder/build.py: ~/.cache/fasttrain/cuda and
# cpp) is shared with the user on purpose. It is keyed by source, local headers, flags, arch and
# compiler version and written under a file lock, so a test never loads a stale or foreign
# library; scripts/gpu-check's gpu-tests step reuses the libraries its bench step has just built
# (a private cache would rebuild them with nvcc inside that step's 300 s: the four sources for
# sm_90a took 52 s cold, ms warm, on a loaded 2-core CPU; cpu_epoch.cpp 3 s with g++). The tests
# of the cache itself build into tmp_path (out_dir=).
# XDG_CACHE_HOME stays too: it also moves the datasets' cache (data/sources.py).


def real_data_dir() -> Path | None:
    d = os.environ.get("FASTTRAIN_DATA")
    return Path(d) if d and (Path(d) / "mnist").is_dir() else None


requires_mnist = pytest.mark.skipif(
    real_data_dir() is None, reason="set FASTTRAIN_DATA to a folder holding mnist/ to run"
)


def run_cli(capsys, *argv):
    """Run `fasttrain ARGV` in-process; returns (exit code, stdout, stderr)."""
    from fasttrain.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *words):
    """Bad input: exit status 2 and exactly one `error: ...` line naming each of `words`."""
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def import_benchmark(name: str):
    """A script of benchmarks/ as a module, its imports resolved as when it runs as a script
    (its sibling modules on the path while it loads)."""
    import importlib
    import sys

    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))



# -- GPU runs: a sticky CUDA fault costs no other test its result ------------------------------

# The tests of hand-written kernels run last, the cluster kernel's the very last: a kernel fault
# (an illegal address, a trap) is sticky, failing every later CUDA call of the process.
LAST = ("tests/ladder/test_cuda_rungs.py", "tests/ladder/test_cuda_epoch.py")


def run_last(nodeid: str) -> int:
    """0 for most tests; 1, 2, ... for LAST's modules, in that order (a sort key)."""
    path = nodeid.split("::")[0]
    return LAST.index(path) + 1 if path in LAST else 0


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: run_last(item.nodeid))  # stable: the others keep their order


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """After a GPU test fails, stop the session if the device is lost (the bench's probe): the
    tests after it would each fail with its error."""
    report = (yield).get_result()
    if report.failed and item.get_closest_marker("gpu") is not None:
        import torch

        from fasttrain.bench import device_usable

        if torch.cuda.is_available() and not device_usable("cuda"):
            item.session.shouldstop = (f"{item.nodeid} left the CUDA context unusable (a "
                                       f"sticky fault): the GPU tests after it were not run")


@pytest.fixture(scope="session")
def shared(request, tmp_path_factory):
    """The session's shared launches (tests/engine/launch.py's Part): one per process count, of
    the commands of every module collected that declares a part (tests/engine and tests/lab)."""
    from tests.engine.launch import Shared

    modules = {item.module.__name__ for item in request.session.items
               if getattr(item, "module", None) is not None}
    return Shared(tmp_path_factory.mktemp("shared"), modules)
