"""cuda-epoch v5's tensor-core arithmetic on the CPU: its tile code (`csrc/epoch_v5_math.cuh`)
compiled by nvcc for the host against a stand-in of the WMMA API that does what the API is
documented to do on whole tiles and counts breaches of its alignment rules
(`csrc/wmma_host.h`), on a shared-memory image laid out as the kernel lays it out. One step of
one CTA's share against float64: the partial logits, the gradient and update, the bias, and the
next step's logits from the re-split weights. What it cannot check (the fragment layouts inside
the GPU's MMA, the signals) the GPU tests of test_cuda_epoch.py do."""

import ctypes

import numpy as np
import pytest

from tests.ladder.host_harness import compile_harness, ptr

HARNESS = "tests/ladder/csrc/epoch_v5_math_host.cu"
C, K = 10, 784
SLOT = np.array([c + 3 * (c >= 5) for c in range(C)])  # v3's record layout: classes 0-4, 8-12


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = compile_harness(HARNESS, tmp_path_factory.mktemp("v5"))
    p = ctypes.c_void_p
    lib.v5_step.argtypes = [ctypes.c_int, ctypes.c_int, p, ctypes.c_int, p, p, p, p, p, p, p, p]
    lib.v5_split.argtypes = [p, ctypes.c_int, p]
    return lib



def step(lib, ctas, rows, buffer=0, seed=0):
    """Inputs of one step, the harness's outputs, and their float64 references."""
    f = K // ctas
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (rows, f), dtype=np.uint8)
    w = rng.normal(0, 0.05, (C, f)).astype(np.float32)
    b = rng.normal(0, 0.1, C).astype(np.float32)
    g = np.zeros((rows, 16), np.float32)  # lr * dL/dz by slot, 0 in the pad slots
    g[:, SLOT] = rng.normal(0, 1e-3, (rows, C))
    dbp = np.zeros((ctas, 16), np.float32)
    dbp[:, SLOT] = rng.normal(0, 1e-3, (ctas, C))
    logits, after = np.full((rows, 16), np.nan, np.float32), np.full((rows, 16), np.nan, np.float32)
    w_out, b_out = np.full_like(w, np.nan), np.full_like(b, np.nan)
    bad = lib.v5_step(ctas, buffer, ptr(x), rows, ptr(w), ptr(b), ptr(g), ptr(dbp), ptr(logits),
                      ptr(w_out), ptr(b_out), ptr(after))
    x64 = x.astype(np.float64)
    ref_w = w - (g[:, SLOT].astype(np.float64).T @ x64) / 255
    ref = {"logits": x64 @ w.astype(np.float64).T, "w": ref_w, "w0": w,
           "b": b - dbp[:, SLOT].astype(np.float64).sum(0),
           "after": x64 @ w_out.astype(np.float64).T}
    got = {"logits": logits[:, SLOT], "w": w_out, "b": b_out, "after": after[:, SLOT]}
    return bad, got, ref, (logits, after)


@pytest.mark.parametrize("ctas", [14, 7])
@pytest.mark.parametrize(("rows", "buffer"), [(128, 0), (70, 1), (16, 0), (1, 1)])
def test_one_step_equals_float64_to_fp32_rounding(lib, ctas, rows, buffer):
    bad, got, ref, (logits, after) = step(lib, ctas, rows, buffer)
    assert bad == 0, "a WMMA load or store broke the API's alignment or ldm rules"
    # Partial logits are sums of F products of pixels (<= 255) and weights: fp32 rounding of such
    # a sum is ~1e-7 of its terms' magnitudes; a wrong row, feature or part is off by whole terms.
    scale = np.abs(ref["logits"]).max()
    np.testing.assert_allclose(got["logits"], ref["logits"], rtol=0, atol=2e-6 * scale)
    np.testing.assert_allclose(got["after"], ref["after"], rtol=0, atol=2e-6 * scale)
    np.testing.assert_array_equal(logits[:, [5, 6, 7, 13, 14, 15]], 0)  # pad slots stay 0
    np.testing.assert_array_equal(after[:, [5, 6, 7, 13, 14, 15]], 0)
    np.testing.assert_allclose(got["w"], ref["w"], rtol=0, atol=1e-7)  # |w| ~ 0.05-0.2
    np.testing.assert_allclose(got["b"], ref["b"], rtol=0, atol=1e-7)


def test_the_update_is_not_lost_in_rounding(lib):
    # The tolerance above tells an update from none: the gradient moves w by far more.
    _, got, ref, _ = step(lib, 14, 128)
    assert np.abs(got["w"] - ref["w0"]).max() > 1e3 * 1e-7


def test_three_bf16_parts_carry_a_float32(lib):
    rng = np.random.default_rng(1)
    v = np.concatenate([rng.normal(0, 1, 4000), rng.normal(0, 1e-6, 1000),
                        [0.0, 1.0, -1.0, 1e38, -1e-30, 1.17549435e-38]]).astype(np.float32)
    parts = np.empty((v.size, 3), np.float32)
    lib.v5_split(ptr(v), v.size, ptr(parts))
    total = parts.astype(np.float64).sum(1)
    assert np.all(np.abs(total - v) <= 2.0 ** -24 * np.abs(v.astype(np.float64)))
    # Each part is a bf16: no bits below the top 16 of its float.
    assert not np.any(parts.view(np.uint32) & 0xFFFF)


def test_the_stand_in_counts_misaligned_tiles(lib):
    lib.v5_misaligned_load_violations.restype = ctypes.c_int
    assert lib.v5_misaligned_load_violations() == 1
