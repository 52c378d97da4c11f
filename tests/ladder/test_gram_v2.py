"""cuda-epoch v7's Gram kernel v2 (csrc/gram_v2.cuh, v7_gram_kernel_v2 in csrc/epoch_v7.cuh):
its CTA code run on the CPU for whole epochs (tests/ladder/csrc/gram_v2_host.cu: every CTA of
the grid, cp.async copies landing only at their wait, ldmatrix and mma emulated from the PTX
ISA) against the exact Grams of tests/ladder/lagged_reference.py rounded once to fp32, at
v7_gram_offset's place, with nothing written past a batch or before the epoch; two planted bugs
fail it. On a GPU (marked gpu): v2's Grams equal v1's bit for bit on an MNIST-sized epoch.
Written without a GPU: the GPU test has not yet run.

The v8 instantiation (gram_v2.cuh's V8: L = 6, the bias as a 785th pixel of 255, every block
written): the same emulation (gram_v8_epoch_host) against ladder/v8_chain.py's chain_inputs, the
probes' own NumPy Γ̃ in their own layouts ("grams", "gramh"), bit for bit; three planted bugs
fail it (the bias byte, a lag's rows a step off, the padding not zeroed)."""

import ctypes

import numpy as np
import pytest

from tests.ladder import lagged_reference as ref
from tests.ladder.host_harness import compile_harness, ptr

HARNESS = "tests/ladder/csrc/gram_v2_host.cu"
LAG, BMAX = 4, 128
EPOCHS = [(128 * 5 + 96, 128), (7 * 96, 96), (5 * 40 + 17, 40), (3 * 128, 128)]
"""(n, batch): full batches of 128 with a partial last one (96: both CTAs of a step, the second
with 32 rows), batches of 96 (the second CTA's rows 64 … 95 only), of 40 (the second CTA has no
rows; a last batch of 17) and an epoch shorter than the lag (j > t: no Γ)."""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = compile_harness(HARNESS, tmp_path_factory.mktemp("gramv2"))
    p, i32 = ctypes.c_void_p, ctypes.c_int
    lib.gram_v2_epoch_host.argtypes = [p, p, i32, i32, p, i32]
    lib.gram_v2_epoch_host.restype = i32
    lib.gram_v8_epoch_host.argtypes = [p, p, i32, i32, p, p, i32]
    lib.gram_v8_epoch_host.restype = i32
    return lib



def epoch_data(n, seed=0):
    """Pixels of n + 50 rows (row order[0] all 255: Γ entries up to 784 · 255², past fp32's 2²⁴,
    so the rounding shows) and an epoch's order."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n + 50, 784), dtype=np.uint8)
    order = rng.permutation(n + 50)[:n].astype(np.int32)
    x[order[0]] = 255
    return x, order


def host_grams(lib, x, order, bs, bug=0):
    """[steps][L][BMAX][BMAX] from the harness, NaN where nothing was written; the cp.async groups
    a CTA left in flight."""
    n = len(order)
    steps = (n + bs - 1) // bs
    gram = np.full((steps, LAG, BMAX, BMAX), np.nan, dtype=np.float32)
    left = lib.gram_v2_epoch_host(ptr(x), ptr(order), n, bs, ptr(gram), bug)
    return gram, left


def expected_grams(x, order, bs):
    """Γ_{t,j} = X_t X_{t−j}ᵀ exact, rounded once to fp32, for j ≤ min(t, L); NaN elsewhere."""
    n = len(order)
    steps = (n + bs - 1) // bs
    want = np.full((steps, LAG, BMAX, BMAX), np.nan, dtype=np.float32)
    batch = [order[t * bs:(t + 1) * bs] for t in range(steps)]
    for t in range(1, steps):
        for j in range(1, min(t, LAG) + 1):
            g = ref.gram(x[batch[t]], x[batch[t - j]])
            want[t, j - 1, :g.shape[0], :g.shape[1]] = g.astype(np.float32)
    return want


@pytest.mark.parametrize("n,bs", EPOCHS)
def test_v2_grams_equal_the_exact_grams_rounded_once(lib, n, bs):
    x, order = epoch_data(n)
    got, left = host_grams(lib, x, order, bs)
    want = expected_grams(x, order, bs)
    assert left == 0, "every cp.async group waited for"
    np.testing.assert_array_equal(got, want)  # NaN where nothing may be written


@pytest.mark.parametrize("bug", [1, 2])
def test_a_planted_bug_fails(lib, bug):
    """1: copies land a stage late (the MMA reads a stale buffer); 2: copies one 16-byte unit
    off along k. Either changes the Grams."""
    x, order = epoch_data(128 * 3 + 96)
    got, _ = host_grams(lib, x, order, 128, bug=bug)
    want = expected_grams(x, order, 128)
    assert not np.array_equal(got, want, equal_nan=True)


V8_LAG = 6
V8_EPOCHS = [128 * 7 + 96, 128 * 6 + 40, 128 * 3 + 17]
"""n (batch 128, the probes'): 8 steps with a partial last batch of 96 (every lag reaches a
partial batch, and t < j for the first steps), a last batch of 40 (its second CTA has no rows:
its blocks' rows 64 … 127 all 0), an epoch shorter than the lag."""


def v8_host_grams(lib, x, order, bug=0):
    """"grams" [steps][128][128] and "gramh" [5][steps][128][128] from the harness (NaN-filled
    first: every entry must be written), and the cp.async groups a CTA left in flight."""
    steps = (len(order) + BMAX - 1) // BMAX
    grams = np.full((steps, BMAX, BMAX), np.nan, dtype=np.float32)
    gramh = np.full((V8_LAG - 1, steps, BMAX, BMAX), np.nan, dtype=np.float32)
    left = lib.gram_v8_epoch_host(ptr(x), ptr(order), len(order), BMAX, ptr(grams), ptr(gramh),
                                  bug)
    return grams, gramh, left


def v8_expected(x, order):
    """chain_inputs(..., lag=6)'s Γ̃ (float64 X̃ X̃ᵀ with the 255 pixel, rounded once to fp32, 0
    outside valid pairs and for t < j): the arrays the v8 probes read."""
    from fasttrain.ladder.v8_chain import chain_inputs

    rng = np.random.default_rng(1)
    y = rng.integers(0, 10, size=len(x)).astype(np.int64)
    w0 = np.zeros((10, 784), np.float32)
    inp = chain_inputs(x, y, order, w0, np.zeros(10, np.float32), 0.01, lag=V8_LAG)
    return inp["grams"], inp["gramh"]


@pytest.mark.parametrize("n", V8_EPOCHS)
def test_v8_grams_equal_the_probes_numpy_grams(lib, n):
    x, order = epoch_data(n)
    grams, gramh, left = v8_host_grams(lib, x, order)
    want_g, want_h = v8_expected(x, order)
    assert left == 0, "every cp.async group waited for"
    np.testing.assert_array_equal(grams, want_g)
    np.testing.assert_array_equal(gramh, want_h)


@pytest.mark.parametrize("bug", [3, 4, 5])
def test_a_planted_v8_bug_fails(lib, bug):
    """3: the bias byte 0 (Γ̃ = Γ: off by 255² on valid pairs); 4: lag 4 reads X_{t−3}'s rows;
    5: the zero-filled copies leave stale bytes (Γ̃ ≠ 0 past the partial batch)."""
    x, order = epoch_data(V8_EPOCHS[0])
    grams, gramh, _ = v8_host_grams(lib, x, order, bug=bug)
    want_g, want_h = v8_expected(x, order)
    assert not (np.array_equal(grams, want_g) and np.array_equal(gramh, want_h))



class HostGramLib:
    """csrc/v8_chain.cu's v8_grams_run over the host emulation (device="cpu" tensors are host
    memory): ladder/v8_grams.py's plumbing (argument order, layouts, shapes) checked on the CPU."""

    def __init__(self, harness, bug=0):
        self.harness, self.bug = harness, bug

    def v8_grams_run(self, x, order, n, grams, gramh, stream):
        assert stream is None
        return self.harness.gram_v8_epoch_host(x, order, n, BMAX, grams, gramh, self.bug)


def test_gpu_grams_plumbing_over_the_host_emulation(lib):
    from fasttrain.ladder import v8_chain, v8_grams

    x, order = epoch_data(V8_EPOCHS[1])
    want_g, want_h = v8_expected(x, order)
    inp = {"x_u8": x, "order": order}
    grams, gramh = v8_grams.gpu_grams(HostGramLib(lib), inp, device="cpu")
    np.testing.assert_array_equal(grams.numpy(), want_g)
    np.testing.assert_array_equal(gramh.numpy(), want_h)
    grams, gramh = v8_grams.gpu_grams(HostGramLib(lib, bug=4), inp, device="cpu")
    assert not np.array_equal(gramh.numpy(), want_h)
    with pytest.raises(ValueError, match="x_u8 and order"):
        v8_grams.gpu_grams(HostGramLib(lib), {"grams": want_g}, device="cpu")
    with pytest.raises(ValueError, match=r"^grams must be one of \('numpy', 'gpu'\), got 'cuda'$"):
        v8_chain.measure(object(), inp={"grams": 0, "pq": 0, "labels": 0, "n": 1, "c": 0},
                         grams="cuda")


def _gpu_lib():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from fasttrain.ladder import v8_chain

    return v8_chain.load_library()


@pytest.fixture(scope="module")
def mnist_v8():
    """chain_inputs(..., lag=6) of MNIST's first epoch (469 steps, the last of 96)."""
    from tests.conftest import real_data_dir

    _gpu_lib()  # skip before ~10 s of NumPy without a GPU
    if real_data_dir() is None:
        pytest.skip("set FASTTRAIN_DATA to a folder holding mnist/ to run")
    from fasttrain.ladder import v8_chain

    return v8_chain.mnist_epoch()


@pytest.mark.gpu
def test_v8_gpu_grams_equal_numpys_over_an_mnist_epoch(mnist_v8):
    from fasttrain.ladder import v8_grams

    lib = _gpu_lib()
    grams, gramh = v8_grams.gpu_grams(lib, mnist_v8)
    np.testing.assert_array_equal(grams.cpu().numpy(), mnist_v8["grams"])
    np.testing.assert_array_equal(gramh.cpu().numpy(), mnist_v8["gramh"])


@pytest.mark.gpu
def test_v8_measure_with_gpu_grams_gives_finite_microseconds(mnist_v8):
    from fasttrain.ladder import v8_chain

    r = v8_chain.measure(_gpu_lib(), repeats=2, inp=mnist_v8, grams="gpu")
    u = r["grams_gpu"]["us_per_epoch"]
    assert 0 < u["min"] <= u["max"] < 1e5 and r["grams_gpu"]["equal_numpy"], r["grams_gpu"]
    assert r["check"]["g_max_abs_err"] <= 1e-6, r["check"]
    print("\n".join(v8_chain.describe(r)))
