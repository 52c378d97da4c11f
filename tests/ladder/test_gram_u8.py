"""The lagged-Gram producer's tiles (csrc/gram_u8.cuh): the kernel's own warp code run on the CPU
for its whole grid, lanes in lockstep, mma.m16n8k32 .u8 emulated from the PTX ISA's fragment
layout (tests/ladder/csrc/gram_u8_host.cu), against the reference Grams of
tests/ladder/lagged_reference.py — equal, not close: u8 × u8 → s32 is exact. On a GPU, the kernel
itself (csrc/gram_u8.cu) against the same reference."""

import ctypes

import numpy as np
import pytest

from tests.ladder import lagged_reference as ref
from tests.ladder.host_harness import compile_harness, ptr

HARNESS = "tests/ladder/csrc/gram_u8_host.cu"
SHAPES = [(128, 128), (128, 96), (96, 128), (16, 8), (17, 33), (1, 1)]
"""A full step's Gram, the last partial batch of 96 on either side, one mma tile, and sizes that
leave warps and lanes past the batch."""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = compile_harness(HARNESS, tmp_path_factory.mktemp("gram"))
    p, i32 = ctypes.c_void_p, ctypes.c_int
    lib.gram_u8_host.argtypes = [p, p, i32, p, i32, p]
    lib.gram_u8_host.restype = None
    return lib



def batches(na, nb, seed=0, n=600):
    """Pixels of n rows and two gathered batches of their indices (repeats allowed, as a row
    seen in two steps of an epoch never is but the kernel must not care)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 784), dtype=np.uint8)
    x[0] = 255  # the largest Gram entry, 784 · 255² = 50,979,600, must not overflow
    rows_a = rng.integers(0, n, size=na).astype(np.int32)
    rows_b = rng.integers(0, n, size=nb).astype(np.int32)
    rows_a[0] = rows_b[0] = 0
    return x, rows_a, rows_b


def host_gram(lib, x, rows_a, rows_b):
    out = np.full((len(rows_a), len(rows_b)), -1, dtype=np.int32)  # -1: never written
    lib.gram_u8_host(ptr(x), ptr(rows_a), len(rows_a), ptr(rows_b), len(rows_b), ptr(out))
    return out


@pytest.mark.parametrize("na,nb", SHAPES)
def test_host_tiles_equal_the_reference_gram(lib, na, nb):
    x, rows_a, rows_b = batches(na, nb)
    want = ref.gram(x[rows_a], x[rows_b]).astype(np.int64)
    got = host_gram(lib, x, rows_a, rows_b)
    assert (got != -1).all(), "every entry is written"
    assert want[0, 0] == 784 * 255**2
    np.testing.assert_array_equal(got, want)


def test_host_tiles_give_the_grams_of_a_lagged_step(lib):
    # Γ_{t,j} = X_t X_{t−j}ᵀ of the epoch's order, as the producer role computes them.
    x, _, _ = batches(1, 1, n=1000)
    order = np.random.default_rng(1).permutation(1000).astype(np.int32)
    t_rows, prev_rows = order[512:640], order[384:512]
    np.testing.assert_array_equal(host_gram(lib, x, t_rows, prev_rows),
                                  ref.gram(x[t_rows], x[prev_rows]))


@pytest.mark.gpu
@pytest.mark.parametrize("na,nb", SHAPES)
def test_kernel_equals_the_reference_gram(na, nb):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("integer mma.sync needs sm_80+")
    from fasttrain.ladder import build

    lib = build.load("gram_u8.cu")
    p, i32 = ctypes.c_void_p, ctypes.c_int
    lib.lagged_gram_u8.argtypes = [p, p, i32, p, i32, p, p]
    x, rows_a, rows_b = batches(na, nb)
    dx, da, db = (torch.from_numpy(a).cuda() for a in (x, rows_a, rows_b))
    out = torch.full((na, nb), -1, dtype=torch.int32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    status = lib.lagged_gram_u8(dx.data_ptr(), da.data_ptr(), na, db.data_ptr(), nb,
                                out.data_ptr(), stream)
    assert status == 0
    np.testing.assert_array_equal(out.cpu().numpy(), ref.gram(x[rows_a], x[rows_b]))
