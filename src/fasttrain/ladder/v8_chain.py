"""cuda-epoch v8's chain alone, as a GPU probe (docs/measurements/cuda-epoch-v8-design.md, "Build
first" step 2): one CTA of 512 threads on one SM runs the chain for a whole MNIST epoch (469 steps,
batch 128, the last 96) with real Grams and P_t + Q_t from precomputed arrays, so its logits are
the real ones and its µs a step is T_chain, the design's central claim, without the protocol.

Inputs (`chain_inputs`, NumPy, float64 where it matters):
- Γ̃_{t,1} = X̃_t X̃_{t−1}ᵀ = Γ + 255² (the bias as a 785th pixel of 255), fp32 [steps][128][128],
  0 outside the batches' rows and columns; step 0's all 0 (no lagged term);
- P_t + Q_t = X̃_t W̃_{t−1} / 255 in float64 plain SGD, rounded to fp32 [steps][128][10]: in the
  algebra Z_t = X̃_t W̃_{t−1}/255 − c Γ̃_{t,1} G_{t−1} (c = lr/255²), so this is what the workers'
  partial P_t and the helpers' terms j ≥ 2 add up to, whatever the lag;
- the labels [steps][128] (−1 past the batch) and float64's Z_t, G_t and summed loss, the check.

The kernel is csrc/v8_chain.cu (nvcc → cached .so → ctypes, as ladder/sync_probes.py). Written
2026-11-28; not yet run on a GPU.
"""

from __future__ import annotations

import numpy as np

from fasttrain.ladder.common import batches

SOURCE = "v8_chain.cu"
ROWS, CLASSES, PIXEL = 128, 10, 255
TIMING = ("epoch_ns", "epoch_clocks", "inputs_mma", "k_halves", "softmax", "write_b", "next_a",
          "step_barrier", "wait_gram", "issue_gram")
"""csrc/v8_chain.cu's int64 timing words: the epoch by globaltimer and clock64 (thread 0), then
clock64 sums over the steps of warp 0 (a softmax warp, on the critical path) for each phase, and
of warp 8 for the Γ̃ ring's cp.async wait and issue (the phase build only)."""


class ChainError(RuntimeError):
    """The kernel could not run; str(e) is one line."""


def chain_inputs(x_u8: np.ndarray, y: np.ndarray, order: np.ndarray, w0: np.ndarray,
                 b0: np.ndarray, lr: float) -> dict:
    """The probe's inputs for one epoch over `order` (x_u8 [N, 784] uint8, w0 [10, 784] and b0
    [10] the ladder's layout) and float64 plain SGD's logits, G and loss to check it against."""
    if x_u8.dtype != np.uint8 or x_u8.ndim != 2:
        raise ValueError(f"x_u8 must be a uint8 matrix [N, 784], got {x_u8.dtype} {x_u8.shape}")
    if not np.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr}")
    steps = len(batches(len(order), ROWS))
    grams = np.zeros((steps, ROWS, ROWS), np.float32)
    pq = np.zeros((steps, ROWS, CLASSES), np.float32)
    labels = np.full((steps, ROWS), -1, np.int32)
    z64 = np.zeros((steps, ROWS, CLASSES))
    g64 = np.zeros((steps, ROWS, CLASSES))
    wt = np.concatenate([w0.T, b0[None, :]]).astype(np.float64)  # W̃ [785, 10]
    loss, prev = 0.0, None
    for t, (a, z) in enumerate(batches(len(order), ROWS)):
        n = z - a
        xt = np.concatenate([x_u8[order[a:z]], np.full((n, 1), PIXEL, np.uint8)], 1)
        xt = xt.astype(np.float64)
        if prev is not None:
            grams[t, :n, :len(prev[0])] = xt @ prev[0].T  # exact integers < 2²⁶: exact in fp32
            pq[t, :n] = xt @ prev[1] / PIXEL
        else:
            pq[t, :n] = xt @ wt / PIXEL
        labels[t, :n] = y[order[a:z]]
        zt = xt @ wt / PIXEL
        e = np.exp(zt - zt.max(1, keepdims=True))
        p = e / e.sum(1, keepdims=True)
        loss -= np.log(p[np.arange(n), labels[t, :n]]).sum()
        p[np.arange(n), labels[t, :n]] -= 1
        z64[t, :n], g64[t, :n] = zt, p / n
        prev = (xt, wt.copy())
        wt -= (lr / PIXEL) * (xt.T @ g64[t, :n])
    return {"grams": grams, "pq": pq, "labels": labels, "n": len(order),
            "c": np.float32(lr / PIXEL**2), "z64": z64, "g64": g64, "loss64": loss}
