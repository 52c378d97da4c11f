"""`floor-gemm`: a reference line, not a trainer — the bare library matrix products of one epoch.

Per batch: the forward product x @ Wᵀ ([B, 784] × [784, 10]) and the weight-gradient product
Gᵀ @ x ([10, B] × [B, 784]), fp32, on contiguous pre-shuffled batches, with preallocated outputs,
through NumPy's BLAS (for these skinny shapes it measured ~2× faster than torch.mm on the 2-core
CPU this was written on). No gather, no softmax, no update, no Python beyond the loop.

It is not the floor (that is the `roofline` row): it is what the epoch's FLOPs cost through a BLAS
library call per product — ~4× the roofline on the 2-core Zen 4 EPYC (2026-11-23), because N = 10
is too skinny for a GEMM kernel's blocking and each call is a few µs of overhead. A fused row beats
it by doing the products in its own loops, with the batch read once in uint8.

Run alone:  python -m fasttrain bench --impl floor-gemm
"""

from __future__ import annotations

import numpy as np

from fasttrain.ladder.common import Impl, LadderConfig, LadderData, batches


class FloorGemm(Impl):
    name = "floor-gemm"
    trains = False

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        self.x = data.train_x.astype(np.float32) / np.float32(255)
        self.wt = np.ascontiguousarray(data.w0.T)  # [784, 10]
        self.g = np.random.default_rng(cfg.seed).standard_normal(
            (cfg.batch_size, 10), dtype=np.float32
        )
        self.z = np.empty((cfg.batch_size, 10), np.float32)
        self.gw = np.empty((10, 784), np.float32)
        self.steps = batches(data.n_train, cfg.batch_size)

    def train_epoch(self, epoch: int) -> None:
        x, wt, g, z, gw = self.x, self.wt, self.g, self.z, self.gw
        for start, stop in self.steps:
            n = stop - start
            np.matmul(x[start:stop], wt, out=z[:n])
            np.matmul(g[:n].T, x[start:stop], out=gw)
        return None

    def params(self):
        return self.data.w0, self.data.b0

    def evaluate(self):
        return None, None  # learns nothing: no accuracy to report
