"""A training step's time on a GPU we do not have: a per-op roofline plus a cost per op issued.

    work = count(cfg)                                  # one real step, every op call counted
    t = Σ_calls max(flops/peak, bytes/bandwidth) / eff  +  calls × t_launch
    eff, t_launch = fit(points)                        # fitted to measured steps

The count is one eager optimizer step (forward, backward, optimizer) under a dispatch mode below
autograd that sees every aten op call once: FLOPs from torch's FLOP formulas
(torch.utils.flop_counter's registry, as the engine's MFU count), bytes as
`fasttrain.lab.classify` counts them (every input and output tensor once: caches ignored, so an
upper bound on traffic; fusion by --compile would lower it). Views and empty tensors move no
data, launch no kernel, and are not calls here. torch's optimizers loop over the parameters on
a CPU and take them all in one foreach call per op on CUDA (gpt: 418 of a CPU step's 566 calls,
18 as foreach), so a count for a GPU (`foreach=True`) takes the foreach path where the optimizer
leaves the choice to torch; a calibration counts the path it times. Gradient clipping's norms
stay per parameter as a CPU computes them (an overcount of calls on a GPU with --grad-clip).

Two terms, because a step is two kinds of cost:
- the roofline: each call at the slower of its two roofs — a step of matmuls and elementwise ops
  is neither all compute nor all memory — over an efficiency `eff` (kernels below their roof);
  it grows with the batch;
- issuing: Python, the dispatcher, autograd's bookkeeping and the kernel launch cost about the
  same per call whatever its size, `t_launch` each; it does not grow with the batch. Small models
  live here: a one-efficiency roofline cannot describe them (logistic regression at batch 64 and
  512 are almost the same step). A per-step constant is not a third term: for one model the
  number of calls does not change with the batch, so calls × t_launch already absorbs it.

`fit` solves the sum for two or more measured points by least squares on relative error, with
eff ≤ 1 (a step does not beat its roofline at this device's own peaks: if the fit wants more,
the counted bytes overstate what reached memory) and t_launch ≥ 0. Two points, two unknowns: an
exact fit unless a bound holds; where one does, `bounds_held` says which and what the unbounded
fit was, and `plan` prints both beside the figures that use the bound. `plan --calibrate`
(fasttrain.lab.calibration) measures the configuration at two batch sizes and reads the sum
this way on a CPU; on a GPU it reads the max. On another GPU the efficiency carries over as it
is; t_launch does not (a CPU's per-op cost is not a GPU's): it comes from the catalogue
(`launch_us`, with its source) or is DEFAULT_LAUNCH_S. On a GPU the host issues ahead of the
device: a GPU's step is the slower of the two terms, not their sum (`overlapped`;
fasttrain.lab.overlap, checked on three H100 loans and one H200). Data parallel: each GPU takes
1/n of the samples (`share`, the roofline term) but issues every call.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from torch.utils._python_dispatch import TorchDispatchMode

from fasttrain.lab import classify

if TYPE_CHECKING:
    from collections.abc import Callable

    from fasttrain.engine.config import TrainConfig

DEFAULT_EFFICIENCY = 0.3
# Seconds to issue one eager aten op to a GPU: the dispatcher and autograd's bookkeeping (a few
# µs on a current server CPU) plus cudaLaunchKernel (2-4 µs). An order of magnitude, not a
# measurement: no GPU was at hand. CUDA graphs replay a step without issuing (0).
DEFAULT_LAUNCH_S = 5e-6
DEFAULT_LAUNCH_SOURCE = "default: eager PyTorch's order of magnitude, not measured"
STEPS = 10  # timed steps per calibration point, after WARMUP
WARMUP = 2


@dataclass(frozen=True)
class StepWork:
    """What one optimizer step asks of any device, call by call."""

    calls: dict[tuple[float, float], int]  # (FLOPs, bytes read + written) of a call → calls
    grad_bytes: int  # what a data-parallel all-reduce moves (trainable parameters' gradients)

    @property
    def flops(self) -> float:
        return sum(f * n for (f, _), n in self.calls.items())

    @property
    def bytes(self) -> float:
        return sum(b * n for (_, b), n in self.calls.items())

    @property
    def ops(self) -> int:
        return sum(self.calls.values())


@dataclass(frozen=True)
class Fit:
    """The two constants of the model, and where they came from."""

    efficiency: float  # achieved fraction of the per-op roofline, (0, 1]
    launch_s: float  # seconds per op call on the device fitted on (not carried to another)
    device: str  # what it was fitted on ("cpu", a GPU's name), "" for the defaults
    source: str  # in words (with `held_note` where a bound held)
    held: tuple[str, ...] = ()  # the constants `fit` held at a bound: "efficiency", "launch_s"
    # (efficiency, launch_s) of the least squares without bounds, where a bound held
    unbounded: tuple[float, float] | None = None
    # the constants no measured point informed (calibration.read_max: both steps on one side of
    # the max), each the default within what the points allow: "efficiency", "launch_s"
    unidentified: tuple[str, ...] = ()
    model: str = "sum"  # how the steps were read: "sum" (a CPU's) or "max" (a GPU's: overlap)


@dataclass(frozen=True)
class Point:
    """One measured configuration: its roofline at this device's peaks, calls, measured step."""

    batch_size: int
    roofline_s: float
    ops: int
    measured_s: float  # median step
    step_times_s: tuple[float, ...] = ()


def default() -> Fit:
    return Fit(DEFAULT_EFFICIENCY, DEFAULT_LAUNCH_S, "",
               f"efficiency: default {DEFAULT_EFFICIENCY} (a stated guess: not calibrated)")


# -- counting ------------------------------------------------------------------------------------


class _CallCounter(TorchDispatchMode):
    """Every aten call below autograd (backward and optimizer included), once each."""

    def __init__(self):
        super().__init__()
        self.formulas, self.calls = classify.flop_formulas(), Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # One definition of what moves data and how many bytes: classify's (profile uses it).
        if classify.moves_no_data(func):
            return out
        formula = self.formulas.get(func._overloadpacket)
        flops = float(formula(*args, **kwargs, out_val=out)) if formula else 0.0
        self.calls[(flops, float(classify.bytes_moved(func, args, kwargs, out)))] += 1
        return out


def count_call(fn: Callable[[], object], grad_bytes: int = 0) -> StepWork:
    """The aten calls `fn` makes, counted."""
    counter = _CallCounter()
    with counter:
        fn()
    return StepWork(dict(counter.calls), grad_bytes)


def _grad_bytes(run) -> int:
    # Gradients take the parameter's dtype (fp32 under autocast as well): what DDP all-reduces.
    return sum(p.numel() * p.element_size() for p in run.model.parameters() if p.requires_grad)


def count_run(run, foreach: bool = False) -> StepWork:
    """A Run's optimizer step, counted on the eager module after one uncounted step (lazy
    optimizer state is not step work). The micro-batches are fetched outside the count, as they
    are outside `time_steps`'s clock: what is counted is what is timed. `foreach`: the optimizer
    counted on its foreach path, as CUDA runs it, where its param groups leave foreach to torch
    (None); set for the counted step only."""
    from fasttrain.engine.loop import endless_batches, step

    batches = endless_batches(run)
    step(run, next(batches))
    micro = next(batches)
    groups = [g for g in run.opt.param_groups if foreach and g.get("foreach", False) is None]
    for g in groups:
        g["foreach"] = True
    try:
        return count_call(lambda: step(run, micro, forward=run.model), _grad_bytes(run))
    finally:
        for g in groups:
            g["foreach"] = None


def count(cfg: TrainConfig, model=None, data=None, *, loss=None,
          foreach: bool = False) -> StepWork:
    """Build the configured Run (its device), count one step (`count_run`), and let it go."""
    from fasttrain.lab.memory import on_run

    return on_run(cfg, model, data, loss, lambda run: count_run(run, foreach))


# -- the model -----------------------------------------------------------------------------------


def roofline_s(work: StepWork, peak_flops: float, bandwidth: float) -> float:
    """The step with every call at its roof: Σ max(FLOPs / peak, bytes / bandwidth)."""
    return sum(n * max(f / peak_flops, b / bandwidth) for (f, b), n in work.calls.items())


def predict_s(work: StepWork, peak_flops: float, bandwidth: float, efficiency: float,
              launch_s: float, share: float = 1.0, overlapped: bool = False) -> float:
    """The step: its roofline over the efficiency, plus issuing every call at `launch_s`; with
    `overlapped` (a GPU: the host issues while the device computes) the slower of the two
    (fasttrain.lab.overlap). `share`: the fraction of the step's samples this device computes
    (1/n of data parallel: the FLOPs and activation bytes shrink, the calls issued do not)."""
    device = share * roofline_s(work, peak_flops, bandwidth) / efficiency
    return max(device, work.ops * launch_s) if overlapped else device + work.ops * launch_s


def _least_squares(points: list[Point]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, c): the relative-error system x @ (1/eff, t) ≈ y and its unbounded solution c."""
    if len(points) < 2:
        raise ValueError("fitting two constants needs at least two points")
    x = np.array([[p.roofline_s / p.measured_s, p.ops / p.measured_s] for p in points])
    y = np.ones(len(points))
    return x, y, np.linalg.lstsq(x, y, rcond=None)[0]


def fit(points: list[Point]) -> tuple[float, float]:
    """(efficiency, launch_s) minimizing Σ ((R/eff + n·t) / T − 1)² over the points, eff ≤ 1,
    t ≥ 0. Linear in (1/eff, t): the unconstrained least-squares solution when it is inside the
    bounds, else the best of the bounds' edges (the minimum of a convex quadratic over a box)."""
    x, y, inner = _least_squares(points)

    def residual(c) -> float:
        return float(np.sum((x @ c - y) ** 2))

    def edge(col: int, fixed: float, lo: float):  # the other constant fixed at its bound
        other = 1 - col
        rest = y - x[:, other] * fixed
        v = max(lo, float(x[:, col] @ rest / (x[:, col] @ x[:, col])))
        return np.array([v, fixed] if col == 0 else [fixed, v])

    tries = [edge(1, 1.0, 0.0), edge(0, 0.0, 1.0)]
    if inner[0] >= 1 and inner[1] >= 0:
        tries.append(inner)
    slowdown, launch = min(tries, key=residual)
    return float(1 / slowdown), float(launch)


def unbounded(points: list[Point]) -> tuple[float, float]:
    """(efficiency, launch_s) of the same least squares without `fit`'s bounds: what the
    measurements alone say — an efficiency above 1 (or negative, or inf: no roofline term at
    all), a negative cost per call."""
    slowdown, launch = _least_squares(points)[2]
    return (float(1 / slowdown) if slowdown else math.inf), float(launch)


def bounds_held(points: list[Point]) -> tuple[tuple[str, ...], tuple[float, float] | None]:
    """(the constants `fit` held at a bound — "efficiency" at 1, "launch_s" at 0 — and the
    unbounded fit), or ((), None) where the least squares was inside the bounds."""
    eff, launch = fit(points)
    free = unbounded(points)
    if (eff, launch) == free:  # fit took the unbounded solution itself
        return (), None
    held = (("efficiency",) if eff == 1.0 else ()) + (("launch_s",) if launch == 0.0 else ())
    return held, free


def held_note(fit: Fit) -> str:
    """Where a bound held, in words, with the unbounded fit; "" where none did."""
    if not fit.held:
        return ""
    eff, launch = fit.unbounded
    why = []
    if "efficiency" in fit.held:
        why.append("efficiency held at its bound 1 (the measured steps beat their per-op "
                   "roofline at these peaks: the counted bytes overstate what reached memory, or "
                   "the peaks understate this device)")
    if "launch_s" in fit.held:
        why.append("cost per call held at its bound 0 (the step shrank faster than its roofline "
                   "as the batch did)")
    return (f"BOUND HELD: {' and '.join(why)}; the unbounded fit was efficiency {eff:.3g}, "
            f"{launch * 1e6:.3g} µs per call, and the figures use the bound")


# -- measuring ---------------------------------------------------------------------------------


def time_steps(run, steps: int, warmup: int = WARMUP, clock=time.perf_counter,
               issued: list | None = None) -> list[float]:
    """Seconds of each of `steps` optimizer steps after `warmup`, each timed to the device's end
    (`clock` may be time.process_time for a one-thread CPU run on a shared machine). `issued`:
    appended, each step's seconds until the host returned from it (before the closing sync: on a
    GPU the host's issue time, on a CPU the step)."""
    from fasttrain.engine.loop import endless_steps, warm_up
    from fasttrain.timing import synchronizer

    sync = synchronizer(str(run.device))
    inputs = endless_steps(run)  # what run.train_step takes: the whole-step graph's, if any
    warm_up(run, inputs, warmup)
    times = []
    for _ in range(steps):
        step_input = next(inputs)  # fetched outside the clock: input time is not step time
        sync()
        t0 = clock()
        run.train_step(run, step_input)
        if issued is not None:
            issued.append(clock() - t0)
        sync()
        times.append(clock() - t0)
    return times


def hold_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in the process, as CUDA's caching allocator keeps its
    blocks; True where it applied. By default glibc unmaps large freed blocks and trims the heap,
    and the next step faults the same memory back in page by page: cnn at batch 128 on a 2-core
    EPYC took 30,000 page faults (125 MB) and 147 ms a step, 96 ms without them. A CPU-only cost
    that grows faster than the batch; calibrated with it, it would be carried to a GPU as
    inefficiency. Process-wide, so only a measuring command calls it."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows)
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # malloc.h
    return bool(mallopt(m_trim_threshold, 2**30)) and bool(mallopt(m_mmap_max, 0))
