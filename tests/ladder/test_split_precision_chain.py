"""cuda-epoch v8's one-SM chain numerics (tests/ladder/split_precision.py): the bias folded into the
Grams is the same algebra as plain SGD (float64, planted bug fails); the TF32 emulation rounds as
the hardware does; the chain's Gram products in 3xTF32 or 3xFP16 (the design's choice) stay as
close to float64 SGD as the fp32 SIMT chain (v7's arithmetic), and 1xTF32 does not — though the
row's FP32_ATOL cannot tell; the critical product compiles for sm_90a to the budget's mma."""

import dataclasses

import numpy as np
import pytest

from fasttrain.ladder.check import FP32_ATOL
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import real_data_dir, requires_mnist
from tests.ladder import split_precision as sp
from tests.ladder.test_ladder import reference_sgd
from tests.ladder.test_lagged_gram import EXACT_ATOL, max_err, random_uint8

PRODUCT_ATOL = 1e-7
"""max |w − w(fp32 SIMT chain)| allowed to a tensor-core scheme: what the product itself adds.
Measured on the 31-step MNIST slice at L = 4 (split_precision.main's configs): 3xTF32 1.5e-8 to
4.5e-8, 3xFP16 2.2e-8 to 3.0e-8 (subnormals kept or flushed), 1xTF32 6.6e-7 to 6.7e-6, 3xTF32
with the logits in a truncating accumulator 4.5e-7; 3xFP16 with B unscaled (p − y) and A = Γ̃·2⁻¹⁶
and subnormals flushed (a build not kept) 4.8e-7."""

F32 = np.float32


def bits(x):
    return np.array(x, dtype=F32)


@pytest.mark.parametrize("rounding, tie_up, tie_odd, carry", [
    # 1 + 2⁻¹¹ is half a TF32 ulp above 1: a tie. 1 + 3·2⁻¹¹ a tie between an odd and an even.
    ("rna", 1 + 2**-10, 1 + 2**-9, 2.0),
    ("rne", 1.0, 1 + 2**-9, 2.0),
    ("rz", 1.0, 1 + 2**-10, 2 - 2**-10),
])
def test_tf32_rounding(rounding, tie_up, tie_odd, carry):
    x = bits([1 + 2**-11, 1 + 3 * 2**-11, 2 - 2**-23, 1 + 2**-11 - 2**-23])
    got = sp.tf32(x, rounding)
    assert got.tolist() == [tie_up, tie_odd, carry, 1.0]
    assert sp.tf32(-x, rounding).tolist() == (-got).tolist()  # sign-magnitude: symmetric
    assert (got.view(np.uint32) & 0x1FFF == 0).all()
    special = sp.tf32(bits([np.inf, -np.inf, 0.0]), rounding)
    assert special.tolist() == [np.inf, -np.inf, 0.0]
    assert np.isnan(sp.tf32(bits([np.nan]), rounding)).all()


@pytest.mark.parametrize("big", ["rna", "rz"])
def test_split_carries_22_bits(big):
    x = np.random.default_rng(0).standard_normal(100_000).astype(F32) * F32(1e-3)
    hi, lo = sp.split(x, big)
    rel = np.abs(x.astype(np.float64) - hi - lo) / np.abs(x)
    assert rel.max() <= 2.0**-21
    assert np.abs(x.astype(np.float64) - hi).max() / np.abs(x).max() > 2.0**-13  # 1 piece: ~11 bits


def test_mma_emulation():
    rng = np.random.default_rng(1)
    # TF32-exact operands (small integers): every scheme and rounding gives the exact sum.
    a = rng.integers(-1000, 1000, (16, 40)).astype(F32)
    b = rng.integers(-1000, 1000, (40, 8)).astype(F32)
    acc = rng.integers(-1000, 1000, (16, 8)).astype(F32)
    want = acc.astype(np.float64) + a.astype(np.float64) @ b
    for pairs in sp.SCHEMES.values():
        for accumulate in ("rn", "rz"):
            assert (sp.mma_tf32(acc, a, b, pairs, "rz", accumulate) == want).all()
    # Gram-like operands: 3xTF32 ~ fp32 rounding, 1xTF32 ~ 2⁻¹¹.
    g = rng.integers(0, 50_000_000, (128, 128)).astype(F32)
    gp = (rng.standard_normal((128, 10)) * 1e-7).astype(F32)
    exact = g.astype(np.float64) @ gp
    scale = np.abs(g.astype(np.float64)) @ np.abs(gp.astype(np.float64))
    zero = np.zeros((128, 10), F32)
    err3 = (np.abs(sp.mma_tf32(zero, g, gp, sp.SCHEMES["3xTF32"]) - exact) / scale).max()
    err1 = (np.abs(sp.mma_tf32(zero, g, gp, sp.SCHEMES["1xTF32"]) - exact) / scale).max()
    assert err3 < 2**-20 < 2**-14 < err1
    g_rows = (rng.standard_normal((128, 10)) * 1e-2).astype(F32)  # G: (p − y) / n
    c = 0.1 / 255**2
    got = sp.mma_3xfp16(zero, g, g_rows, c)
    want16 = g.astype(np.float64) @ (-c * g_rows.astype(np.float64))
    assert (np.abs(got - want16) / (c * (np.abs(g.astype(np.float64)) @ np.abs(g_rows)))).max() \
        < 2**-20


@pytest.mark.parametrize("lag", [1, 4, 13])
def test_folded_bias_chain_equals_plain_sgd_in_float64(lag):
    # The bias as a 785th pixel of 255: no bias term left in the lagged step, the same SGD.
    cfg = LadderConfig(epochs=2)
    data = make_ladder_data(random_uint8(10 * 128 + 96), cfg)
    err = max_err(sp.chain_sgd(data, cfg, lag, "float64", epochs=2), reference_sgd(data, cfg, 2))
    assert err <= EXACT_ATOL, f"lag {lag}: {err:.3g} from plain SGD"


def test_planted_bug_gram_without_the_bias_pixel_fails(monkeypatch):
    real = sp.epoch_grams
    monkeypatch.setattr(sp, "epoch_grams", lambda xa, *a: real(xa[:, :784], *a))
    cfg = LadderConfig(epochs=1)
    data = make_ladder_data(random_uint8(8 * 128), cfg)
    err = max_err(sp.chain_sgd(data, cfg, 4, "float64"), reference_sgd(data, cfg, 1))
    assert err > 1e3 * EXACT_ATOL


def mnist_slice(n):
    from fasttrain.data import load_dataset

    mnist = load_dataset("mnist", real_data_dir())
    mnist = dataclasses.replace(mnist, train_x=mnist.train_x[:n], train_y=mnist.train_y[:n])
    return make_ladder_data(mnist, LadderConfig(epochs=1))


def chain_errors(data, lag, names):
    """{config: (max |w − w_float64 SGD|, max |w − w_fp32 SIMT chain|)} after one epoch."""
    cfg = LadderConfig(epochs=1)
    want = reference_sgd(data, cfg, 1)
    grams = [sp.epoch_grams(sp.augmented(data.train_x), data.orders[0], cfg.batch_size, lag, F32)]
    base = sp.chain_sgd(data, cfg, lag, "fp32", grams=grams)
    out = {}
    for name in names:
        scheme, big, acc, from_zero = sp.CONFIGS[name]
        got = sp.chain_sgd(data, cfg, lag, scheme, big=big, accumulate=acc, from_zero=from_zero,
                           grams=grams)
        out[name] = (max_err(got, want), max_err(got, base))
    return out


# The 3x schemes under the pessimistic models only (truncating accumulation, subnormals flushed):
# their rn variants were as close or closer (split_precision.main; the design page's table).
FP32_LIKE = ["3xTF32, big truncated, acc rz, from 0", "3xFP16 (scaled), acc rz, subnormals flushed"]
NOT_FP32_LIKE = ["1xTF32, rna, acc rn", "1xTF32, operands truncated, acc rz",
                 "3xTF32, big truncated, acc rz"]


@requires_mnist
def test_3x_chains_are_fp32_accurate_and_1xtf32_is_not():
    errs = chain_errors(mnist_slice(30 * 128 + 96), 4, FP32_LIKE + NOT_FP32_LIKE)
    for name in FP32_LIKE:
        to_sgd, to_fp32 = errs[name]
        assert to_sgd <= FP32_ATOL and to_fp32 <= PRODUCT_ATOL, (name, errs[name])
    for name in NOT_FP32_LIKE:
        to_sgd, to_fp32 = errs[name]
        assert to_fp32 > PRODUCT_ATOL, (name, errs[name])
        # The row's one-step/cross-check tolerance is blind to it: 1xTF32 would pass the checks.
        assert to_sgd <= FP32_ATOL, (name, errs[name])


MMA_SASS = {1: ("HMMA.1688.F32.TF32", 16), 3: ("HMMA.1688.F32.TF32", 48),
            4: ("HMMA.16816.F32", 24)}
"""A warp's mma for the critical product in csrc/v8_chain_mma.cu (1xTF32, 3xTF32, 3xFP16): one m16
tile × half of K (64) × both n8 tiles, times the products a k-step (1 or 3)."""


def test_the_chain_product_compiles_to_the_budgets_mma_counts(tmp_path):
    """nvcc for sm_90a (~2 CPU-s): no spill, ≤ 128 registers (512 threads a CTA), and, where
    Triton ships cuobjdump, the SASS's HMMA count a warp (what the design's budget counts)."""
    import re
    from pathlib import Path

    from tests.ladder.host_harness import compile_sm90, registers, sass_functions

    report, cubin = compile_sm90(Path(__file__).parent / "csrc" / "v8_chain_mma.cu", tmp_path)
    for scheme in MMA_SASS:
        assert max(registers(report, rf"v8_chain_productILi{scheme}E")) <= 128, scheme
    functions = sass_functions(cubin)
    for scheme, (op, count) in MMA_SASS.items():
        name = f"_Z16v8_chain_productILi{scheme}E"
        body = next(b for n, b in functions.items() if n.startswith(name))
        assert len(re.findall(rf"\b{re.escape(op)}\b", body)) == count, (scheme, op)
