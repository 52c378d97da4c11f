"""The PyTorch rows that pick their device, on CUDA: one step against the float64 reference and
full training within half a point of numpy-cpu (the rows on the CPU are in test_ladder.py)."""

import numpy as np
import pytest
import torch

from fasttrain import ladder
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import requires_mnist, tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
# Rows that train (the roofline also picks its device, but is computed, never trained).
ROWS = [e.name for e in ladder.REGISTRY if e.picks_device and e.load().trains]
# bf16 autocast (torch-optimized on GPUs with bf16 tensor cores) rounds the logits to ~3 digits:
# the step's weight error is ~1e-4, still well under the update itself (~1e-2).
ATOL_BF16 = 1e-3


def train(name, data, cfg):
    impl = ladder.entry(name).create("cuda")
    impl.setup(data, cfg)
    for epoch in range(cfg.epochs):
        impl.train_epoch(epoch)
    return impl


@pytest.mark.parametrize("name", ROWS)
def test_one_step_on_cuda_matches_float64_autograd(name):
    cfg = LadderConfig(epochs=1, batch_size=128, device="cuda")
    data = make_ladder_data(tiny_images(n_train=128), cfg)
    impl = train(name, data, cfg)
    atol = ATOL_BF16 if impl.precision == "bf16" else ATOL
    w_ref, b_ref = reference_sgd(data, cfg, 1)
    w, b = impl.params()
    assert not np.allclose(w_ref, data.w0, atol=atol), "the step must change the weights"
    np.testing.assert_allclose(w, w_ref, atol=atol, rtol=0)
    np.testing.assert_allclose(b, b_ref, atol=atol, rtol=0)


@requires_mnist
@pytest.mark.slow
def test_full_training_on_cuda_within_half_a_point_of_numpy():
    from fasttrain.data import load_dataset
    from tests.conftest import real_data_dir

    cfg = LadderConfig(device="cuda")
    data = make_ladder_data(load_dataset("mnist", real_data_dir()), cfg)
    accs = {name: train(name, data, cfg).evaluate()[1] for name in ["numpy-cpu", *ROWS]}
    assert all(abs(acc - accs["numpy-cpu"]) <= 0.005 for acc in accs.values()), accs
