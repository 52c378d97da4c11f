"""The one-SM chain of cuda-epoch v8 in NumPy: its Gram products on the tensor cores in TF32, split
so that the sums stay fp32-accurate (design: docs/measurements/cuda-epoch-v8-design.md). Not a
ladder row; a reference for the numerics a v8 kernel would have, checked against float64 SGD.

What the chain computes (the lagged algebra of `lagged_reference`, with the bias folded in):
every row gets a constant 785th pixel of 255, and W̃ [785, 10] holds the bias as its last row, so
X̃_t W̃ / 255 = X_t W / 255 + b. The lagged step then has no bias term of its own:

    Z_t = X̃_t W̃_s / 255 + Σ_{j=1..t−s} Γ̃_{t,j} G'_{t−j},   Γ̃_{t,j} = X̃_t X̃_{t−j}ᵀ = Γ_{t,j} + 255²,
    G'_k = −c G_k,  c = lr/255²

(since lr = c·255², the bias's lagged correction −lr Σ_j 1ᵀ G_{t−j} is the 255² in Γ̃). Γ̃ stays
an exact integer below 2²⁶ (785 · 255² = 51,044,625); the Gram kernel writes it rounded once to
fp32, as v7's do. One accumulator a row: it starts as the workers' partial P_t = X̃_t W̃_s / 255,
takes the terms j = L … 2 (helper warps, a step ahead) and last j = 1 (the critical one), and ends
as Z_t: the mma's C operand is P_t, its D is Z_t.

TF32 (1 sign, 8 exponent, 10 explicit mantissa bits), emulated on float32 bit patterns:
- `cvt.rna.tf32.f32` rounds to nearest, ties away from zero (PTX ISA: .rna); its SASS on sm_80 is
  an integer add of 0x1000 and a mask of 0xffffe000 (`tf32(x, "rna")` does exactly that);
- an mma.sync .tf32 operand that was not converted is read from its top 19 bits: truncation
  (`tf32(x, "rz")`; CUTLASS's round_toward_zero conversion to tfloat32_t is that mask, and its
  fast-fp32 path feeds unconverted "big" values to the mma).
The products of two TF32 values are exact in fp32 (11 × 11 significant bits). The accumulation of
one m16n8k8 (8 products and C) is modelled as exact, then rounded once to fp32: to nearest ("rn")
or toward zero ("rz": NVIDIA does not document it; tensor cores were measured to truncate on
Volta–Ampere by Fasi et al. 2021, SIAM J. Sci. Comput.). The tests hold the chosen scheme under
both.
"""

from __future__ import annotations

import numpy as np

from fasttrain.ladder.common import LadderConfig, LadderData, batches
from tests.ladder.lagged_reference import lag_window, softmax_grad

K_MMA = 8  # mma.sync.m16n8k8 .tf32: 8 products of a row and a column a call
BIAS_PIXEL = 255
"""The constant 785th pixel: X̃ W̃ / 255 adds W̃[784] = b to every row."""

# The products a scheme issues into one accumulator, per k-step, in order: (piece of Γ̃, piece of
# G'), piece 0 the big TF32 part, 1 the small one (x − big, rounded again). The small products
# first, as CUTLASS's 3xTF32 does, so that the big one is added to the largest partial sum last.
SCHEMES = {
    "1xTF32": ((0, 0),),
    "2xTF32 (G' split)": ((0, 1), (0, 0)),
    "2xTF32 (Γ̃ split)": ((1, 0), (0, 0)),
    "3xTF32": ((1, 0), (0, 1), (0, 0)),
}


def tf32(x: np.ndarray, rounding: str) -> np.ndarray:
    """float32 `x` rounded to TF32 (kept as float32 with the 13 low mantissa bits zero): "rna" as
    cvt.rna.tf32.f32, "rne" to nearest even, "rz" as an unconverted mma operand (truncation)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    if rounding == "rna":  # 0x1000 is half a TF32 ulp: a carry into the exponent is correct too
        bits = bits + np.uint32(0x1000)
    elif rounding == "rne":
        bits = bits + np.uint32(0x0FFF) + ((bits >> np.uint32(13)) & np.uint32(1))
    elif rounding != "rz":
        raise ValueError(f"unknown TF32 rounding {rounding!r}")
    finite = np.isfinite(x)
    out = np.where(finite, bits & np.uint32(0xFFFFE000), x.view(np.uint32))
    return out.astype(np.uint32).view(np.float32)


def split(x: np.ndarray, big: str = "rna") -> tuple[np.ndarray, np.ndarray]:
    """(big, small): big = tf32(x), small = tf32(x − big) with rna (x − big is exact in fp32), so
    big + small carries ~22 of x's 24 significant bits."""
    x = np.asarray(x, dtype=np.float32)
    hi = tf32(x, big)
    return hi, tf32(x - hi, "rna")


def round_fp32(x64: np.ndarray, accumulate: str) -> np.ndarray:
    """float64 sums rounded once to fp32: "rn" to nearest even, "rz" toward zero."""
    f = x64.astype(np.float32)
    if accumulate == "rz":
        over = np.abs(f.astype(np.float64)) > np.abs(x64)
        f[over] = np.nextafter(f[over], np.float32(0))
    elif accumulate != "rn":
        raise ValueError(f"unknown accumulation rounding {accumulate!r}")
    return f


def mma(acc, pieces_a, pieces_b, pairs, k_mma, accumulate="rn"):
    """acc [m, n] fp32 + Σ_pairs a_i @ b_j as a warp's chain of mma.sync calls of depth `k_mma`
    along K: per k-step one mma per (i, j) in `pairs`, each adding its exact products and the
    accumulator exactly, then rounding once to fp32 (`accumulate`). K is zero-padded."""
    pad = -pieces_a[0].shape[1] % k_mma
    m, n = pieces_a[0].shape[0], pieces_b[0].shape[1]
    steps = (pieces_a[0].shape[1] + pad) // k_mma
    pa = [np.pad(p.astype(np.float64), ((0, 0), (0, pad))).reshape(m, steps, k_mma)
          .transpose(1, 0, 2) for p in pieces_a]
    pb = [np.pad(p.astype(np.float64), ((0, pad), (0, 0))).reshape(steps, k_mma, n)
          for p in pieces_b]
    sums = {(i, j): pa[i] @ pb[j] for i, j in pairs}  # [steps, m, n], exact
    acc = np.asarray(acc, np.float32).copy()
    for k in range(steps):
        for pair in pairs:
            acc = round_fp32(acc.astype(np.float64) + sums[pair][k], accumulate)
    return acc


def mma_tf32(acc, a, b, pairs, big="rna", accumulate="rn"):
    """acc + a @ b by m16n8k8 .tf32 mma.sync: a, b fp32, split by `split(·, big)`; the mma reads
    the top 19 bits of each operand register (tf32 "rz": a no-op on TF32 values)."""
    pieces = [[tf32(p, "rz") for p in split(np.asarray(x, np.float32), big)] for x in (a, b)]
    return mma(acc, *pieces, pairs, K_MMA, accumulate)


def split_fp16(x: np.ndarray, ftz: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) fp16 (as float32): hi = fp16(x), lo = fp16(x − hi), both to nearest even; `ftz`
    flushes fp16 subnormals (|v| < 2⁻¹⁴) to zero, in case the tensor core does."""
    x = np.asarray(x, np.float32)
    hi = x.astype(np.float16).astype(np.float32)
    lo = (x - hi).astype(np.float16).astype(np.float32)
    if ftz:
        tiny = np.float32(2.0**-14)
        hi, lo = (np.where(np.abs(v) < tiny, np.float32(0), v) for v in (hi, lo))
    return hi, lo


FP16_GRAM_SCALE = np.float32(2.0**-12)
"""Γ̃ (an integer in [255², 2²⁶)) times 2⁻¹²: in [15.9, 12,462], inside fp16's range (65,504), and
its lo piece a multiple of 2⁻¹² (normal in fp16), so a flush of subnormals loses nothing."""
FP16_G_SCALE = np.float32(2.0**12)
"""p − y ∈ [−1, 1] times 2¹²: what a flush of subnormals would lose is below 2⁻²⁶ of it."""


def mma_3xfp16(acc, gram, g, c, accumulate="rn", ftz=False):
    """acc + Γ̃ (−c G) by m16n8k16 .f16 mma.sync (fp32 accumulation), fp32-accurate: A = Γ̃·2⁻¹²
    and B = (p − onehot)·2¹² = n G·2¹², each split in two fp16 pieces (~22 bits), three products
    from 0, then scaled once by −c/n and added to acc in fp32. The exact bound |p − y| ≤ 1 is what
    lets fixed scales replace TF32's exponent range."""
    n = g.shape[0]
    b = np.asarray(g, np.float32) * np.float32(n) * FP16_G_SCALE  # the kernel's (p − y)·2¹²
    s = mma(np.zeros_like(acc), split_fp16(gram * FP16_GRAM_SCALE, ftz), split_fp16(b, ftz),
            SCHEMES["3xTF32"], 16, accumulate)
    return acc + np.float32(-c / n) * s


def product(scheme: str, big: str = "rna", accumulate: str = "rn", from_zero: bool = False):
    """prod(acc, Γ̃, G, c) = acc + Γ̃ (−c G) under `scheme`: a SCHEMES name (TF32 tensor cores on
    G' = fl32(−c G)), "3xFP16" (`mma_3xfp16`), "fp32" (SIMT fp32, v7's arithmetic: NumPy's sgemm)
    or "float64" (the algebra). `from_zero`: the mma chain starts from 0 and its sum is added to
    acc by one fp32 add (RN), so the accumulator the tensor core rounds holds the small Gram terms
    only, not the logits."""
    if scheme == "float64":
        return lambda acc, gram, g, c: acc + gram.astype(np.float64) @ (-c * g)
    if scheme == "fp32":
        return lambda acc, gram, g, c: acc + gram @ (-c * g).astype(np.float32)
    if scheme.startswith("3xFP16"):  # "3xFP16 ftz": fp16 subnormals flushed
        return lambda acc, gram, g, c: mma_3xfp16(acc, gram, g, c, accumulate, "ftz" in scheme)
    pairs = SCHEMES[scheme]

    def tensor_cores(acc, gram, g, c):
        gp = (-c * g).astype(np.float32)
        if from_zero:
            return acc + mma_tf32(np.zeros_like(acc), gram, gp, pairs, big, accumulate)
        return mma_tf32(acc, gram, gp, pairs, big, accumulate)

    return tensor_cores


def augmented(x_all: np.ndarray) -> np.ndarray:
    """uint8 [N, 785]: the pixels and the constant bias pixel."""
    return np.concatenate([x_all, np.full((len(x_all), 1), BIAS_PIXEL, np.uint8)], axis=1)


def epoch_grams(xa: np.ndarray, order, batch_size: int, lag: int, dtype) -> list[dict]:
    """grams[t][j] = Γ̃_{t,j} for j = 1 … min(lag, t): exact integers (float64 products of the
    pixels) rounded once to `dtype`, as the Gram kernel's cvt.rn.f32.s32. Computed once an epoch
    and shared by every scheme run on it."""
    xs = [xa[order[a:z]].astype(np.float64) for a, z in batches(len(order), batch_size)]
    return [{j: (xs[t] @ xs[t - j].T).astype(dtype) for j in range(1, min(lag, t) + 1)}
            for t in range(len(xs))]


def chain_epoch(wt, xa, y_all, order, batch_size, lr, lag, prod, grams, dtype):
    """One v8 epoch in place on W̃ `wt` [785, 10] (dtype): the workers' lagged weights, the
    chain's accumulator P_t → Z_t through `prod` (oldest term first, j = 1 last)."""
    c = dtype(lr / 255**2)
    step_lr, inv255 = dtype(lr), dtype(1 / 255)
    xs, gs, applied = [], [], 0
    for t, (a, z) in enumerate(batches(len(order), batch_size)):
        xs.append(xa[order[a:z]].astype(dtype))
        s, window = lag_window(t, lag)
        while applied < s:  # the workers: W̃ −= (lr/255) X̃ᵀ G, L steps behind
            wt -= (step_lr * inv255) * (xs[applied].T @ gs[applied])
            applied += 1
        acc = (xs[t] @ wt) * inv255  # P_t, the workers' partial logits
        for k in reversed(window):  # j = t − k: the helpers' terms first, j = 1 last
            acc = prod(acc, grams[t][t - k], gs[k], c)
        g, _ = softmax_grad(acc, y_all[order[a:z]])
        gs.append(g.astype(dtype))  # G_t: the workers' update, the chain's B operand
    while applied < len(gs):
        wt -= (step_lr * inv255) * (xs[applied].T @ gs[applied])
        applied += 1


def chain_sgd(data: LadderData, cfg: LadderConfig, lag: int, scheme: str, epochs: int = 1,
              dtype=np.float32, big: str = "rna", accumulate: str = "rn", from_zero=False,
              grams=None):
    """`epochs` epochs of v8's chain numerics; (w [10, 784], b [10]) in the ladder's layout.
    `grams` (one `epoch_grams` list an epoch) may be passed to share them between schemes."""
    if scheme == "float64":
        dtype = np.float64
    xa = augmented(data.train_x)
    wt = np.concatenate([data.w0.T, data.b0[None, :]]).astype(dtype)
    prod = product(scheme, big, accumulate, from_zero)
    for e in range(epochs):
        gr = grams[e] if grams else epoch_grams(xa, data.orders[e], cfg.batch_size, lag, dtype)
        chain_epoch(wt, xa, data.train_y, data.orders[e], cfg.batch_size, cfg.lr, lag, prod, gr,
                    dtype)
    return wt[:784].T, wt[784]


CONFIGS = {  # name: (scheme, big, accumulate, from_zero)
    "fp32 SIMT (v7)": ("fp32", "rna", "rn", False),
    "1xTF32, rna, acc rn": ("1xTF32", "rna", "rn", False),
    "1xTF32, operands truncated, acc rz": ("1xTF32", "rz", "rz", False),
    "3xTF32, rna, acc rn": ("3xTF32", "rna", "rn", False),
    "3xTF32, big truncated, acc rz": ("3xTF32", "rz", "rz", False),
    "3xTF32, big truncated, acc rz, from 0": ("3xTF32", "rz", "rz", True),
    "3xFP16 (scaled), acc rn": ("3xFP16", "rna", "rn", True),
    "3xFP16 (scaled), acc rz": ("3xFP16", "rna", "rz", True),
    "3xFP16 (scaled), acc rz, subnormals flushed": ("3xFP16 ftz", "rna", "rz", True),
}


def main(argv=None):
    """The error table of the v8 design page: each config's chain against float64 plain SGD after
    each of `epochs` real MNIST epochs (FASTTRAIN_DATA must hold mnist/); the Grams of an epoch are
    computed once and shared by the configs.

    python -m tests.ladder.split_precision [EPOCHS [LAG [CONFIG-INDEX ...]]]  (default 1 4 all)"""
    import os
    import sys
    import time

    from fasttrain.data import load_dataset
    from fasttrain.ladder.common import make_ladder_data
    from tests.ladder.test_ladder import reference_sgd

    args = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    epochs, lag = (args[0] if args else 1), (args[1] if len(args) > 1 else 4)
    names = [list(CONFIGS)[i] for i in args[2:]] or list(CONFIGS)
    cfg = LadderConfig(epochs=epochs)
    data = make_ladder_data(load_dataset("mnist", os.environ.get("FASTTRAIN_DATA")), cfg)
    xa = augmented(data.train_x)
    print(f"L={lag}, {data.n_train} samples, batch {cfg.batch_size}, lr {cfg.lr}: max |w − "
          f"w_float64 plain SGD| and max |w − w_fp32 SIMT chain| over weights and bias", flush=True)
    names = ["fp32 SIMT (v7)"] + [n for n in names if n != "fp32 SIMT (v7)"]
    wts = {n: np.concatenate([data.w0.T, data.b0[None, :]]).astype(np.float32) for n in names}
    for e in range(epochs):
        t0 = time.perf_counter()
        w64, b64 = reference_sgd(data, cfg, e + 1)
        grams = epoch_grams(xa, data.orders[e], cfg.batch_size, lag, np.float32)
        for n in names:
            scheme, big, acc, fz = CONFIGS[n]
            chain_epoch(wts[n], xa, data.train_y, data.orders[e], cfg.batch_size, cfg.lr, lag,
                        product(scheme, big, acc, fz), grams, np.float32)
            err = max(np.abs(wts[n][:784].T - w64).max(), np.abs(wts[n][784] - b64).max())
            d32 = np.abs(wts[n] - wts["fp32 SIMT (v7)"]).max()
            print(f"  epoch {e + 1:2d}  {n:40s} {err:.2e}  {d32:.2e}", flush=True)
        print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
