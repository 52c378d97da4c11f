"""The ladder contract: what every implementation of the report's model shares.

The model is MNIST logistic regression: a 784→10 linear layer with bias, softmax + mean
cross-entropy, plain mini-batch SGD, batch 128 with the last partial batch kept, inputs scaled to
[0, 1]. Every implementation starts from the same seeded weights and visits the training set in the
same per-epoch order, drawn once from the seed (`LadderData`), so that rows differ only in how they
compute, never in what.

An implementation is a small class (`Impl`): `unavailable(env)` says why it cannot run here,
`setup(data, cfg)` does the untimed work (allocation, transfers, compilation, graph capture),
`train_epoch(epoch)` is what the harness times, `params()` hands back the weights and `evaluate()`
reports test loss and accuracy outside the clock. The harness in `fasttrain.timing` owns the clocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fasttrain.errors import UserError

IN_FEATURES = 784
CLASSES = 10


@dataclass(frozen=True)
class LadderConfig:
    epochs: int = 20
    """Passes over the training set."""
    batch_size: int = 128
    """Samples per SGD step; the last partial batch of an epoch is kept."""
    lr: float = 0.1
    """SGD learning rate (no momentum, no weight decay)."""
    seed: int = 0
    """Seeds the initial weights and every epoch's shuffle order."""
    device: str = "cpu"
    """Device for the rows that can choose ('cpu' or 'cuda'), already resolved."""

    def __post_init__(self):
        if self.epochs <= 0:
            raise UserError(f"--epochs must be a positive integer, got {self.epochs}")
        if self.batch_size <= 0:
            raise UserError(f"--batch-size must be a positive integer, got {self.batch_size}")
        if not np.isfinite(self.lr) or self.lr <= 0:
            raise UserError(f"--lr must be a finite number > 0, got {self.lr}")
        if self.seed < 0:
            raise UserError(f"--seed must be an integer >= 0, got {self.seed}")


@dataclass(frozen=True)
class LadderData:
    """Everything an implementation trains on; identical for every row of one bench run."""

    name: str
    train_x: np.ndarray  # uint8 [N, 784], raw pixels 0..255 (rows convert to [0, 1] as they like)
    train_y: np.ndarray  # int64 [N]
    test_x: np.ndarray  # uint8 [M, 784]
    test_y: np.ndarray  # int64 [M]
    orders: np.ndarray  # int64 [epochs, N]: epoch e visits train_x[orders[e]] in batch-size slices
    w0: np.ndarray  # float32 [10, 784], initial weights (nn.Linear layout: out × in)
    b0: np.ndarray  # float32 [10]

    @property
    def n_train(self) -> int:
        return len(self.train_y)


MAX_ORDERS_BYTES = 2**31  # the shuffle orders of every epoch (int64), held on the host and device


def make_ladder_data(dataset, cfg: LadderConfig) -> LadderData:
    """Flatten a `fasttrain.data.ImageDataset` and draw the shared init and shuffle orders."""
    rng = np.random.default_rng(cfg.seed)
    # nn.Linear's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
    bound = 1.0 / np.sqrt(IN_FEATURES)
    w0 = rng.uniform(-bound, bound, size=(CLASSES, IN_FEATURES)).astype(np.float32)
    b0 = rng.uniform(-bound, bound, size=CLASSES).astype(np.float32)
    n = len(dataset.train_y)
    if cfg.epochs * n * 8 > MAX_ORDERS_BYTES:
        raise UserError(f"--epochs {cfg.epochs}: every epoch's shuffle order is drawn up front "
                        f"(8 bytes a sample an epoch: {cfg.epochs * n * 8 / 2**30:.1f} GiB for "
                        f"{n:,} samples); use at most {MAX_ORDERS_BYTES // (8 * n):,} epochs")
    orders = np.stack([rng.permutation(n) for _ in range(cfg.epochs)])
    return LadderData(
        name=dataset.name,
        # Own, writable copies: the dataset's arrays are shared read-only views of the files.
        train_x=dataset.train_x.reshape(n, -1).copy(),
        train_y=dataset.train_y.astype(np.int64),
        test_x=dataset.test_x.reshape(len(dataset.test_y), -1).copy(),
        test_y=dataset.test_y.astype(np.int64),
        orders=orders,
        w0=w0,
        b0=b0,
    )


def batches(n: int, batch_size: int) -> list[tuple[int, int]]:
    """(start, stop) of every batch of an epoch, the last partial one included."""
    return [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]


def softmax_xent(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray):
    """Mean cross-entropy and accuracy of the linear model on (x in [0, 1], y), in float64."""
    z = x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(len(y)), y].mean()
    return float(loss), float((z.argmax(axis=1) == y).mean())


class Impl:
    """Base of the ladder's implementations: class attributes describe the row."""

    name: str = ""
    reproduces: str | None = None
    """The report's row this implementation reproduces, if any."""
    report_ms: float | None = None
    """The report's ms/epoch for that row."""
    device: str = "cpu"
    precision: str = "fp32"
    trains: bool = True
    """False for reference lines (the GEMM floor, the roofline) that learn nothing; only rows that
    train are checked against the float64 reference before they are timed."""
    computed: bool = False
    """True for the roofline: its ms/epoch is computed from the machine's peaks, never timed."""
    sources: tuple[str, ...] = ()
    """Files besides the row's module that its code is built from (CUDA C++ sources, say), relative
    to fasttrain/ladder/: hashed into the result JSON so every figure names the code behind it."""
    check_atol: float | None = None
    """Tolerance of the check-before-time step against float64; None: decided by `precision`
    (2e-5 for fp32, 1e-3 for reduced precision)."""

    @classmethod
    def unavailable(cls, env: dict, cfg: LadderConfig) -> str | None:
        """None when this row can run here, else the reason it cannot."""
        return None

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        raise NotImplementedError

    def train_epoch(self, epoch: int) -> float | None:
        """One epoch in `data.orders[epoch]` order; returns the mean training loss when this row
        reads it (as the report's rungs do, some only every 10 epochs), else None."""
        raise NotImplementedError

    def params(self) -> tuple[np.ndarray, np.ndarray]:
        """Current (weight [10, 784], bias [10]) as float32 NumPy arrays on the host."""
        raise NotImplementedError

    def details(self) -> dict:
        """How this instance runs, after setup (threads, vector width, compiler and flags...):
        recorded with the row's figures so that they can be reproduced."""
        return {}

    def evaluate(self) -> tuple[float, float]:
        """(test loss, test accuracy), outside the clock, computed the same way for every row."""
        w, b = self.params()
        return softmax_xent(w, b, self.data.test_x / np.float64(255), self.data.test_y)
