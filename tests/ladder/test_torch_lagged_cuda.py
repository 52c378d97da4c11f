"""torch-graphs' lagged-Gram variants on a GPU: each trains like the float64 reference in its
captured epoch graph (the partial batch and a cut block included), the bf16 Gram GEMM (fp32
out) equals the float64 Gram to fp32 rounding, and the kernels an epoch's graph replays, counted
by the profiler (printed for the record). The compiled ones also run in
test_torch_compiled_cuda.py's generic check. Written, not yet run on a GPU."""

import numpy as np
import pytest
import torch

from fasttrain.ladder import torch_graphs as tg
from fasttrain.ladder import torch_lagged as tl
from fasttrain.ladder import torch_optimized as to
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd
from tests.ladder.test_torch_compiled_cuda import kernels, row

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CFG = LadderConfig(epochs=2, batch_size=64, device="cuda")
N = 10 * 64 + 22  # 11 steps, the last partial: L = 4 cuts the last block to 3 steps
LAGGED = [v for v in tg.SWEEP if v.lag]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("v", LAGGED, ids=lambda v: v.tag)
def test_each_lagged_variant_trains_like_the_reference(v):
    data = make_ladder_data(tiny_images(n_train=N), CFG)
    w_ref, b_ref = reference_sgd(data, CFG, CFG.epochs)
    impl = row(tg.TorchGraphs, v)()
    impl.setup(data, CFG)
    for epoch in range(CFG.epochs):
        impl.train_epoch(epoch)
    w, b = impl.params()
    np.testing.assert_allclose(w, w_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(b, b_ref, atol=ATOL, rtol=0)


def test_the_bf16_gram_is_the_float64_gram_to_fp32_rounding():
    cfg = LadderConfig(batch_size=128, device="cuda")
    data = make_ladder_data(tiny_images(n_train=8 * 128), cfg)
    s = to.EpochState(data, cfg, torch.device("cuda"))
    lg = tl.Lagged(s, 128, 8)
    assert lg.pixels.dtype == torch.bfloat16
    lg.make_grams(torch.from_numpy(data.orders[0]).cuda())
    pix = np.concatenate([data.train_x[data.orders[0]].astype(np.float64),
                          np.full((len(data.orders[0]), 1), 255.0)], axis=1)
    want = pix @ pix.T
    got = lg.grams[0].double().cpu().numpy()
    assert np.abs(got - want).max() / want.max() <= 1e-6


@pytest.mark.parametrize("v", LAGGED, ids=lambda v: v.tag)
def test_kernels_an_epoch(v):
    """The kernels one replay of the epoch's graph runs at batch 128 (8 · 128 + 96 rows: 9 steps);
    printed for the record. Eager: the shuffle, the pixel gather and the Gram GEMM, (3L + 1) a
    block plus the partial batch's update (cuBLAS may split a GEMM: a reduction kernel more), the
    loss sum's 3; compiled: tl.fused_kernels(L) a full block."""
    cfg = LadderConfig(epochs=1, batch_size=128, device="cuda")
    data = make_ladder_data(tiny_images(n_train=8 * 128 + 96), cfg)
    impl = row(tg.TorchGraphs, v)()
    impl.setup(data, cfg)
    names = kernels(lambda: impl.train_epoch(0))
    print(v.tag, len(names), names)
    steps, blocks = 9, len(tl.block_spans(8 * 128 + 96, 128, v.lag))
    if v.step == "lagged":
        assert len(names) <= 3 + 3 * steps + 2 * blocks + 1 + 3 + steps, names
    else:
        assert len(names) <= 3 + blocks * tl.fused_kernels(v.lag) + 3, names
