"""cuda-epoch: the kernel compiles for Hopper here (nvcc, no GPU) and its variants' launch
configurations are read from the built library (it loads without a GPU); on a GPU, every variant
(version 2 or 3, cluster or cooperative grid, 7 or 14 CTAs; versions 4 to 6 on clusters only, 7
or 14 CTAs; v7 on its 64 CTAs) against the float64 reference, one launch per epoch (v7: two), and
the barrier microbenchmarks. v5's, v6's and v7's arithmetic also runs on the CPU:
test_cuda_epoch_v5_math.py, test_cuda_epoch_v6_math.py, test_cuda_epoch_v7_math.py. The row
itself also runs in test_ladder.py's generic checks."""

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fasttrain import ladder
from fasttrain.ladder import build
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd

requires_nvcc = pytest.mark.skipif(build.find_nvcc() is None, reason="nvcc not found on PATH")
requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@requires_nvcc
def test_compiles_for_hopper_and_for_gpus_without_clusters(hopper_builds, tmp_path):
    # sm_80 builds the cooperative-grid fallback, with the cluster code compiled out.
    sos = [hopper_builds["cuda_epoch.cu"], build.compile("cuda_epoch.cu", arch="sm_80",
                                                         out_dir=tmp_path)]
    for so in sos:
        symbols = so.read_bytes()
        for name in (b"cuda_epoch_train", b"cuda_epoch_variant", b"cuda_epoch_bench_cluster_sync",
                     b"cuda_epoch_bench_grid_sync", b"epoch_grid_kernel",
                     b"cuda_epoch_phase_profile", b"cuda_epoch_v7_scratch_bytes",
                     b"cuda_epoch_v7_residency", b"v7_epoch_kernel", b"v7_gram_kernel",
                     b"cuda_epoch_v7_phase_profile", b"cuda_epoch_v7_phase_shape",
                     b"cuda_epoch_v7_grams", b"cuda_epoch_v7_gram_versions",
                     b"v7_gram_kernel_v2"):
            assert name in symbols, (so.name, name)


@pytest.fixture(scope="module")
def cpu_loaded_library(hopper_builds):
    """The Hopper build loaded here: its host functions run without a GPU."""
    from fasttrain.ladder import cuda_epoch

    so = hopper_builds["cuda_epoch.cu"]
    try:
        lib = ctypes.CDLL(str(so))
    except OSError as e:  # no CUDA runtime library to load it with
        pytest.skip(f"cannot load the library without a CUDA runtime: {e}")
    lib.cuda_epoch_variant.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    lib.cuda_epoch_scratch_bytes.argtypes = [ctypes.c_int]
    lib.cuda_epoch_scratch_bytes.restype = ctypes.c_longlong
    return cuda_epoch, lib


def test_the_variant_list_is_what_the_benchmark_and_the_row_use():
    from fasttrain.ladder import cuda_epoch as ce

    every = ce.variants()
    kinds = (len(ce.VERSIONS) - 1) * 2 - (len(ce.CLUSTER_ONLY) - 1)  # (version, cluster), not v7
    assert len(every) == len(set(every)) == kinds * len(ce.CTA_COUNTS) + 1  # v7: one variant
    assert every[-1] == (7, True, ce.V7_CTAS) and ce.fallback_ctas(ce.V7_CTAS) == ce.CTAS
    # The row's kernel on the CTAs it runs on (v7: its 8-CTA chain), and its fallback on CTAS.
    assert (ce.VERSION, True, ce.cta_counts(ce.VERSION)[-1]) in every
    assert (ce.FALLBACK, True, ce.CTAS) in every
    assert (ce.GRID_VERSION, False, ce.CTAS) in every
    assert ce.FALLBACK not in (ce.VERSION, ce.GRID_VERSION)
    # Without clusters only the cooperative grid, and v2 (the reference of the others) first.
    assert ce.variants(clusters=False) == [v for v in every if not v[1]]
    assert every[0][0] == ce.FALLBACK == 2
    # v4-v7 (point-to-point signals) are timed on clusters, never on a grid; v7 is the default on
    # clusters (v7f in one launch, the fastest on the H200 on 2026-11-28, run 7: 1.741 ms/epoch
    # against v7c's 1.977 and v6's 2.021), v3 on a grid.
    assert {(v, c) for v, c, _ in every if v >= 4} == {(4, True), (5, True), (6, True), (7, True)}
    assert ce.VERSION == 7 and ce.SIGNALLED == ce.CLUSTER_ONLY == (4, 5, 6, 7)
    assert ce.PROFILED == (4, 5, 6, 7) and ce.LAUNCHES == {7: 2}  # v7: the Grams, then the epoch
    # v7k in one launch (the producers in the epoch kernel) is version 7's; two launches and the
    # other variants stay selectable.
    assert ce.V7_VARIANTS == ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m",
                              "n")
    assert ce.V7_VARIANT == "k"
    assert ce.V7_GRAMS == ("kernel", "launch") and ce.V7_GRAMS_DEFAULT == "launch"
    assert ce.V7_ONE_LAUNCH == ce.V7_VARIANTS
    assert ce.default_version(True) == 7 and ce.default_version(False) == ce.GRID_VERSION == 3
    # The row's figures name every header its kernel is built from (source_hash follows includes).
    hashed = ladder.entry("cuda-epoch").source_hash()["files"]
    for header in ("epoch_v4.cuh", "epoch_v6_math.cuh", "epoch_v7_phases.cuh", "epoch_v7l.cuh",
                   "epoch_v7e.cuh", "epoch_v7e_math.cuh", "epoch_v7f.cuh", "epoch_v7g.cuh",
                   "epoch_v7g_math.cuh", "epoch_v7h.cuh", "epoch_v7h_math.cuh", "epoch_v7i.cuh",
                   "epoch_v7i_math.cuh", "epoch_v7j.cuh", "epoch_v7j_math.cuh", "epoch_v7k.cuh",
                   "epoch_v7m.cuh", "epoch_v7m_math.cuh", "epoch_v7n.cuh", "epoch_v7n_math.cuh",
                   "v8_workers.cuh", "v8_mma.cuh",
                   "gram_v2.cuh"):
        assert f"csrc/{header}" in hashed


@requires_nvcc
def test_every_variant_launches_within_one_hopper_sm(cpu_loaded_library):
    ce, lib = cpu_loaded_library
    hopper_smem = 227 * 1024  # the most dynamic shared memory one CTA may have (sm_90)
    for version, cluster, ctas in ce.variants():
        threads, smem = ce.launch_config(lib, ctas, version, cluster)
        assert threads % 32 == 0 and threads <= 1024, (version, ctas, threads)
        assert 0 < smem <= hopper_smem, (version, ctas, smem)
    assert lib.cuda_epoch_scratch_bytes(14) > lib.cuda_epoch_scratch_bytes(7) > 0
    # v3: one thread per (row, class half, feature half) of a 128-row batch.
    assert ce.launch_config(lib, 14, 3)[0] == 4 * ce.MAX_BATCH
    # v4: v3's threads; its inboxes doubled (two steps in flight) and 4 mbarriers on top of v3's.
    # v5: v4's threads and inboxes; its batches as bf16 and its weights in three bf16 parts.
    # v6: v4's threads and inboxes; W in registers, not shared memory, and in its place DW, the
    # scaled gradient in the register tiles' order (blocks of 36 floats for 35 weights).
    for ctas in ce.CTA_COUNTS:
        v3, v4 = ce.launch_config(lib, ctas, 3), ce.launch_config(lib, ctas, 4)
        v5, v6 = ce.launch_config(lib, ctas, 5), ce.launch_config(lib, ctas, 6)
        assert v6[0] == v5[0] == v4[0] == v3[0] and v3[1] < v4[1] <= hopper_smem, (ctas, v3, v4)
        assert v5[1] <= hopper_smem and v6[1] <= v4[1] + 4 * 32, (ctas, v5, v6)
    # v7: 512 threads in each of its 64 CTAs; one variant, named by its chain's 8 CTAs; its global
    # scratch holds every Gram of the epoch (469 x 4 blocks of 128 x 128 fp32 for MNIST).
    assert ce.launch_config(lib, 8, 7) == (512, ce.launch_config(lib, 8, 7)[1])
    with pytest.raises(ValueError, match="no version 7 on 14 CTAs"):
        ce.launch_config(lib, 14, 7)
    lib.cuda_epoch_v7_scratch_bytes.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.cuda_epoch_v7_scratch_bytes.restype = ctypes.c_longlong
    assert lib.cuda_epoch_v7_scratch_bytes(60000, 128) > 469 * 4 * 128 * 128 * 4
    assert lib.cuda_epoch_v7_scratch_bytes(60000, 129) == 0
    # No cooperative-grid v4 to v7: the library refuses them (variants() leaves them out).
    for version in (4, 5, 6, 7):
        with pytest.raises(ValueError, match=f"no version {version} on 14 CTAs on a cooperative"):
            ce.launch_config(lib, 14, version, cluster=False)
    assert lib.cuda_epoch_scratch_bytes(16) == 0
    with pytest.raises(ValueError, match="no version 9"):
        ce.launch_config(lib, 14, 9)


@requires_nvcc
def test_v4_timeout_has_its_own_error_code_and_no_grid_launch(cpu_loaded_library):
    ce, lib = cpu_loaded_library
    lib.cuda_epoch_error_name.argtypes = [ctypes.c_int]
    lib.cuda_epoch_error_name.restype = ctypes.c_char_p
    assert lib.cuda_epoch_error_name(ce.SIGNAL_TIMEOUT) == b"cudaEpochSignalTimeout"
    # A cooperative-grid v4 is refused before anything reaches the GPU (1: cudaErrorInvalidValue).
    p = ctypes.c_void_p
    lib.cuda_epoch_train.argtypes = [p, p, p, ctypes.c_int, ctypes.c_int, ctypes.c_float, p, p, p,
                                     p, ctypes.c_int, ctypes.c_int, ctypes.c_int, p]
    dummy = p(16)
    for version in (4, 5, 6):
        code = lib.cuda_epoch_train(dummy, dummy, dummy, 1, 1, 0.1, dummy, dummy, dummy, dummy, 14,
                                    0, version, None)
        assert code == 1
    # v7: clusters only, its 8 chain CTAs, and its scratch; cuda_epoch_v7_train (v7a 0, v7b 1,
    # v7c 2, v7d 3, v7e 4, v7f 5, v7g 6, v7h 7, v7i 8, v7j 9, v7k 10, v7m 11): its scratch, a batch
    # that fits and a variant it has (len(V7_VARIANTS) is the first it has not).
    for ctas, cluster, scratch in ((8, 0, dummy), (14, 1, dummy), (8, 1, None)):
        code = lib.cuda_epoch_train(dummy, dummy, dummy, 1, 1, 0.1, dummy, dummy, dummy, scratch,
                                    ctas, cluster, 7, None)
        assert code == 1
    lib.cuda_epoch_v7_train.argtypes = [p, p, p, ctypes.c_int, ctypes.c_int, ctypes.c_float, p,
                                        p, p, p, ctypes.c_int, ctypes.c_int, p]
    # ... and `grams` 0 (two launches) or 1 (one), for every variant.
    past = len(ce.V7_VARIANTS)
    for batch, scratch, variant, grams in ((1, None, 1, 0), (129, dummy, 1, 0), (1, dummy, past, 0),
                                           (1, dummy, -1, 0), (1, None, 0, 1), (1, None, 2, 1),
                                           (1, None, 3, 1), (1, None, 7, 1), (1, dummy, past, 1),
                                           (1, dummy, 0, 2),
                                           (1, dummy, 1, -1)):
        assert lib.cuda_epoch_v7_train(dummy, dummy, dummy, 1, batch, 0.1, dummy, dummy, dummy,
                                       scratch, variant, grams, None) == 1
    # The phase profile exists for v4, v5 and v6 on 7 and 14 CTAs and a batch that fits, and
    # refuses the rest.
    lib.cuda_epoch_phase_profile.argtypes = [p, p, p, ctypes.c_int, ctypes.c_int, ctypes.c_float,
                                             p, p, p, ctypes.c_int, ctypes.c_int, p, p, p]
    for ctas, version, batch in ((5, 4, 128), (14, 4, 0), (14, 5, 129), (14, 3, 128),
                                 (14, 6, 0), (14, 7, 128)):
        assert lib.cuda_epoch_phase_profile(dummy, dummy, dummy, 1, batch, 0.1, dummy, dummy,
                                            dummy, ctas, version, dummy, dummy, None) == 1
    assert ce.PHASES[0] == "partials" and len(ce.PHASES) == 6  # epoch_v4.cuh's Phase, in order


def small_run(batch=64, **kernel_args):
    from fasttrain.ladder.cuda_epoch import EpochKernel

    # 150 samples at batch 64: steps of 64, 64 and a partial 22, over 2 epochs of different order;
    # at batch 16, 10 steps: v3's four-deep order and two-deep pixel rings wrap around; at 128,
    # every row tile of a full batch, then a partial one (22 rows: one tile and 6 of another), and
    # the last owners' row ranges past the batch's end (rows 120-129 at 14 CTAs).
    cfg = LadderConfig(epochs=2, batch_size=batch)
    data = make_ladder_data(tiny_images(n_train=150), cfg)
    return data, cfg, EpochKernel(data, cfg, **kernel_args)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("cluster", [True, False], ids=["cluster", "grid"])
@pytest.mark.parametrize("ctas", [7, 14])
@pytest.mark.parametrize("version", [2, 3, 4, 5, 6], ids=["v2", "v3", "v4", "v5", "v6"])
@pytest.mark.parametrize("batch", [128, 64, 16])
def test_variants_match_float64_reference(batch, version, cluster, ctas):
    from fasttrain.ladder.cuda_epoch import CLUSTER_ONLY, has_clusters

    if cluster and not has_clusters():
        pytest.skip("thread-block clusters need sm_90+")
    if not cluster and version in CLUSTER_ONLY:
        pytest.skip(f"v{version} runs on thread-block clusters only")
    data, cfg, k = small_run(batch, ctas=ctas, cluster=cluster, version=version)
    for epoch in range(cfg.epochs):
        k.run(epoch)  # v4: raises if a signal wait timed out
    w_ref, b_ref = reference_sgd(data, cfg, cfg.epochs)
    assert not np.allclose(w_ref, data.w0, atol=ATOL)
    np.testing.assert_allclose(k.w.cpu().numpy(), w_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(k.b.cpu().numpy(), b_ref, atol=ATOL, rtol=0)
    loss_sum, correct = k.stats.tolist()
    assert loss_sum > 0 and 0 <= correct <= 2 * data.n_train


V7_VARIANTS = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m",
               "n"]  # cuda_epoch.V7_VARIANTS
V7_HELPERS_RELEASE_G = ("i", "j", "k", "m", "n")  # G_t's counter released a step late (v7i on)
V7_ONE_LAUNCH = V7_VARIANTS  # cuda_epoch.V7_ONE_LAUNCH
V7_IDS = [f"v7{v}" for v in V7_VARIANTS]
V7_GRAMS = ["kernel", "launch"]  # cuda_epoch.V7_GRAMS
V7_RUNS = [(v, g) for g in V7_GRAMS for v in V7_VARIANTS if g == "kernel" or v in V7_ONE_LAUNCH]
"""(variant, v7_grams) of every v7 kernel: v7a-v7k, v7m and v7n in two launches and in one."""
V7_RUN_IDS = [f"v7{v}-{'two-launches' if g == 'kernel' else 'one-launch'}" for v, g in V7_RUNS]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize(("v7", "grams"), V7_RUNS, ids=V7_RUN_IDS)
@pytest.mark.parametrize("batch", [128, 64, 16])
def test_v7_matches_float64_reference(batch, v7, grams):
    """v7's two launches an epoch (Grams, then the chain and worker clusters), or its one launch
    (v7_grams="launch": the Grams by producer clusters of the same kernel), against float64 at
    2e-5 (ATOL: the lagged step's bugs move the weights by less than the row's 1e-3), two epochs:
    the step counters (v7b: the tagged ring) are reset by each epoch's Gram launch (one launch:
    by producer CTA 0 behind a flag of the epoch's generation)."""
    from fasttrain.ladder.cuda_epoch import has_clusters

    if not has_clusters():
        pytest.skip("v7 runs on thread-block clusters only")
    data, cfg, k = small_run(batch, version=7, v7_variant=v7, v7_grams=grams)
    assert k.ctas == 8 and k.variant.startswith(f"v7{v7}")
    assert ("one launch" in k.variant) == (grams == "launch") and k.launches == 2 - (
        grams == "launch")
    for epoch in range(cfg.epochs):
        k.run(epoch)  # raises if a bounded wait timed out
    w_ref, b_ref = reference_sgd(data, cfg, cfg.epochs)
    np.testing.assert_allclose(k.w.cpu().numpy(), w_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(k.b.cpu().numpy(), b_ref, atol=ATOL, rtol=0)
    loss_sum, correct = k.stats.tolist()
    assert loss_sum > 0 and 0 <= correct <= 2 * data.n_train


def v7_kernel_name(v7: str) -> str:
    """The variant's own epoch kernel as the profiler names it ("void (anonymous
    namespace)::v7_epoch_kernel_m<false, 1>(...)"): epoch_v7_launch.cuh's v7_kernel maps a
    variant's number to it, a table a merge could misorder, which the float64 checks would not
    see where two variants train bit for bit alike (j, k, m)."""
    return "::v7_epoch_kernel<" if v7 in ("a", "b") else f"::v7_epoch_kernel_{v7}<"


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("v7", V7_VARIANTS, ids=V7_IDS)
def test_v7_on_a_slice_of_mnist_sized_epoch_matches_v2_and_is_two_launches(v7):
    """A 31-step epoch (the 96-row last batch included) of v7 against v2 at 2e-5, and the profiler
    sees exactly two kernels an epoch: the Grams, then the epoch."""
    from torch.profiler import ProfilerActivity, profile

    from fasttrain.ladder.cuda_epoch import EpochKernel, has_clusters

    if not has_clusters():
        pytest.skip("v7 runs on thread-block clusters only")
    cfg = LadderConfig(epochs=3, batch_size=128)
    data = make_ladder_data(tiny_images(n_train=30 * 128 + 96), cfg)
    k = EpochKernel(data, cfg, version=7, v7_variant=v7, v7_grams="kernel")
    v2 = EpochKernel(data, cfg, version=2)
    v2.run(0)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for epoch in range(3):
            k.run(epoch, check_signals=False)
        torch.cuda.synchronize()
    k.check_signals()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    assert len(kernels) == 6, kernels
    assert [("v7_gram_kernel" in k, v7_kernel_name(v7) in k) for k in kernels] == [
        (True, False), (False, True)] * 3
    one = EpochKernel(data, cfg, version=7, v7_variant=v7)
    one.run(0)
    assert (one.w - v2.w).abs().max().item() <= ATOL
    assert (one.b - v2.b).abs().max().item() <= ATOL


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("v7", V7_ONE_LAUNCH, ids=V7_IDS)  # ce.V7_ONE_LAUNCH
def test_v7_in_one_launch_on_a_slice_of_mnist_sized_epoch_matches_v2_and_is_one_launch(v7):
    """The one-launch counterpart of the test above: the same 31-step epoch (the 96-row last batch
    included) of v7 with its Grams made by its producer clusters (v7_grams="launch") against v2 at
    2e-5, and the profiler sees exactly one kernel an epoch (the epoch kernel) over three epochs in
    a row on one scratch (the flags numbered by epoch, nothing zeroed between them; the float64
    test checks two such epochs' weights)."""
    from torch.profiler import ProfilerActivity, profile

    from fasttrain.ladder.cuda_epoch import EpochKernel, has_clusters

    if not has_clusters():
        pytest.skip("v7 runs on thread-block clusters only")
    cfg = LadderConfig(epochs=3, batch_size=128)
    data = make_ladder_data(tiny_images(n_train=30 * 128 + 96), cfg)
    k = EpochKernel(data, cfg, version=7, v7_variant=v7, v7_grams="launch")
    v2 = EpochKernel(data, cfg, version=2)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for epoch in range(3):
            k.run(epoch, check_signals=False)
        torch.cuda.synchronize()
    k.check_signals()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    assert len(kernels) == 3 and all(v7_kernel_name(v7) in k for k in kernels), kernels
    assert bool(torch.isfinite(k.w).all())
    one = EpochKernel(data, cfg, version=7, v7_variant=v7, v7_grams="launch")
    one.run(0)
    v2.run(0)
    assert (one.w - v2.w).abs().max().item() <= ATOL
    assert (one.b - v2.b).abs().max().item() <= ATOL


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize(("variant", "grams"),
                         [(V7_VARIANTS.index(v), V7_GRAMS.index(g)) for v, g in V7_RUNS],
                         ids=V7_RUN_IDS)
def test_v7_is_resident_on_this_gpu_or_refused_at_setup(variant, grams):
    """Its 8 clusters of 8 CTAs (one launch: 15, the producers' 7 more) must all fit at once (they
    spin on each other): the setup check's figures, which an H100 or H200 (132 SMs) meets (an H200
    holds 15 of the one-launch config, measured by sync_cost's probes on 2026-11-28)."""
    from fasttrain.ladder.cuda_epoch import has_clusters, load_library

    if not has_clusters():
        pytest.skip("v7 runs on thread-block clusters only")
    lib = load_library()
    clusters, needed = ctypes.c_int(), ctypes.c_int()
    assert lib.cuda_epoch_v7_residency(variant, grams, ctypes.byref(clusters),
                                       ctypes.byref(needed)) == 0
    assert needed.value == (8, 15)[grams] and clusters.value >= needed.value, clusters.value


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize(("v7", "grams"), V7_RUNS, ids=V7_RUN_IDS)
def test_v7_protocol_fault_is_an_error_not_a_hang(v7, grams):
    """Fault 2 makes v7's chain CTA 0 wait at step 2 for a worker partial that never comes (v7a: a
    counter no worker reaches; v7b: a tag no step writes): the launch ends after the wait budget
    (the other chain CTAs and the worker clusters see the flag in their own waits; a worker cluster
    leaves together), the error names the wait, nothing is written back, and once the flag is read
    v7 trains correctly again.

    The first wait to run out its budget is the one recorded. From v7i on, a chain CTA's helper
    warps release G_t's counter after step t + 1's hand-off, so chain CTA 0, stuck at step 2,
    never releases G_1, and the workers' wait for G_1 starts within microseconds of CTA 0's: on
    an H200 (2026-11-28, run 10) v7j's workers ran out first once in ten runs. v7n's helper
    warps wait for G_2 in their ring, which CTA 0 never sends, from their step 2 on. Each names
    the fault."""
    import time

    from fasttrain.ladder.cuda_epoch import has_clusters

    if not has_clusters():
        pytest.skip("v7 needs thread-block clusters (sm_90+)")
    data, cfg, k = small_run(16, version=7, v7_variant=v7, v7_grams=grams)  # 10 steps
    w0, b0 = k.w.clone(), k.b.clone()
    assert k.lib.cuda_epoch_signal_fault(2) == 0
    try:
        start = time.perf_counter()
        # CTA 0's partials at step 2, or a wait it leaves unfed: the workers' for G_1 (released
        # late), v7n's helpers' for G_2 in their ring ("the rows' g at step 3").
        first = r"(v7's worker partials \(chain\) at step 2|v7's G \(worker\) at step 1|" \
            r"the rows' g at step 3) " if v7 in V7_HELPERS_RELEASE_G else r".* at step 2 "
        with pytest.raises(RuntimeError, match="waited too long for " + first):
            k.run(0)
        assert time.perf_counter() - start < 5.0
    finally:
        assert k.lib.cuda_epoch_signal_fault(0) == 0
    k.check_signals()  # read and cleared: nothing left
    assert torch.equal(k.w, w0) and torch.equal(k.b, b0)  # no CTA wrote back
    for epoch in range(cfg.epochs):
        k.run(epoch)
    w_ref, _ = reference_sgd(data, cfg, cfg.epochs)
    np.testing.assert_allclose(k.w.cpu().numpy(), w_ref, atol=ATOL, rtol=0)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("version", [4, 6], ids=["v4", "v6"])
def test_v4_protocol_fault_is_an_error_not_a_hang(version):
    """The test hook makes CTA 0 wait at step 2 for bytes that never come: the launch ends after
    the wait budget (~70 ms) with a RuntimeError naming the wait, the GPU stays usable, and once
    the flag is read the version runs correctly again. v6 shares v4's loop (and its hook), but
    not its write-back: CTA 0 must skip it from registers too."""
    import time

    from fasttrain.ladder.cuda_epoch import has_clusters

    if not has_clusters():
        pytest.skip(f"v{version} needs thread-block clusters (sm_90+)")
    data, cfg, k = small_run(16, ctas=14, cluster=True, version=version)  # 10 steps
    w0 = k.w.clone()
    assert k.lib.cuda_epoch_signal_fault(1) == 0
    try:
        start = time.perf_counter()
        # CTA 0's wait starts first, so it times out first, but by microseconds of a 70 ms
        # budget: another CTA's wait for g at the same step may be the one reported.
        with pytest.raises(RuntimeError, match=r"waited too long for .* at step 2 "):
            k.run(0)
        assert time.perf_counter() - start < 5.0
    finally:
        assert k.lib.cuda_epoch_signal_fault(0) == 0
    k.check_signals()  # read and cleared: nothing left
    assert torch.equal(k.w[:, :56], w0[:, :56])  # CTA 0 did not write back its slice
    k.w.copy_(torch.from_numpy(data.w0))
    k.b.copy_(torch.from_numpy(data.b0))
    for epoch in range(cfg.epochs):
        k.run(epoch)
    w_ref, _ = reference_sgd(data, cfg, cfg.epochs)
    np.testing.assert_allclose(k.w.cpu().numpy(), w_ref, atol=ATOL, rtol=0)


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
@pytest.mark.parametrize("version", [4, 5, 6], ids=["v4", "v5", "v6"])
def test_the_phase_profile_accounts_for_its_step(version):
    """The profiling build's phases, per CTA, add up to its loop: their means over CTAs to the
    step CTA 0 timed by the global timer (each CTA runs the same loop in the same launch)."""
    from fasttrain.ladder.cuda_epoch import PHASES, has_clusters

    if not has_clusters():
        pytest.skip(f"v{version} runs on thread-block clusters only")
    from fasttrain.ladder.cuda_epoch import EpochKernel

    cfg = LadderConfig(epochs=1, batch_size=128)
    data = make_ladder_data(tiny_images(n_train=128 * 40), cfg)  # 40 steps: ~0.2 ms of loop
    k = EpochKernel(data, cfg, ctas=14, cluster=True, version=version)
    w0 = k.w.clone()
    profile = k.phase_profile(0)
    assert torch.equal(k.w, w0)  # it trained copies
    assert list(profile["mean_us"]) == list(PHASES)
    assert all(v >= 0 for v in profile["mean_us"].values())
    assert all(profile["max_us"][p] >= profile["mean_us"][p] for p in PHASES)
    total = sum(profile["mean_us"].values())
    assert total == pytest.approx(profile["step_us"], rel=0.05), profile


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


def test_a_version_that_disagrees_with_the_fallback_is_replaced_by_it(monkeypatch):
    """The wiring of the setup's cross-check, on the CPU: a disagreeing version is not timed;
    the row times FALLBACK and its details say why."""
    from fasttrain.ladder import cuda_epoch as ce

    made = []

    class FakeKernel:
        def __init__(self, data, cfg, ctas=14, cluster=None, version=None):
            self.ctas, self.cluster = ctas, cluster
            self.version = version = ce.VERSION if version is None else version
            self.w = self.b = self.stats = torch.zeros(1)
            self.variant = f"v{version}"
            self.launches = 1
            made.append(version)

        def run(self, epoch, w=None, b=None, stats=None):
            pass

    monkeypatch.setattr(ce, "EpochKernel", FakeKernel)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(ce.CudaEpoch, "cross_check", lambda self, d, c: "v4 disagrees")
    row = ce.CudaEpoch()
    with pytest.warns(UserWarning, match="timing v2 instead"):
        row.setup(None, None)
    assert row.kernel.version == ce.FALLBACK and made == [ce.VERSION, ce.FALLBACK]
    assert row.details() == {"variant": "v2", "fallback_reason": "v4 disagrees",
                             "launches_per_epoch": 1}
    monkeypatch.setattr(ce.CudaEpoch, "cross_check", lambda self, d, c: None)
    made.clear()
    row.setup(None, None)
    assert row.kernel.version == ce.VERSION and made == [ce.VERSION]


@pytest.mark.parametrize("clusters", [True, False], ids=["cluster", "grid"])
def test_the_default_kernel_asks_the_library_for_its_resolved_version(monkeypatch, clusters):
    """EpochKernel(data, cfg), as the row builds it: the variant checked is the default version
    of the machine's kind (the library's ctypes call takes an int, never None)."""
    from fasttrain.ladder import cuda_epoch as ce

    asked = []

    def launch_config(lib, ctas, version, cluster=True):
        asked.append((ctas, version, cluster))
        raise ValueError("stop here")  # the rest of __init__ needs a GPU

    monkeypatch.setattr(ce, "load_library", lambda: None)
    monkeypatch.setattr(ce, "has_clusters", lambda: clusters)
    monkeypatch.setattr(ce, "launch_config", launch_config)
    with pytest.raises(ValueError, match="stop here"):
        ce.EpochKernel(SimpleNamespace(n_train=150), LadderConfig())
    version = ce.default_version(clusters)
    assert asked == [(ce.cta_counts(version)[-1], version, clusters)]
