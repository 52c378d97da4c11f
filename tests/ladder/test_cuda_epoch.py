"""cuda-epoch: the kernel compiles for Hopper here (nvcc, no GPU); on a GPU, every variant
(cluster or cooperative grid, 7 or 14 CTAs) against the float64 reference, one launch per epoch,
and the barrier microbenchmarks. The row itself also runs in test_ladder.py's generic checks."""

import ctypes
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from fasttrain.ladder import build
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd

requires_nvcc = pytest.mark.skipif(build.find_nvcc() is None, reason="nvcc not found on PATH")
requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@requires_nvcc
def test_compiles_for_hopper_and_for_gpus_without_clusters(tmp_path):
    # sm_80 builds the cooperative-grid fallback, with the cluster code compiled out.
    with ThreadPoolExecutor(2) as pool:  # nvcc is single-threaded
        sos = list(pool.map(lambda arch: build.compile("cuda_epoch.cu", arch=arch,
                                                       out_dir=tmp_path), ["sm_90a", "sm_80"]))
    for so in sos:
        symbols = so.read_bytes()
        for name in (b"cuda_epoch_train", b"cuda_epoch_bench_cluster_sync",
                     b"cuda_epoch_bench_grid_sync", b"epoch_grid_kernel"):
            assert name in symbols, (so.name, name)


def small_run(**kernel_args):
    from fasttrain.ladder.cuda_epoch import EpochKernel

    # 150 samples at batch 64: steps of 64, 64 and a partial 22, over 2 epochs of different order.
    cfg = LadderConfig(epochs=2, batch_size=64)
    data = make_ladder_data(tiny_images(n_train=150), cfg)
    return data, cfg, EpochKernel(data, cfg, **kernel_args)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("cluster", [True, False], ids=["cluster", "grid"])
@pytest.mark.parametrize("ctas", [7, 14])
def test_variants_match_float64_reference(cluster, ctas):
    from fasttrain.ladder.cuda_epoch import has_clusters

    if cluster and not has_clusters():
        pytest.skip("thread-block clusters need sm_90+")
    data, cfg, k = small_run(ctas=ctas, cluster=cluster)
    for epoch in range(cfg.epochs):
        k.run(epoch)
    w_ref, b_ref = reference_sgd(data, cfg, cfg.epochs)
    assert not np.allclose(w_ref, data.w0, atol=ATOL)
    np.testing.assert_allclose(k.w.cpu().numpy(), w_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(k.b.cpu().numpy(), b_ref, atol=ATOL, rtol=0)
    loss_sum, correct = k.stats.tolist()
    assert loss_sum > 0 and 0 <= correct <= 2 * data.n_train


@pytest.mark.gpu
@requires_gpu
def test_one_launch_per_epoch():
    from torch.profiler import ProfilerActivity, profile

    from fasttrain.ladder.cuda_epoch import CudaEpoch

    cfg = LadderConfig(epochs=20, batch_size=128)
    impl = CudaEpoch()
    impl.setup(make_ladder_data(tiny_images(n_train=1000), cfg), cfg)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for epoch in range(3):  # no loss read before epoch 10: nothing but the epochs runs
            impl.train_epoch(epoch)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    assert len(kernels) == 3 and all("epoch_" in k for k in kernels), kernels


@pytest.mark.gpu
@requires_gpu
def test_barrier_microbenchmarks_measure_something():
    from fasttrain.ladder.cuda_epoch import has_clusters, load_library, stream_handle

    lib = load_library()
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    kinds = ["grid"] + (["cluster"] if has_clusters() else [])
    for kind in kinds:
        code = getattr(lib, f"cuda_epoch_bench_{kind}_sync")(
            8, 1000, ctypes.c_void_p(out.data_ptr()), stream_handle())
        assert code == 0, lib.cuda_epoch_error_name(code)
        assert out.item() > 0, kind
