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


# -- CPU runs: the heaviest modules first --------------------------------------------------------

# Under pytest-xdist (`-n`, `--dist loadfile --no-loadscope-reorder` in pyproject) a worker takes
# the next whole module, in this order, whenever it has two tests or fewer left. The modules that
# take longest go first, so that what is handed out last is short and neither worker idles long
# at the end. xdist's own order (the modules of most tests first) hands out a module of few tests
# late whatever it costs: test_scaling.py (8 tests, 3 torchrun launches) 59th of 88,
# test_triton_fused.py (10 tests, a Triton-interpreter child) 50th. Replayed on each test's CPU
# time from a run of 2026-11-27 (tests/ with xdist's scheduling rule, 2 workers), xdist's order
# ended the workers 42 s apart, this one 7 s: a makespan 17 s shorter (an estimate). Every module
# of 10 s or more, heaviest first; seconds of CPU with children, per module, on a loaded 2-core
# EPYC (2026-11-27; the ladder's modules re-measured 2026-11-28 after v7e/v7f and the v8 probes:
# v7_math had grown from 12 s to 128 and, still handed out 19th, left one worker ~80 s alone at
# the end of a clean-clone CI run, 8:17 against 6:51 earlier that day). A module not named keeps
# its collected place after them.
HEAVY = (
    "tests/ladder/test_cuda_epoch.py",  # 128: every csrc/*.cu by nvcc (hopper_builds), sm_80 too
    "tests/ladder/test_cuda_epoch_v7_math.py",  # 128: nvcc; v7a-v7f's whole epochs on the host
    "tests/engine/test_steps.py",  # 56
    "tests/lab/test_scaling.py",  # 55: 3 torchrun launches
    "tests/engine/test_trainer.py",  # 47
    "tests/lab/test_plan.py",  # 43
    "tests/ladder/test_triton_fused.py",  # 57: a Triton-interpreter child
    "tests/ladder/test_cuda_epoch_v7_phases.py",  # 31: an sm_90a compile of both builds
    "tests/engine/test_early_stop_resume.py",  # 30
    "tests/lab/test_experiments.py",  # 30
    "tests/engine/test_rundir.py",  # 26
    "tests/engine/test_pipeline.py",  # 25: torchrun
    "tests/lab/test_memory.py",  # 22
    "tests/engine/test_graphed.py",  # 21
    "tests/lab/test_layouts.py",  # 21
    "tests/test_cli.py",  # 16
    "tests/lab/test_layout_choice.py",  # 15
    "tests/ladder/test_cpp_tiled.py",  # 15: g++
    "tests/test_input_pipeline_bench.py",  # 13
    "tests/ladder/test_v8_workers.py",  # 17: nvcc (host harness, sm_90a)
    "tests/ladder/test_v8_chain.py",  # 14: nvcc (host harness, sm_90a)
    "tests/ladder/test_lagged_gram.py",  # 13
    "tests/ladder/test_gram_v2.py",  # 13: nvcc
    "tests/ladder/test_v8_helpers.py",  # 11: nvcc
    "tests/ladder/test_cuda_epoch_v6_math.py",  # 10: nvcc
    "tests/models/test_models.py",  # 10
)


def run_order(nodeid: str, gpu: bool) -> tuple[int, int]:
    """A sort key: with a GPU, LAST's modules last (run_last); then HEAVY's in order, the others
    after them in the order they were collected (the sort is stable)."""
    path = nodeid.split("::")[0]
    return (run_last(nodeid) if gpu else 0,
            HEAVY.index(path) if path in HEAVY else len(HEAVY))


def pytest_collection_modifyitems(config, items):
    import torch

    gpu = torch.cuda.is_available()
    items.sort(key=lambda item: run_order(item.nodeid, gpu))


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
