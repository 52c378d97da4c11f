"""The lagged-Gram SGD epoch in plain NumPy: the reference a cuda-epoch v7 kernel would be checked
against (design: docs/measurements/cuda-epoch-v7-design.md). Not a ladder row; it trains exactly
what the ladder's rows train, computed another way.

Plain SGD, step t of an epoch (X_t uint8 [n_t, 784], W [784, 10] — the transpose of the ladder's
nn.Linear layout —, b [10], n_t = 128 or the last partial batch's 96):

    Z_t = X_t W_t / 255 + b_t          G_t = (softmax(Z_t) − onehot(y_t)) / n_t
    W_{t+1} = W_t − (lr/255) X_tᵀ G_t   b_{t+1} = b_t − lr 1ᵀ G_t

Unrolled back to the weights of step s = max(t − L, 0) (the lag restarts at every epoch: one
launch an epoch, which ends with every update applied):

    Z_t = X_t W_s / 255 + b_t − (lr/255²) Σ_{j=1..t−s} (X_t X_{t−j}ᵀ) G_{t−j}
    b_t = b_s − lr Σ_{j=1..t−s} 1ᵀ G_{t−j}

The Grams X_t X_{t−j}ᵀ [n_t, n_{t−j}] depend only on the pixels and the epoch's order, so a kernel
can compute them ahead, off the step's critical path, exactly in int32 (uint8 products: at most
784 · 255² = 50,979,600 < 2³¹). Here they are float64 products of the integer pixels, which are
exact too: every partial sum is an integer below 2⁵³.

`lagged_sgd(data, cfg, lag, epochs, dtype)`: float64 is the algebra (equal to plain SGD up to
float64 rounding); float32 is what a kernel would compute — exact Grams rounded once to float32 (as
its s32 accumulators would be converted), everything else float32 (products accumulated in
float32 by NumPy's sgemm).
"""

from __future__ import annotations

import numpy as np

from fasttrain.ladder.common import LadderConfig, LadderData, batches


def gram(xa: np.ndarray, xb: np.ndarray) -> np.ndarray:
    """X_a X_bᵀ of two uint8 batches, exact integers in float64 ([n_a, n_b])."""
    return xa.astype(np.float64) @ xb.astype(np.float64).T


def lag_window(t: int, lag: int) -> tuple[int, list[int]]:
    """(s, [t−1, …, s]): step t reads the weights W_s of s = max(t − lag, 0), which lack the
    updates of steps t−1 down to s (j = 1..t−s)."""
    s = max(t - lag, 0)
    return s, list(range(t - 1, s - 1, -1))


def lagged_bias(b_s: np.ndarray, past_g: list[np.ndarray], lr) -> np.ndarray:
    """b_t = b_s − lr Σ_j 1ᵀ G_{t−j}."""
    b = b_s.copy()
    for g in past_g:
        b -= lr * g.sum(axis=0)
    return b


def lagged_logits(x_t, w_s, b_s, past_x, past_g, lr, dtype) -> np.ndarray:
    """Z_t [n_t, 10] from the lagged weights W_s, b_s and the steps they lack (past_x[j−1] =
    X_{t−j}, past_g[j−1] = G_{t−j}): the partial logits P_t = X_t W_s / 255 (the workers' part),
    minus the Gram correction (the critical chain's part)."""
    inv255, c = dtype(1 / 255), dtype(lr / 255**2)
    z = (x_t.astype(dtype) @ w_s) * inv255 + lagged_bias(b_s, past_g, dtype(lr))
    for x_prev, g_prev in zip(past_x, past_g, strict=True):
        z -= c * (gram(x_t, x_prev).astype(dtype) @ g_prev)
    return z


def softmax_grad(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """G = (softmax(z) − onehot(y)) / n and the batch's summed cross-entropy."""
    rows = np.arange(len(y))
    e = np.exp(z - z.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    loss = float(-np.log(p[rows, y].astype(np.float64)).sum())
    p[rows, y] -= 1
    return p / p.dtype.type(len(y)), loss


def lagged_epoch(w, b, x_all, y_all, order, batch_size, lr, lag, dtype):
    """One epoch with lag `lag` ≥ 1, in place on w [784, 10] and b [10]; returns the mean loss.

    `w` plays the update workers' weights: it holds W_s, the updates of steps ≥ s applied only
    when a later step's window no longer covers them (and all of them at the epoch's end)."""
    if lag < 1:
        raise ValueError(f"lag must be >= 1, got {lag}")
    xs, ys, gs = [], [], []
    applied = 0  # w == W_applied
    b_applied = b.copy()  # b_applied == b_applied-th step's bias, as w
    step_lr, inv255, total = dtype(lr), dtype(1 / 255), 0.0

    def apply_update(k):
        w[...] -= (step_lr * inv255) * (xs[k].astype(dtype).T @ gs[k])
        b_applied[...] -= step_lr * gs[k].sum(axis=0)

    for t, (start, stop) in enumerate(batches(len(order), batch_size)):
        idx = order[start:stop]
        xs.append(x_all[idx])
        ys.append(y_all[idx])
        s, window = lag_window(t, lag)
        while applied < s:
            apply_update(applied)
            applied += 1
        z = lagged_logits(xs[t], w, b_applied, [xs[k] for k in window], [gs[k] for k in window],
                          lr, dtype)
        g, loss = softmax_grad(z, ys[t])
        gs.append(g)
        total += loss
    while applied < len(gs):
        apply_update(applied)
        applied += 1
    b[...] = b_applied
    return total / len(order)


def lagged_sgd(data: LadderData, cfg: LadderConfig, lag: int, epochs: int | None = None,
               dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """`epochs` epochs of the ladder's training by lagged-Gram steps; (w [10, 784], b [10]) in the
    ladder's layout and `dtype`."""
    w = np.ascontiguousarray(data.w0.T, dtype=dtype)
    b = data.b0.astype(dtype)
    for epoch in range(epochs or cfg.epochs):
        lagged_epoch(w, b, data.train_x, data.train_y, data.orders[epoch], cfg.batch_size, cfg.lr,
                     lag, dtype)
    return w.T, b


def main(argv=None):
    """The float32 error table of the design page: each lag against float64 plain SGD after
    `epochs` real MNIST epochs (FASTTRAIN_DATA must hold mnist/).

    python -m tests.ladder.lagged_reference [EPOCHS [LAG ...]]   (default: 1 epoch, lags 1-32)"""
    import os
    import sys

    from fasttrain import ladder
    from fasttrain.data import load_dataset
    from fasttrain.ladder.common import make_ladder_data
    from tests.ladder.test_ladder import reference_sgd

    args = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    epochs, lags = (args[0] if args else 1), (args[1:] or [1, 2, 4, 8, 16, 32])
    cfg = LadderConfig(epochs=epochs)
    data = make_ladder_data(load_dataset("mnist", os.environ.get("FASTTRAIN_DATA")), cfg)
    w64, b64 = reference_sgd(data, cfg, epochs)

    def err(w, b):
        return max(np.abs(w - w64).max(), np.abs(b - b64).max())

    print(f"{epochs} MNIST epoch(s) ({data.n_train} samples, batch {cfg.batch_size}, lr {cfg.lr}), "
          f"max |w − w_float64 plain SGD| over weights and bias:")
    plain = ladder.entry("numpy-cpu").create("cpu")  # plain SGD in float32, the ladder's row
    plain.setup(data, cfg)
    for epoch in range(epochs):
        plain.train_epoch(epoch)
    print(f"  plain SGD (numpy-cpu): float32 {err(*plain.params()):.2e}", flush=True)
    for lag in lags:
        e64 = err(*lagged_sgd(data, cfg, lag, epochs))
        e32 = err(*lagged_sgd(data, cfg, lag, epochs, dtype=np.float32))
        print(f"  L={lag:2d}: float64 {e64:.2e}   float32 {e32:.2e}", flush=True)


if __name__ == "__main__":
    main()
