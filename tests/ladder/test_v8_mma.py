"""cuda-epoch v8's tensor-core product on the CPU (csrc/v8_mma.cuh, csrc/v8_mma_host.h under tests):
the m16n8k16 fragment maps cover each matrix once, the host's mma equals float64 arithmetic
rounded once to float32 (to nearest, or toward zero), and the hi/lo fp16 split keeps 22 bits.
The kernels that load fragments through these maps run on the host through this emulation, so
these tests are what makes their CPU checks mean anything."""

import ctypes

import numpy as np
import pytest

from tests.ladder.host_harness import compile_harness, ptr


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = compile_harness("tests/ladder/csrc/v8_mma_host.cu", tmp_path_factory.mktemp("v8mma"))
    lib.v8_mma_ref.restype = ctypes.c_int
    return lib


def _mma(lib, a, b, c, rz=False):
    a, b, c = (np.ascontiguousarray(m, dtype=np.float32) for m in (a, b, c))
    d = np.empty((16, 8), np.float32)
    assert lib.v8_mma_ref(ptr(a), ptr(b), ptr(c), int(rz), ptr(d)) == 0, "maps overlap"
    return d


def _fp16_exact(rng, shape, scale):
    return (rng.standard_normal(shape) * scale).astype(np.float16).astype(np.float32)


def test_the_mma_is_the_exact_product_rounded_once(lib):
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = _fp16_exact(rng, (16, 16), 10.0 ** rng.integers(-3, 4))
        b = _fp16_exact(rng, (16, 8), 10.0 ** rng.integers(-3, 4))
        c = rng.standard_normal((16, 8)).astype(np.float32)
        exact = a.astype(np.float64) @ b.astype(np.float64) + c  # exact: < 53 bits apart here
        np.testing.assert_array_equal(_mma(lib, a, b, c), exact.astype(np.float32))


def test_toward_zero_truncates_and_differs_from_nearest(lib):
    rng = np.random.default_rng(1)
    a, b = _fp16_exact(rng, (16, 16), 1.0), _fp16_exact(rng, (16, 8), 1.0)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64) + c
    rz = _mma(lib, a, b, c, rz=True).astype(np.float64)
    assert np.all(np.abs(rz) <= np.abs(exact)), "rz never rounds away from zero"
    assert np.all(np.abs(exact - rz) < np.spacing(np.abs(rz).astype(np.float32)))
    assert np.any(rz != _mma(lib, a, b, c)), "with 128 sums some round differently"


def test_each_element_lands_where_the_ptx_layout_puts_it(lib):
    """A one-hot A and B pick one product: D[i, n] = A[i, k] · B[k, n] for that (i, k, n) alone,
    so a swapped row/column map anywhere would move the 1."""
    for i, k, n in [(0, 0, 0), (3, 9, 5), (8, 15, 7), (15, 2, 1), (9, 8, 4)]:
        a, b = np.zeros((16, 16)), np.zeros((16, 8))
        a[i, k], b[k, n] = 2.0, 3.0
        d = _mma(lib, a, b, np.zeros((16, 8)))
        want = np.zeros((16, 8), np.float32)
        want[i, n] = 6.0
        np.testing.assert_array_equal(d, want)


def test_the_split_keeps_22_bits(lib):
    """Where neither piece is subnormal (|x| ≥ 2⁻³, as the kernels' scales keep their operands)."""
    rng = np.random.default_rng(2)
    x = (rng.choice([-1, 1], 4096) * 2.0 ** rng.uniform(-3, 15, 4096)).astype(np.float32)
    hi, lo = np.empty_like(x), np.empty_like(x)
    lib.v8_split_ref(ptr(x), len(x), ptr(hi), ptr(lo))
    np.testing.assert_array_equal(hi, x.astype(np.float16).astype(np.float32))
    rel = np.abs((hi.astype(np.float64) + lo) - x) / np.abs(x)
    assert rel.max() < 2.0 ** -21 and rel.max() > 0, rel.max()


@pytest.mark.parametrize("width", [4, 8, 32])
def test_butterflies_sum_each_segment_of_lanes(lib, width):
    """A row's classes sit in a quad of lanes in the accumulator layout: the softmax's butterflies
    at width 4 must sum a quad and nothing else."""
    v = (np.arange(32) ** 2).astype(np.float32)
    out = np.empty(32, np.float32)
    lib.v8_butterfly_sum_ref(ptr(v), width, ptr(out))
    np.testing.assert_array_equal(out, np.repeat(v.reshape(-1, width).sum(1), width))


@pytest.mark.parametrize("mask,width", [(1, 4), (4, 4), (16, 8), (16, 32)])
def test_a_partner_in_a_later_segment_leaves_the_lane_its_own_value(lib, mask, width):
    """CUDA's __shfl_xor_sync: a lane may read an earlier segment, never a later one (there it
    gets its own value): PTX's bfly keeps j = lane ^ mask only while j ≤ the segment's last lane."""
    v = np.arange(32, dtype=np.float32)
    out = np.empty(32, np.float32)
    lib.v8_shfl_xor_ref(ptr(v), mask, width, ptr(out))
    lane = np.arange(32)
    j, last = lane ^ mask, lane | (width - 1)
    want = np.where(j <= last, j, lane)
    np.testing.assert_array_equal(out, want)
