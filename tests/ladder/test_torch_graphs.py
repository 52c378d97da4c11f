"""torch-graphs: the step code that CUDA graphs capture, run eagerly on the CPU against the float64
reference; on a GPU the row itself runs in test_ladder.py's generic checks."""

import numpy as np
import pytest
import torch

from fasttrain.ladder.common import IN_FEATURES, LadderConfig, make_ladder_data, softmax_xent
from fasttrain.ladder.torch_graphs import EpochState, train_steps
from tests.conftest import tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd


def run_eager(data, cfg):
    s = EpochState(data, cfg, torch.device("cpu"))
    for epoch in range(cfg.epochs):
        s.order.copy_(torch.from_numpy(data.orders[epoch]))
        train_steps(s, s.spans)
    w = s.w.numpy()
    return w[:, :IN_FEATURES], w[:, IN_FEATURES], s


def test_steps_with_partial_batch_match_float64_reference():
    # 150 samples at batch 64: steps of 64, 64 and a partial 22, over 2 epochs of different order.
    cfg = LadderConfig(epochs=2, batch_size=64)
    data = make_ladder_data(tiny_images(n_train=150), cfg)
    w, b, _ = run_eager(data, cfg)
    w_ref, b_ref = reference_sgd(data, cfg, 2)
    assert not np.allclose(w_ref, data.w0, atol=ATOL)
    np.testing.assert_allclose(w, w_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(b, b_ref, atol=ATOL, rtol=0)


def test_loss_accumulated_is_the_batch_loss():
    cfg = LadderConfig(epochs=1, batch_size=128)
    data = make_ladder_data(tiny_images(n_train=128), cfg)  # one step, from the initial weights
    _, _, s = run_eager(data, cfg)
    loss, _ = softmax_xent(data.w0, data.b0, data.train_x / 255.0, data.train_y)
    assert s.loss_acc.sum().item() == pytest.approx(128 * loss, rel=1e-5)
