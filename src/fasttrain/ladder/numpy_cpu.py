"""`numpy-cpu`: the report's "Python + NumPy (CPU)" row, as clean vectorized NumPy.

One batch is a gather, two matrix products (through NumPy's BLAS), a softmax and an in-place
update; the loss is read every epoch. What limits it: every step gathers and re-reads the batch as
float32 (4 bytes a pixel), allocates its temporaries anew, and pays Python's per-call overhead for
~15 NumPy calls, 469 times an epoch.

Run alone:  python -m fasttrain bench --impl numpy-cpu
"""

from __future__ import annotations

import numpy as np

from fasttrain.ladder.common import Impl, LadderConfig, LadderData, batches


class NumpyCPU(Impl):
    name = "numpy-cpu"
    reproduces = "Python + Numpy (CPU)"
    report_ms = 12500.0

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        # As the report does: normalize once to [0, 1] floats before training.
        self.x = data.train_x.astype(np.float32) / np.float32(255)
        self.y = data.train_y
        self.w = data.w0.copy()  # [10, 784]
        self.b = data.b0.copy()  # [10]
        self.steps = batches(data.n_train, cfg.batch_size)

    def train_epoch(self, epoch: int) -> float:
        order, lr = self.data.orders[epoch], np.float32(self.cfg.lr)
        total = 0.0
        for start, stop in self.steps:
            idx = order[start:stop]
            x, y = self.x[idx], self.y[idx]  # [B, 784], [B]
            rows = np.arange(len(y))
            z = x @ self.w.T + self.b  # logits [B, 10]
            z -= z.max(axis=1, keepdims=True)  # stable softmax
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            total -= np.log(p[rows, y]).sum(dtype=np.float64)
            # d(mean CE)/dz = (softmax - onehot) / B
            p[rows, y] -= 1.0
            p /= np.float32(len(y))
            self.w -= lr * (p.T @ x)
            self.b -= lr * p.sum(axis=0)
        return total / self.data.n_train

    def params(self):
        return self.w, self.b
