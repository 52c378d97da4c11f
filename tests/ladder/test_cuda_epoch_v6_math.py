"""cuda-epoch v6's register tiles on the CPU: its tile code (`csrc/epoch_v6_math.cuh`) compiled by
nvcc for the host and run as the kernel runs it, for a whole cluster of 7 or 14 CTAs and whole
epochs (`tests/ladder/csrc/epoch_v6_math_host.cu`: every thread, the lanes of each shuffle in
lockstep, the partial logits delivered to their owners at the offsets the kernel sends them to),
against the float64 reference; and its bookkeeping: every product, sum, DW entry and weight
counted. What it cannot check (the signals, the real SHFL and st.async, the kernel's own
softmax) the GPU tests of test_cuda_epoch.py do."""

import ctypes

import numpy as np
import pytest

from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import tiny_images
from tests.ladder.host_harness import compile_harness, ptr
from tests.ladder.test_ladder import ATOL

HARNESS = "tests/ladder/csrc/epoch_v6_math_host.cu"
C, K = 10, 784


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = compile_harness(HARNESS, tmp_path_factory.mktemp("v6"))
    p, i32 = ctypes.c_void_p, ctypes.c_int
    lib.v6_epoch.argtypes = [i32, p, p, p, i32, i32, ctypes.c_float, p, p, p]
    lib.v6_mapping_violations.argtypes = [i32]
    lib.v6_shape.argtypes = [i32, p]
    return lib



def reference(data, cfg, epochs):
    """Float64 SGD, the ladder's semantics, with each step's loss and correct count summed."""
    w, b = data.w0.astype(np.float64), data.b0.astype(np.float64)
    x_all, y_all = data.train_x.astype(np.float64) / 255, data.train_y.astype(np.int64)
    loss = correct = 0.0
    for epoch in range(epochs):
        order = data.orders[epoch]
        for start in range(0, data.n_train, cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            x, y = x_all[idx], y_all[idx]
            z = x @ w.T + b
            zmax = z.max(1, keepdims=True)
            e = np.exp(z - zmax)
            p = e / e.sum(1, keepdims=True)
            loss += float((np.log(e.sum(1)) + zmax[:, 0] - z[np.arange(len(y)), y]).sum())
            correct += float((z[np.arange(len(y)), y] == zmax[:, 0]).sum())
            g = p
            g[np.arange(len(y)), y] -= 1
            g /= len(y)
            w -= cfg.lr * g.T @ x
            b -= cfg.lr * g.sum(0)
    return w, b, loss, correct


def v6_epochs(lib, ctas, data, cfg, epochs):
    w, b = data.w0.astype(np.float32).copy(), data.b0.astype(np.float32).copy()
    stats = np.zeros(2)
    x = np.ascontiguousarray(data.train_x.reshape(data.n_train, K), dtype=np.uint8)
    y = data.train_y.astype(np.int32)
    for epoch in range(epochs):
        order = np.ascontiguousarray(data.orders[epoch], dtype=np.int32)
        differ = lib.v6_epoch(ctas, ptr(x), ptr(y), ptr(order), data.n_train, cfg.batch_size,
                              cfg.lr, ptr(w), ptr(b), ptr(stats))
        assert differ == 0, f"{differ} weights differ between their register replicas"
    return w, b, stats


@pytest.mark.parametrize("ctas", [14, 7])
def test_every_product_sum_and_weight_is_counted_once(lib, ctas):
    assert lib.v6_mapping_violations(ctas) == 0
    shape = (ctypes.c_int * 4)()
    lib.v6_shape(ctas, shape)
    # 8 or 16 feature lanes of 7 features, 4 or 8 rows a thread, 19 or 39 shuffles, 2 or 1
    # threads per G output: the arithmetic the header's comment counts.
    assert list(shape) == ([8, 4, 19, 2] if ctas == 14 else [16, 8, 39, 1])


@pytest.mark.parametrize("ctas", [14, 7])
@pytest.mark.parametrize(("n", "batch"), [(224, 128), (480, 128), (150, 64), (150, 16)])
def test_epochs_equal_float64_to_fp32_rounding(lib, ctas, n, batch):
    # 224 = 128 + 96 and 480 = 3 x 128 + 96: the full batch's tiles, then the 96-row last batch
    # of MNIST's 60000 (rows 96-127 hold the previous batch: they must not count); 150 at 64:
    # 64, 64, 22; at 16: 10 steps. Two epochs in different orders, as the GPU tests run.
    cfg = LadderConfig(epochs=2, batch_size=batch)
    data = make_ladder_data(tiny_images(n_train=n), cfg)
    w, b, stats = v6_epochs(lib, ctas, data, cfg, cfg.epochs)
    w_ref, b_ref, loss, correct = reference(data, cfg, cfg.epochs)
    assert not np.allclose(w_ref, data.w0, atol=ATOL)  # the updates are far above the tolerance
    np.testing.assert_allclose(w, w_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(b, b_ref, atol=ATOL, rtol=0)
    assert stats[0] == pytest.approx(loss, rel=1e-5)
    assert abs(stats[1] - correct) <= 2  # a near-tie of two logits may round either way


def test_the_harness_rejects_bad_arguments(lib):
    one = np.zeros(1, np.int32)
    assert lib.v6_epoch(8, ptr(one), ptr(one), ptr(one), 1, 1, 0.1, ptr(one), ptr(one),
                        ptr(np.zeros(2))) == -1
    assert lib.v6_mapping_violations(8) == -1
