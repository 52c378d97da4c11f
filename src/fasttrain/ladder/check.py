"""Check before time: every training row takes one SGD step that must match a float64 reference.

The check goes through the `Impl` contract alone (setup on a one-batch `LadderData`, one
`train_epoch`, `params()`), so any row — CPU, CUDA C++, Triton, graphs — is checked without code
of its own. A row that fails is reported `failed` with the error and never timed: a fast wrong
answer is not a result.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fasttrain.ladder.common import LadderConfig, LadderData

FP32_ATOL = 2e-5
"""fp32 rows against float64 after one step of lr 0.1: weights agree to a few float32 ulps of the
update (gradients O(0.1), weights O(0.04)); the same tolerance as the ladder's tests."""
REDUCED_ATOL = 1e-3
"""bf16/fp16/tf32 rows (mixed precision): ~3 significant digits in the products."""


def one_batch(data: LadderData, cfg: LadderConfig) -> tuple[LadderData, LadderConfig]:
    """The first batch of the first epoch as a one-step, one-epoch data set of its own."""
    idx = data.orders[0][: cfg.batch_size]
    n = len(idx)
    small = dataclasses.replace(
        data,
        train_x=np.ascontiguousarray(data.train_x[idx]),
        train_y=np.ascontiguousarray(data.train_y[idx]),
        test_x=np.ascontiguousarray(data.test_x[:n]),
        test_y=np.ascontiguousarray(data.test_y[:n]),
        orders=np.arange(n, dtype=np.int64)[None, :],
    )
    return small, dataclasses.replace(cfg, epochs=1)


def reference_step(data: LadderData, lr: float) -> tuple[np.ndarray, np.ndarray]:
    """One SGD step of the ladder's model on all of `data.train_x`, in float64."""
    x = data.train_x.astype(np.float64) / 255.0
    w, b = data.w0.astype(np.float64), data.b0.astype(np.float64)
    z = x @ w.T + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(x)), data.train_y] -= 1.0  # d(mean cross-entropy)/dz, times the batch size
    p /= len(x)
    return w - lr * (p.T @ x), b - lr * p.sum(axis=0)


def tolerance(impl) -> float:
    """A row may declare `check_atol`; otherwise its precision decides."""
    declared = getattr(impl, "check_atol", None)
    if declared is not None:
        return float(declared)
    return FP32_ATOL if str(impl.precision).startswith("fp32") else REDUCED_ATOL


def check_row(entry, data: LadderData, cfg: LadderConfig) -> dict:
    """Set up a fresh instance of `entry` on one batch, take its one step and compare the weights
    with `reference_step`. Returns {"ok", "max_abs_err", "atol", "update_max", "error"}; raises
    nothing for a row's own failure (its exception becomes the error)."""
    small, cfg1 = one_batch(data, cfg)
    w_ref, b_ref = reference_step(small, cfg.lr)
    update = float(max(np.abs(w_ref - small.w0).max(), np.abs(b_ref - small.b0).max()))
    out = {"ok": False, "max_abs_err": None, "atol": None, "update_max": update, "error": None}
    try:
        impl = entry.create(cfg.device)
        impl.setup(small, cfg1)
        impl.train_epoch(0)
        w, b = (np.asarray(a, dtype=np.float64) for a in impl.params())
        out["atol"] = atol = tolerance(impl)
    except Exception as e:  # a broken row is a finding, not a crash of the bench
        out["error"] = f"check step raised {type(e).__name__}: {e}".splitlines()[0]
        return out
    if w.shape != w_ref.shape or b.shape != b_ref.shape:
        out["error"] = (f"params() shapes {w.shape}, {b.shape}; "
                        f"expected {w_ref.shape}, {b_ref.shape}")
        return out
    err = float(max(np.abs(w - w_ref).max(), np.abs(b - b_ref).max()))
    out["max_abs_err"] = err
    if not np.isfinite(err) or err > atol:
        out["error"] = (f"one step differs from the float64 reference by {err:.3g} (tolerance "
                        f"{atol:g}; the step itself moves weights by up to {update:.3g})")
        return out
    out["ok"] = True
    return out
