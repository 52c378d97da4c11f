"""The lagged-Gram step (tests/ladder/lagged_reference.py) against plain SGD: in float64 it is the
same algebra (equal to float64 rounding over whole epochs, the last partial batch included); in
float32 with int32-exact Grams it stays within cuda-epoch's cross-check tolerance of float64;
and the bugs a kernel would most likely have (an off-by-one lag window, the bias correction left
out, the Gram transposed) fail the same check."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from fasttrain.ladder.check import FP32_ATOL
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from fasttrain.ladder.cuda_epoch import CROSS_CHECK_ATOL
from tests.conftest import real_data_dir, requires_mnist
from tests.ladder import lagged_reference as ref
from tests.ladder.test_ladder import reference_sgd

EXACT_ATOL = 1e-12
"""Float64 lagged against float64 plain SGD after whole epochs: the sums are reassociated (a few
float64 ulps of weights O(0.1) a step, 2–3e-16 measured after a real MNIST epoch)."""
LAGS = (1, 2, 4, 8)


def random_uint8(n_train, seed=0):
    """Uniform uint8 pixels and labels: the Grams' largest entries, no structure to hide behind."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=n_train).astype(np.uint8)
    return SimpleNamespace(name="random", train_x=x, train_y=y, test_x=x[:16], test_y=y[:16])


def max_err(a, b):
    return max(float(np.abs(a[0] - b[0]).max()), float(np.abs(a[1] - b[1]).max()))


def assert_matches_sgd(data, cfg, lag, epochs):
    want = reference_sgd(data, cfg, epochs)
    got = ref.lagged_sgd(data, cfg, lag, epochs)
    assert not np.allclose(want[0], data.w0, atol=1e-3), "training must move the weights"
    err = max_err(got, want)
    assert err <= EXACT_ATOL, f"lag {lag}: {err:.3g} from plain SGD"


@pytest.mark.parametrize("lag", [1, 2, 3, 8, 13, 20])
def test_float64_equals_plain_sgd_over_epochs_of_random_uint8(lag):
    # 10 full batches of 128 and the partial 96 (the shape of MNIST's last batch), 2 epochs of
    # different order; lag 13 covers a whole epoch's steps and 20 more than there are.
    cfg = LadderConfig(epochs=2)
    data = make_ladder_data(random_uint8(10 * 128 + 96), cfg)
    assert_matches_sgd(data, cfg, lag, epochs=2)


@requires_mnist
@pytest.mark.parametrize("lag", [1, 4])  # v7's lag and the shortest; random data takes the others
def test_float64_equals_plain_sgd_on_a_slice_of_mnist(lag):
    from fasttrain.data import load_dataset

    mnist = load_dataset("mnist", real_data_dir())
    n = 30 * 128 + 96  # 31 steps, the last one partial
    mnist_slice = dataclasses.replace(mnist, train_x=mnist.train_x[:n], train_y=mnist.train_y[:n])
    cfg = LadderConfig(epochs=2)
    assert_matches_sgd(make_ladder_data(mnist_slice, cfg), cfg, lag, epochs=2)


def float32_err(data, cfg, lag):
    """Float32 lagged-Gram (int32-exact Grams) against float64 plain SGD after one epoch."""
    return max_err(ref.lagged_sgd(data, cfg, lag, dtype=np.float32), reference_sgd(data, cfg, 1))


# The row's cross-check tolerance (1e-3) is too loose to catch a lagged-Gram bug: after one real
# MNIST epoch in float32 (lag 4) the bias correction left out moved the weights by only 5.9e-4 and
# an off-by-one window by 1.3e-3, while the correct lagged step stays within ~4e-7 (as plain
# float32 SGD does). So the float32 runs are held to the one-step check's FP32_ATOL (2e-5) as well.
@pytest.mark.parametrize("lag", LAGS)
def test_float32_with_exact_grams_stays_within_the_cross_check(lag):
    cfg = LadderConfig(epochs=1)
    err = float32_err(make_ladder_data(random_uint8(20 * 128 + 96), cfg), cfg, lag)
    assert err <= min(CROSS_CHECK_ATOL, FP32_ATOL), f"lag {lag}: float32 {err:.3g} from float64"


@requires_mnist
@pytest.mark.slow
def test_float32_after_a_whole_mnist_epoch_stays_within_the_cross_check():
    from fasttrain.data import load_dataset

    cfg = LadderConfig(epochs=1)
    data = make_ladder_data(load_dataset("mnist", real_data_dir()), cfg)
    want = reference_sgd(data, cfg, 1)
    errs = {lag: max_err(ref.lagged_sgd(data, cfg, lag, dtype=np.float32), want) for lag in LAGS}
    assert max(errs.values()) <= min(CROSS_CHECK_ATOL, FP32_ATOL), errs


def drop_oldest(t, lag):
    s = max(t - lag, 0)
    return s, list(range(t - 1, s, -1))


def one_too_many(t, lag):
    s = max(t - lag, 0)
    return s, list(range(t - 1, max(s - 2, -1), -1))  # step s−1's update is in W_s already


def transposed_gram(xa, xb, exact=ref.gram):
    return exact(xb, xa)  # X_{t−j} X_tᵀ: the right shape for full batches, the wrong matrix


PLANTED = {
    "off-by-one: the oldest lagged step left out": ("lag_window", drop_oldest),
    "off-by-one: a step already applied counted again": ("lag_window", one_too_many),
    "the bias's correction left out": ("lagged_bias", lambda b_s, past_g, lr: b_s.copy()),
    "the Gram in the wrong order": ("gram", transposed_gram),
}


@pytest.mark.parametrize("bug", PLANTED)
@pytest.mark.parametrize("lag", [1, 4])
def test_planted_bugs_fail_the_check(bug, lag, monkeypatch):
    cfg = LadderConfig(epochs=1)
    data = make_ladder_data(random_uint8(8 * 128), cfg)  # full batches: a transposed Gram fits
    name, planted = PLANTED[bug]
    monkeypatch.setattr(ref, name, planted)
    with pytest.raises(AssertionError, match="from plain SGD"):
        assert_matches_sgd(data, cfg, lag, epochs=1)


@pytest.mark.parametrize("bug", PLANTED)
def test_planted_bugs_fail_the_float32_check(bug, monkeypatch):
    cfg = LadderConfig(epochs=1)
    data = make_ladder_data(random_uint8(8 * 128), cfg)
    name, planted = PLANTED[bug]
    monkeypatch.setattr(ref, name, planted)
    assert float32_err(data, cfg, lag=4) > FP32_ATOL
