"""A training step's time on a GPU we do not have: a roofline, times an efficiency.

    work = count(cfg)                                    # one real step, counted (any device)
    t = predict_s(work, peak_flops, bandwidth, eff)      # max(FLOPs/peak, bytes/bw) / eff
    eff = calibrate(cfg)                                 # measured here: roofline / step time

The step's FLOPs are torch's FLOP formulas (torch.utils.flop_counter's registry, as the engine's
MFU count) over one eager optimizer step — forward, backward, optimizer; its bytes are what
`fasttrain.lab.classify` counts: every aten op's input and output tensors once (caches ignored,
so an upper bound on traffic; fusion by --compile would lower it). The roofline time is the
larger of the two at the precision's dense peak and the memory bandwidth: the step cannot beat
it. Real steps do not reach it — kernels below peak, launch overhead, the ops of a small model
too small to fill a GPU — so the roofline is divided by an efficiency:

- DEFAULT_EFFICIENCY, 0.3: a round, stated guess (well-tuned large-model training reaches 0.4–0.5
  of the bf16 peak; small models far less). An estimate for the order of magnitude only.
- a floor: an eager GPU step takes at least ISSUE_S per aten op to issue (small models live here).
- `calibrate`: a few steps of the same configuration timed on the present device against its own
  roofline (CPU: peaks measured with classify.measure_peaks; a known GPU: its data sheet). The
  fraction is carried over to the target as it is; how well it carries from a CPU to a GPU is
  exactly what it does not know, and the outputs say where it came from.

Data parallel over N GPUs (`on_gpus`): each GPU computes 1/N of the step's samples, and the ring
all-reduce of the gradients overlaps backward as DDP's buckets do (fasttrain.lab.scaling).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fasttrain.lab import classify, scaling

if TYPE_CHECKING:
    from collections.abc import Callable

    from fasttrain.engine.config import TrainConfig

DEFAULT_EFFICIENCY = 0.3
# Seconds to issue one eager aten op to a GPU (Python, dispatch, the kernel launch): a step of
# small ops is bound by issuing them, whatever the roofline says. 5 µs is the order eager PyTorch
# reaches on a current CPU; CUDA graphs replay a step without issuing, and lift this floor.
ISSUE_S = 5e-6
DEFAULT_SOURCE = "default 0.3 (a stated guess: not calibrated)"


@dataclass(frozen=True)
class StepWork:
    """What one optimizer step of a configuration asks of any device."""

    flops: float  # FLOP
    bytes: float  # bytes read + written
    grad_bytes: int  # what a data-parallel all-reduce moves (trainable parameters' gradients)
    ops: int = 0  # aten calls: each is at least one kernel to issue


@dataclass(frozen=True)
class Efficiency:
    value: float  # achieved fraction of the roofline
    source: str  # where it came from, in words


def count_call(fn: Callable[[], object]) -> tuple[float, float]:
    """(FLOPs, bytes) of the aten ops `fn` runs, counted as classify counts a step."""
    counter = classify._Counter(classify.Peaks(1.0, 1.0, "unused"))  # only totals are read
    with counter:
        fn()
    return counter.work.flops, counter.work.bytes


def _grad_bytes(run) -> int:
    # Gradients take the parameter's dtype (fp32 under autocast as well): what DDP all-reduces.
    return sum(p.numel() * p.element_size() for p in run.model.parameters() if p.requires_grad)


def count_run(run) -> StepWork:
    """A Run's step, counted after one uncounted step (lazy optimizer state is not step work)."""
    from fasttrain.engine.loop import endless_batches, step

    batches = endless_batches(run)
    step(run, next(batches))
    work = classify.count_step(run, batches, classify.Peaks(1.0, 1.0, "unused"))
    ops = sum(w.calls for w in work.by_op.values())
    return StepWork(work.flops, work.bytes, _grad_bytes(run), ops)


def count(cfg: TrainConfig, model=None, data=None, *, loss=None) -> StepWork:
    """Build the configured Run (its device), count one step, and let it go."""
    from fasttrain.engine.run import build
    from fasttrain.lab.memory import free_memory

    run = build(cfg, model=model, data=data, loss=loss, verbose=False)
    try:
        return count_run(run)
    finally:
        del run
        free_memory()


def roofline_s(work: StepWork, peak_flops: float, bandwidth: float) -> float:
    """The step at the device's roof: the slower of its compute and its memory traffic."""
    return max(work.flops / peak_flops, work.bytes / bandwidth)


def predict_s(work: StepWork, peak_flops: float, bandwidth: float, efficiency: float,
              issue_s: float = 0.0) -> float:
    """The roofline over the efficiency, and never less than issuing the step's ops one by one
    (`issue_s` each: ISSUE_S for an eager GPU step, 0 where it does not apply)."""
    return max(roofline_s(work, peak_flops, bandwidth) / efficiency, work.ops * issue_s)


def on_gpus(compute_s: float, grad_bytes: int, n: int, link: scaling.Link) -> dict[str, float]:
    """The step on `n` data-parallel GPUs, each taking 1/n of the samples of a one-GPU step of
    `compute_s` seconds (FLOPs and activation bytes are linear in the batch; the optimizer's
    bytes are not, so this is optimistic for tiny batches), all-reduce overlapped as DDP does."""
    return scaling.step_time(compute_s / n, grad_bytes, n, link)


def efficiency(measured_s: float, roof_s: float) -> float:
    """The fraction of its roofline a measured step achieved."""
    return roof_s / measured_s


def time_steps(run, steps: int, warmup: int = 2, clock=time.perf_counter) -> list[float]:
    """Seconds of each of `steps` optimizer steps after `warmup` (each timed to the device's end;
    `clock` may be time.process_time for a one-thread CPU run on a shared machine).
    The calibration takes the fastest: on a shared machine other work can only slow a step down,
    so the fastest is the closest to what this device does (as fasttrain.peaks argues)."""
    from fasttrain.engine.loop import endless_batches, step
    from fasttrain.timing import synchronizer

    sync = synchronizer(str(run.device))
    batches = endless_batches(run)
    for _ in range(warmup):
        step(run, next(batches))
    times = []
    for _ in range(steps):
        micro = next(batches)  # fetched outside the clock: input time is not step time
        sync()
        t0 = clock()
        step(run, micro)
        sync()
        times.append(clock() - t0)
    return times


def calibrate(cfg: TrainConfig, model=None, data=None, *, loss=None,
              steps: int = 5) -> tuple[Efficiency, dict]:
    """Time `steps` steps of the configuration on its device and return the achieved fraction of
    that device's roofline, with the figures behind it."""
    from fasttrain.engine.run import build
    from fasttrain.lab.memory import free_memory

    run = build(cfg, model=model, data=data, loss=loss, verbose=False)
    try:
        times = time_steps(run, steps)
        measured = min(times)
        work = count_run(run)
        peaks = classify.device_peaks(run.device, cfg.precision)
        device = str(run.device)
    finally:
        del run
        free_memory()
    roof = roofline_s(work, peaks.flops, peaks.bandwidth)
    eff = efficiency(measured, roof)
    basis = {"device": device, "measured_step_s": measured, "step_times_s": times,
             "median_step_s": statistics.median(times), "roofline_s": roof,
             "peak_flops": peaks.flops, "bandwidth": peaks.bandwidth, "peaks": peaks.source,
             "flops": work.flops, "bytes": work.bytes, "steps": steps}
    source = (f"calibrated on {device}: {cfg.model} at batch {cfg.batch_size}, {cfg.precision}, "
              f"fastest of {steps} steps {measured * 1e3:.4g} ms vs roofline {roof * 1e3:.4g} ms "
              f"(peaks {peaks.source}: {peaks.flops / 1e9:.0f} GFLOP/s, "
              f"{peaks.bandwidth / 1e9:.0f} GB/s)")
    return Efficiency(eff, source), basis


def default() -> Efficiency:
    return Efficiency(DEFAULT_EFFICIENCY, DEFAULT_SOURCE)

