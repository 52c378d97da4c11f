"""The CUDA C++ rungs (cuda_rungs.py): their place in the ladder and their reasons on any machine;
on a GPU, that the no-sync rungs make no host sync inside an epoch, that graph replay equals stream
launches and that the baseline's host-side figures equal the device-side ones.

Their correctness against float64 autograd (one step, partial batches), memorization and full
MNIST accuracy within 0.5 points of numpy-cpu are the ladder-wide tests in test_ladder.py, which
run every registered row (these skip there without a GPU)."""

import json

import numpy as np
import pytest
import torch

from fasttrain import ladder
from fasttrain.ladder import build, cuda_rungs
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import run_cli, tiny_images

ROWS = ["cuda-baseline", "+no-sync", "+cublas", "+report-10", "+fused-loss", "+cudnn-softmax",
        "+cuda-graphs"]


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")(test))


def test_rows_are_the_reports_order_after_its_other_rows():
    names = list(ladder.NAMES)
    i = names.index("cuda-baseline")
    assert names[i : i + len(ROWS)] == ROWS
    assert names.index("torch-optimized") < i < names.index("numba-fused")
    assert all(ladder.entry(n).load().name == n for n in ROWS)


def test_without_gpu_every_row_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ROWS:
        reason = ladder.entry(name).load().unavailable({}, LadderConfig())
        assert reason and "no CUDA GPU" in reason, (name, reason)


def test_without_toolchain_every_row_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    for name in ROWS:
        reason = ladder.entry(name).load().unavailable({}, LadderConfig())
        assert reason and "nvcc not found" in reason, (name, reason)


def test_bench_lists_unavailable_rows_and_exits_0(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "r.json"
    # A leading '+' is a plain value to argparse: `--impl +cublas` needs no quoting or '='.
    code, stdout, _ = run_cli(capsys, "bench", "--impl", "+cublas", "--data", "synthetic",
                              "--epochs", "1", "--no-progress", "--json", str(out))
    assert code == 0
    code, stdout, _ = run_cli(capsys, "bench", "--impl", ",".join(ROWS), "--data", "synthetic",
                              "--epochs", "1", "--no-progress", "--json", str(out))
    assert code == 0 and "cuda-baseline" in stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["impl"] for r in rows] == ROWS
    assert all(r["status"] == "unavailable" and "no CUDA GPU" in r["reason"] for r in rows)


# ---- on a GPU --------------------------------------------------------------------------------


def _setup(name, data, cfg):
    impl = ladder.entry(name).create("cuda")
    reason = impl.unavailable({}, cfg)
    if reason:
        pytest.skip(reason)
    impl.setup(data, cfg)
    return impl


def _host_syncs(fn):
    """(host waits, device→host copies) while fn() runs, as CUDA's profiler (CUPTI) sees them:
    the runtime calls of the ctypes-loaded library included, since it shares torch's cudart.
    Waits are counted inside fn's own time range only: the profiler synchronizes on exit."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("under_test"):
            result = fn()
        torch.cuda.synchronize()  # every device event of fn is collected
    events = prof.events()
    window = next(e.time_range for e in events if e.name == "under_test")
    waits = sum(e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                           "cudaEventSynchronize", "cudaMemcpy")
                and window.start <= e.time_range.start <= window.end for e in events)
    dtoh = sum("DtoH" in e.name or "Device -> Pageable" in e.name for e in events)
    return result, waits, dtoh


@pytest.mark.parametrize("name", ROWS)
@gpu
def test_host_syncs_inside_an_epoch(name):
    # 150 samples at batch 64: 3 steps an epoch; epoch 1 reports for every-epoch rows, not for
    # the report-every-10 ones.
    cfg = LadderConfig(epochs=12, batch_size=64)
    impl = _setup(name, make_ladder_data(tiny_images(n_train=150), cfg), cfg)
    impl.train_epoch(0)  # warm-up: lazy module loading, cuBLAS heuristics
    loss, waits, dtoh = _host_syncs(lambda: impl.train_epoch(1))
    if name == "cuda-baseline":  # the control: the profiler does see the library's own syncs
        assert waits >= 3 and dtoh >= 3, (waits, dtoh)
    elif impl.report_every == 1:
        assert loss is not None and waits <= 1 and dtoh <= 1, (waits, dtoh)  # the epoch's read
    else:
        assert loss is None and waits == 0 and dtoh == 0, (waits, dtoh)


@gpu
def test_graph_replay_equals_stream_launches():
    cfg = LadderConfig(epochs=3, batch_size=64)
    data = make_ladder_data(tiny_images(n_train=150), cfg)
    a, b = _setup("+cudnn-softmax", data, cfg), _setup("+cuda-graphs", data, cfg)
    la = [a.train_epoch(e) for e in range(3)]
    lb = [b.train_epoch(e) for e in range(3)]
    # The same kernels in the same order; cuBLAS may pick another algorithm under capture, so
    # equal to float32 rounding rather than bitwise.
    for x, y in zip(a.params(), b.params(), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
    assert lb[-1] == pytest.approx(la[-1], rel=1e-6)


@gpu
def test_baseline_host_figures_equal_device_figures():
    cfg = LadderConfig(epochs=2, batch_size=64)
    data = make_ladder_data(tiny_images(n_train=150), cfg)
    a, b = _setup("cuda-baseline", data, cfg), _setup("+no-sync", data, cfg)
    for e in range(2):
        assert a.train_epoch(e) == pytest.approx(b.train_epoch(e), rel=1e-9)
        assert a.train_accuracy == b.train_accuracy
    for x, y in zip(a.params(), b.params(), strict=True):
        np.testing.assert_array_equal(x, y)


@gpu
def test_report_10_reads_the_loss_every_10_epochs_and_last():
    cfg = LadderConfig(epochs=12, batch_size=64)
    impl = _setup("+report-10", make_ladder_data(tiny_images(n_train=150), cfg), cfg)
    losses = [impl.train_epoch(e) for e in range(12)]
    assert [i for i, x in enumerate(losses) if x is not None] == [9, 11]
    assert 0 < losses[11] < losses[9] < 2.5


def test_flags_are_cumulative():
    rows = [ladder.entry(n).load() for n in ROWS]
    assert [r.sync_every_step for r in rows] == [True] + [False] * 6
    assert [r.libs for r in rows][2:] == ([("cublasLt",)] * 3
                                          + [("cublasLt", "cudnn")] * 2)
    assert [r.report_every for r in rows] == [1, 1, 1, 10, 10, 10, 10]
    assert [r.fused_loss for r in rows] == [False] * 4 + [True] * 3
    assert [r.graphs for r in rows] == [False] * 6 + [True]
    assert issubclass(rows[-1], cuda_rungs.CudaRung)


def test_sources_name_every_file_the_library_is_built_from():
    from fasttrain.ladder import build

    for name in ROWS:
        cls = ladder.entry(name).load()
        src = build.CSRC / cls.source
        built = {src, *build.local_headers(src)}
        assert {(build.CSRC.parent / f).resolve() for f in cls.sources} == built, name


def test_cublas_families_export_their_gemm_choice_and_it_reads_back():
    """The row's details name each GEMM's timed algorithm: every family that links cublasLt
    exports ft_gemm_choice, whose 16 floats read as (µs, k splits, algorithm, tile) per GEMM and
    batch, in cublas_gemms_choice's order."""
    from fasttrain.ladder import build
    from fasttrain.ladder.cuda_rungs import gemm_choice

    for name in ROWS:
        cls = ladder.entry(name).load()
        text = (build.CSRC / cls.source).read_text()
        assert ("FT_EXPORT_GEMM_CHOICE" in text) == ("cublasLt" in cls.libs), name
    got = gemm_choice([float(v) for v in range(16)])
    assert list(got) == ["forward_full_batch", "forward_last_batch", "update_full_batch",
                         "update_last_batch"]
    assert got["forward_full_batch"] == {"us": 0.0, "split_k": 1, "algo_id": 2, "tile_id": 3}
    assert got["update_last_batch"] == {"us": 12.0, "split_k": 13, "algo_id": 14, "tile_id": 15}
