"""cuda-epoch v8's probes' inputs (ladder/v8_chain.py): one epoch's Grams with the bias folded in,
the workers' and helpers' terms and float64 plain SGD's logits, G and loss, all in NumPy from the
pixels, labels, order and initial weights (float64 where it matters; exact integers for Γ̃)."""

from __future__ import annotations

import numpy as np

from fasttrain.ladder.common import batches

ROWS, CLASSES, PIXEL = 128, 10, 255
CLUSTER_LAG = 6
"""csrc/v8_helpers.cuh's V8H_LAG: the cluster's helpers do the lags j = 2 … L."""


def chain_inputs(x_u8: np.ndarray, y: np.ndarray, order: np.ndarray, w0: np.ndarray,
                 b0: np.ndarray, lr: float, lag: int | None = None) -> dict:
    """The probe's inputs for one epoch over `order` (x_u8 [N, 784] uint8, w0 [10, 784] and b0
    [10] the ladder's layout) and float64 plain SGD's logits, G and loss to check it against.
    With `lag` (the cluster variant, L = CLUSTER_LAG) also "gramh" [L − 1][steps][128][128]:
    Γ̃_{t,j} for j = 2 … L (fp32, exact; 0 outside the batches and for t < j), and "p":
    P_t = X̃_t W̃_{max(t−L, 0)}/255 from the same float64 SGD (what the workers would send)."""
    if x_u8.dtype != np.uint8 or x_u8.ndim != 2:
        raise ValueError(f"x_u8 must be a uint8 matrix [N, 784], got {x_u8.dtype} {x_u8.shape}")
    if not np.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr}")
    if lag is not None and (isinstance(lag, bool) or not isinstance(lag, int) or lag < 2):
        raise ValueError(f"lag must be an integer >= 2 or None, got {lag!r}")
    steps = len(batches(len(order), ROWS))
    grams = np.zeros((steps, ROWS, ROWS), np.float32)
    pq = np.zeros((steps, ROWS, CLASSES), np.float32)
    labels = np.full((steps, ROWS), -1, np.int32)
    z64 = np.zeros((steps, ROWS, CLASSES))
    g64 = np.zeros((steps, ROWS, CLASSES))
    if lag is not None:
        gramh = np.zeros((lag - 1, steps, ROWS, ROWS), np.float32)
        p_lag = np.zeros((steps, ROWS, CLASSES), np.float32)
    wt = np.concatenate([w0.T, b0[None, :]]).astype(np.float64)  # W̃ [785, 10]
    loss, xs, ws = 0.0, [], []  # xs: X̃ of the last `lag` steps (uint8); ws: W̃_t of those
    for t, (a, z) in enumerate(batches(len(order), ROWS)):
        n = z - a
        xu = np.concatenate([x_u8[order[a:z]], np.full((n, 1), PIXEL, np.uint8)], 1)
        xt = xu.astype(np.float64)
        if xs:
            prev = xs[-1].astype(np.float64)
            grams[t, :n, :len(prev)] = xt @ prev.T  # exact integers < 2²⁶: exact in fp32
            pq[t, :n] = xt @ ws[-1] / PIXEL
        else:
            pq[t, :n] = xt @ wt / PIXEL
        if lag is not None:
            for j in range(2, min(lag, t) + 1):
                xj = xs[-j].astype(np.float64)
                gramh[j - 2, t, :n, :len(xj)] = xt @ xj.T
            p_lag[t, :n] = xt @ (ws[-lag] if t >= lag else ws[0] if ws else wt) / PIXEL
        labels[t, :n] = y[order[a:z]]
        zt = xt @ wt / PIXEL
        e = np.exp(zt - zt.max(1, keepdims=True))
        p = e / e.sum(1, keepdims=True)
        loss -= np.log(p[np.arange(n), labels[t, :n]]).sum()
        p[np.arange(n), labels[t, :n]] -= 1
        z64[t, :n], g64[t, :n] = zt, p / n
        xs.append(xu)
        ws.append(wt.copy())
        keep = max(lag or 1, 1)
        if len(xs) > keep:  # ws[0] stays W̃_0 until t ≥ lag needs W̃_{t−lag}
            xs.pop(0)
            ws.pop(0)
        wt -= (lr / PIXEL) * (xt.T @ g64[t, :n])
    out = {"grams": grams, "pq": pq, "labels": labels, "n": len(order), "x_u8": x_u8,
           "order": np.asarray(order, np.int32),
           "c": np.float32(lr / PIXEL**2), "z64": z64, "g64": g64, "loss64": loss}
    if lag is not None:
        out.update(gramh=gramh, p=p_lag, lag=lag)
    return out


def mnist_epoch(epoch: int = 0, lag: int | None = CLUSTER_LAG) -> dict:
    """`chain_inputs` of a real MNIST epoch (the ladder's init and order; FASTTRAIN_DATA or the
    dataset cache must hold mnist/), by default with the cluster's inputs too (~155 MB of Γ̃)."""
    import os

    from fasttrain.data import load_dataset
    from fasttrain.ladder.common import LadderConfig, make_ladder_data

    cfg = LadderConfig(epochs=epoch + 1)
    data = make_ladder_data(load_dataset("mnist", os.environ.get("FASTTRAIN_DATA")), cfg)
    return chain_inputs(data.train_x, data.train_y, data.orders[epoch], data.w0, data.b0, cfg.lr,
                        lag)
