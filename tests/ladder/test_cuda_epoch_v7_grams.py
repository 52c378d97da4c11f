"""cuda-epoch v7's Gram launch alone (`EpochKernel.v7_grams`, csrc/cuda_epoch.cu's
cuda_epoch_v7_grams): on the CPU, the library's Gram versions against `cuda_epoch`'s, the Python
side and sync_cost.py's "v7 Grams" figures with the library faked at the ctypes boundary
(`FakeV7Grams` writes what a Gram kernel would, or, planted, one entry off); on a GPU (marked gpu;
Gram kernel v2 is written without a GPU and these have not yet run): v2's Grams equal v1's bit for
bit and the exact ones on an MNIST-sized epoch (469 steps, a last batch of 96)."""

import ctypes

import numpy as np
import pytest
import torch

from fasttrain.ladder import build
from fasttrain.ladder import cuda_epoch as ce
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import import_benchmark, tiny_images
from tests.ladder import lagged_reference as ref

requires_nvcc = pytest.mark.skipif(build.find_nvcc() is None, reason="nvcc not found on PATH")
requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@requires_nvcc
def test_the_library_has_the_gram_versions_python_names(hopper_builds):
    try:
        lib = ctypes.CDLL(str(hopper_builds["cuda_epoch.cu"]))
    except OSError as e:
        pytest.skip(f"cannot load the library without a CUDA runtime: {e}")
    versions, count = (ctypes.c_int * 8)(), ctypes.c_int()
    epoch_version = lib.cuda_epoch_v7_gram_versions(versions, ctypes.byref(count))
    assert tuple(versions[:count.value]) == ce.V7_GRAM_VERSIONS == (1, 2)
    assert epoch_version == ce.V7_GRAM_VERSION == 2
    # Bad arguments are refused before anything reaches a GPU (1: cudaErrorInvalidValue).
    p = ctypes.c_void_p
    lib.cuda_epoch_v7_grams.argtypes = [p, p, p, ctypes.c_int, ctypes.c_int, ctypes.c_float, p,
                                        p, p, p, ctypes.c_int, p]
    dummy = p(16)
    for n, batch, scratch in ((1, 0, dummy), (1, 129, dummy), (0, 128, dummy), (1, 128, None)):
        assert lib.cuda_epoch_v7_grams(dummy, dummy, dummy, n, batch, 0.1, dummy, dummy, dummy,
                                       scratch, 2, None) == 1


class FakeV7Grams:
    """The library at the ctypes boundary: cuda_epoch_v7_grams writes, for each Gram kernel,
    Γ_{t,j}[i][m] = t + j + i + m at v7_gram_offset (scratch float 64 on), or fails with `code`;
    `off_by_one` (a planted bug): v2 writes entry (1, 1, 0, 0) one more."""

    def __init__(self, steps, code=0, off_by_one=False):
        self.steps, self.code, self.off_by_one, self.calls = steps, code, off_by_one, []

    def cuda_epoch_v7_grams(self, x, y, order, n, bs, lr, w, b, stats, scratch, version, stream):
        self.calls.append((n, bs, scratch.value, version))
        if self.code:
            return self.code
        size = self.steps * 4 * 128 * 128
        view = (ctypes.c_float * (64 + size)).from_address(scratch.value)
        grams = np.frombuffer(view, dtype=np.float32)[64:].reshape(self.steps, 4, 128, 128)
        t, j, i, m = np.ogrid[:self.steps, 1:5, :128, :128]
        grams[:] = t + j + i + m
        if self.off_by_one and version == 2:
            grams[1, 0, 0, 0] += 1
        return 0

    def cuda_epoch_error_name(self, code):
        return b"cudaErrorFake"


def fake_kernel(lib, monkeypatch, n=150, bs=16, epochs=3):
    """An EpochKernel of version 7 on CPU tensors, as __init__ would leave it."""
    monkeypatch.setattr(ce, "stream_handle", lambda: None)
    k = object.__new__(ce.EpochKernel)
    k.lib, k.version, k.cluster, k.ctas, k.n = lib, 7, True, ce.V7_CTAS, n
    k.v7_variant, k.v7_grams_by = "a", "kernel"
    k.cfg = LadderConfig(batch_size=bs, epochs=epochs)
    k.x, k.y = torch.zeros(n, 784, dtype=torch.uint8), torch.zeros(n, dtype=torch.int32)
    k.orders = torch.zeros(epochs, n, dtype=torch.int32)
    k.w, k.b, k.stats = torch.ones(10, 784), torch.ones(10), torch.zeros(2)
    steps = -(-n // bs)
    k.scratch = torch.zeros(64 + steps * 4 * 128 * 128 + 100)  # and G, partials: not touched
    return k


def test_v7_grams_launches_only_the_grams_of_the_kernel_asked(monkeypatch):
    lib = FakeV7Grams(steps=10)
    k = fake_kernel(lib, monkeypatch)
    k.v7_grams(1, 1)
    k.v7_grams(2, 2)
    assert lib.calls == [(150, 16, k.scratch.data_ptr(), 1), (150, 16, k.scratch.data_ptr(), 2)]
    grams = k.v7_gram_tensor()
    assert grams.shape == (10, 4, 128, 128)
    assert grams[3, 1, 5, 7].item() == 3 + 2 + 5 + 7  # Γ_{3,2}[5][7]: after the 64 flag floats
    assert torch.equal(k.w, torch.ones(10, 784)) and k.scratch[-100:].eq(0).all()
    for bad in (0, 3):
        with pytest.raises(ValueError, match="versions \\(1, 2\\)"):
            k.v7_grams(0, bad)
    k.version = 6
    with pytest.raises(ValueError, match="the Gram kernels are v7's"):
        k.v7_grams(0, 2)


def test_v7_grams_raises_a_launch_error(monkeypatch):
    k = fake_kernel(FakeV7Grams(steps=10, code=700), monkeypatch)
    with pytest.raises(RuntimeError, match=r"cuda_epoch_v7_grams \(Gram kernel v2\) failed: CUDA "
                                           r"error 700 \(cudaErrorFake\)"):
        k.v7_grams(0, 2)


def fake_epoch_ms(us_per_version):
    """sync_cost.epoch_ms without CUDA events: runs `run` 1 + epochs times and returns the ms of
    the Gram version the last call launched."""
    def epoch_ms(run, epochs):
        for _ in range(epochs + 1):
            run()
        return us_per_version[epoch_ms.lib.calls[-1][3]] / 1e3
    return epoch_ms


@pytest.mark.parametrize("planted", [False, True])
def test_sync_cost_prints_and_records_each_gram_kernel(monkeypatch, capsys, planted):
    sync_cost = import_benchmark("sync_cost")
    lib = FakeV7Grams(steps=10, off_by_one=planted)
    k = fake_kernel(lib, monkeypatch)
    timer = fake_epoch_ms({1: 493.8, 2: 61.5})
    timer.lib = lib
    monkeypatch.setattr(sync_cost, "epoch_ms", timer)
    recorded = sync_cost.time_v7_grams(k, epochs=4)
    assert recorded == {"v1": pytest.approx(493.8), "v2": pytest.approx(61.5),
                        "equal_to_v1": {"v2": not planted}}
    out = capsys.readouterr().out
    assert "v7 Grams, kernel v1: 493.8 µs an epoch" in out
    assert "v7 Grams, kernel v2: 61.5 µs an epoch" in out
    assert f"equal to v1's bit for bit: {{'v2': {not planted}}}" in out
    # Each kernel: a warm-up and 4 timed launches over the run's epochs in turn, then epoch 0.
    assert [c[3] for c in lib.calls] == [1] * 6 + [2] * 6


def test_sync_cost_records_a_failed_gram_kernel_and_goes_on(monkeypatch, capsys):
    sync_cost = import_benchmark("sync_cost")
    lib = FakeV7Grams(steps=10, code=700)
    k = fake_kernel(lib, monkeypatch)
    monkeypatch.setattr(sync_cost, "epoch_ms", lambda run, epochs: run())
    recorded = sync_cost.time_v7_grams(k, epochs=2)
    assert set(recorded) == {"v1", "v2"} and all("error 700" in v for v in recorded.values())
    assert "v7 Grams, kernel v2: cuda_epoch_v7_grams" in capsys.readouterr().out


@pytest.mark.gpu
@requires_gpu
def test_v2_grams_equal_v1s_and_the_exact_ones_on_an_mnist_sized_epoch():
    """60,000 samples in batches of 128: 469 steps, the last of 96. v2's Grams of the epoch equal
    v1's bit for bit (v1's were checked against the reference on an H200), every entry the other
    writes included (the scratch filled with -1 before each); some steps against float64 too."""
    if not ce.has_clusters():
        pytest.skip("v7 runs on thread-block clusters only")
    cfg = LadderConfig(epochs=1, batch_size=128)
    data = make_ladder_data(tiny_images(n_train=60_000), cfg)
    k = ce.EpochKernel(data, cfg, version=7, v7_grams="kernel")  # v7_grams() apart
    grams = {}
    for g in ce.V7_GRAM_VERSIONS:
        k.scratch.fill_(-1.0)
        k.v7_grams(0, g)
        grams[g] = k.v7_gram_tensor().cpu().numpy().copy()
    np.testing.assert_array_equal(grams[2], grams[1])
    order, x = data.orders[0], data.train_x
    for t in (1, 2, 4, 200, 468):
        for j in range(1, min(t, 4) + 1):
            xa, xb = x[order[t * 128:(t + 1) * 128]], x[order[(t - j) * 128:(t - j + 1) * 128]]
            want = ref.gram(xa, xb).astype(np.float32)
            got = grams[2][t, j - 1]
            np.testing.assert_array_equal(got[:len(xa), :len(xb)], want)
            assert (got[len(xa):] == -1).all() and (got[:, len(xb):] == -1).all()
    k.run(0)  # the epoch with v2's Grams still trains (its GPU tests: test_cuda_epoch_v7*.py)
    assert torch.isfinite(k.w).all()
