"""A GPU step whose host issues ahead of the device: the slower of the two, not their sum.

    t = max(R / eff, calls × t_issue)     R: the step's per-op roofline (steptime.roofline_s)

On a GPU, Python, the dispatcher, autograd and cudaLaunchKernel run on the host while the kernels
queue up on the device: the device works while the host issues. A step is bound by the host
(every call issued, the device idle between kernels) or by the device (the queue never empties),
and takes about the larger of the two times. The sum (steptime.predict_s) counts the overlapped
part twice; on a CPU, where one thread computes and issues, the sum is right and stays.

What the three H100 loans' points say (docs/measurements/plan-accuracy.md, re-fit offline by
`benchmarks/plan_accuracy.py --from-json`): 31–45 µs to issue a call on their host, whatever
the model (logreg's steps are flat from batch 512 to 32,768: all issuing), and one efficiency,
~0.4, for the device-bound steps of cnn and gpt alike; one efficiency and one issue cost per
loan predict each of its twelve points from the eleven others within ±30%. The sum's two
constants fitted per model chase the host's jitter instead: a 19% rise between two host-bound
medians read as roofline, ×8 when extrapolated in batch size (mlp at 32,768: +124%).

`fit` is the least squares on relative error of the max, exact: a point is host-bound iff its
roofline per call R/calls is below t_issue/eff, so the regimes split the points at one place in
their order by R/calls; each split is two one-constant least squares, and a minimum that falls
outside its split lies on a border between two (t_issue = R/calls of a point over eff), one
constant again. Bounds as steptime.fit: eff ≤ 1, t_issue ≥ 0. A constant no point informs (no
device-bound point: eff; no host-bound point: t_issue) is held at its bound (1, 0): of fits
equally good, the one nearest the bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fasttrain.lab.steptime import Point


def step_s(roofline_s: float, ops: int, efficiency: float, issue_s: float) -> float:
    """The step: the device's roofline over the efficiency, or issuing every call, the slower."""
    return max(roofline_s / efficiency, ops * issue_s)


def _one(a: np.ndarray, lo: float) -> float:
    """argmin over c ≥ lo of Σ (c·a − 1)²."""
    return max(lo, float(a.sum() / (a @ a))) if len(a) and a @ a > 0 else lo


def fit(points: list[Point]) -> tuple[float, float]:
    """(efficiency, issue_s) minimizing Σ (max(R/eff, n·t) / T − 1)², eff ≤ 1, t ≥ 0 (module
    docstring: every split of the points into host- and device-bound, and every border)."""
    if len(points) < 2:
        raise ValueError("fitting two constants needs at least two points")
    pts = sorted(points, key=lambda p: p.roofline_s / p.ops)
    r = np.array([p.roofline_s / p.measured_s for p in pts])  # device time per unit slowdown
    n = np.array([p.ops / p.measured_s for p in pts])  # host time per unit issue cost

    def loss(c) -> float:
        return float(np.sum((np.maximum(c[0] * r, c[1] * n) - 1) ** 2))

    tries = []
    for k in range(len(pts) + 1):  # the first k host-bound, the rest device-bound
        tries.append((_one(r[k:], 1.0), _one(n[:k], 0.0)))
    for p in pts:  # a border: t = slowdown · R/n of this point
        ratio = p.roofline_s / p.ops
        slowdown = _one(np.maximum(r, ratio * n), 1.0)
        tries.append((slowdown, slowdown * ratio))
    # Fits equally good (a constant no point informs is free over a range): the one nearest the
    # bounds, the highest efficiency and then the least issue cost — what the points demand.
    best = min(loss(c) for c in tries)
    slowdown, issue = min((c for c in tries if loss(c) <= best + 1e-12), key=lambda c: c)
    return float(1 / slowdown), float(issue)
