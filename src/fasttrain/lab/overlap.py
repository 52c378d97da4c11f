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

`read_two` is `plan --calibrate`'s reading on a GPU (fasttrain.lab.calibration): one model at
two batch sizes, so each constant from the one point on its side, and, where both points are
on one side (flat steps: both host-bound; steps in proportion to the roofline: both
device-bound), the other constant only bounded and said to be unidentified.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
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


# -- a calibration's two points ----------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """Two measured batch sizes of one model read by the max: each constant from the point on
    its side, or, where both points are on one side, the other constant's bound only."""

    efficiency: float  # R/T of the device-bound point(s), unbounded (> 1 possible); unidentified:
    # the least the points allow, max R/T (a device slower than that would have shown)
    issue_s: float  # T/calls of the host-bound point(s); unidentified: the most the points
    # allow, min T/calls (issuing slower than that would have shown)
    regimes: tuple[str, ...]  # "host" or "device", each point's in the order given
    unidentified: tuple[str, ...] = ()  # "efficiency" (no point device-bound), "issue_s" (none
    # host-bound)


def _quartiles(p: Point) -> tuple[float, float]:
    """(lower, upper) quartile of a point's timed steps; its median twice where none were kept."""
    if len(p.step_times_s) >= 2:
        lo, _, hi = statistics.quantiles(p.step_times_s, n=4, method="inclusive")
        return lo, hi
    return p.measured_s, p.measured_s


def read_two(points: list[Point]) -> Reading:
    """The two points of a calibration (the same model at two batch sizes), each on its side:
    `a`, the one with less roofline per call (the smaller batch), is host-bound if its step is
    measurably above its roofline at `b`'s efficiency; `b` is device-bound if its step per call
    is measurably above `a`'s (a host issuing every call at `a`'s cost would not take that
    long). Measurably: the middle halves of the two points' timed steps (their quartiles,
    scaled) do not overlap, so that a rise within the steps' jitter is not read as the other
    regime (the ×8 the module docstring tells of); medians alone where no steps were kept.
    Both sides: each constant from its point, exactly. `b` not device-bound (steps flat per
    call): both host-bound, the issue cost fitted to both, the efficiency unidentified. `a` not
    host-bound (steps in proportion to the roofline): both device-bound, the efficiency fitted
    to both, the issue cost unidentified."""
    if len(points) != 2:
        raise ValueError(f"a calibration reads two points, got {len(points)}")
    a, b = sorted(points, key=lambda p: p.roofline_s / p.ops)
    (a_lo, a_hi), (b_lo, b_hi) = _quartiles(a), _quartiles(b)
    device = b_lo / b.ops > a_hi / a.ops
    host = a.roofline_s <= 0 or a_lo / a.roofline_s > b_hi / b.roofline_s
    r = np.array([p.roofline_s / p.measured_s for p in points])
    n = np.array([p.ops / p.measured_s for p in points])
    if device and host:
        eff, issue, unknown = b.roofline_s / b.measured_s, a.measured_s / a.ops, ()
        regimes = tuple("host" if p is a else "device" for p in points)
    elif not device:  # flat per call (or neither measurable: no device time shows at all)
        eff, issue, unknown = float(r.max()), _one(n, 0.0), ("efficiency",)
        regimes = ("host", "host")
    else:
        eff, issue, unknown = 1 / _one(r, 0.0), float((1 / n).min()), ("issue_s",)
        regimes = ("device", "device")
    return Reading(float(eff), float(issue), regimes, unknown)
