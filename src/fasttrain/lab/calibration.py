"""`plan --calibrate`: a configuration timed here at two batch sizes, and steptime's two
constants read from the two steps.

    fit, basis = calibrate(cfg)          # steptime.Fit, and the figures behind it (plan's JSON)

The two points are the configured batch size and `second_batch` (half, or double), each the
median of STEPS timed steps (steptime.time_steps), counted after timing (steptime.count_run, the
optimizer's path as timed). How they are read depends on what computes the step:

- a CPU: one thread computes and issues, so a step is the sum R/eff + calls × t_launch, and
  steptime.fit solves it (exact for two points unless a bound holds; `held`, `unbounded`);
- a GPU: the host issues ahead of the device, so a step is the slower of R/eff and calls ×
  t_issue — the model `plan` predicts every GPU's step with (fasttrain.lab.overlap) — and the
  efficiency comes from the device-bound point, the issue cost from the host-bound one
  (overlap.read_two). Where both points are on one side, the other side's constant is not
  identified: the measurements only bound it (eff ≥ max R/T: a slower device would have shown;
  t_issue ≤ min T/calls), and the Fit takes the stated default within that bound and says so
  (`unidentified`). Fitting the sum there instead, as before, read a host-bound small batch
  plus a device-bound large one as the two terms added: an efficiency too high and an issue
  cost too low, applied then as the sum on this GPU and as the max on the others.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING

from fasttrain.lab import classify, overlap, steptime
from fasttrain.lab.steptime import Fit, Point

if TYPE_CHECKING:
    from collections.abc import Callable

    from fasttrain.engine.config import TrainConfig


def second_batch(cfg: TrainConfig) -> int:
    """The calibration's other batch size: half the configured one where it still splits into
    the accumulation steps (less memory than doubling), else double."""
    half = cfg.batch_size // 2
    return half if half >= cfg.accum_steps and half % cfg.accum_steps == 0 else 2 * cfg.batch_size


def _measuring(device, precision: str) -> tuple[classify.Peaks, Callable[[], float], str, bool]:
    """(peaks, clock, how, overlapped) for a calibration on `device`. A CPU at fp32 is measured
    as benchmarks/plan_accuracy.py measures it, so that a shared machine's load does not pass
    for inefficiency: ONE torch thread (the caller restores the count), each step timed by that
    thread's CPU time, peaks measured the same way, freed memory held
    (steptime.hold_freed_memory). Elsewhere: wall time to the device's end,
    classify.device_peaks (a GPU's data sheet). `overlapped`: a CUDA device, whose host issues
    while it computes (the steps are read by the max, not the sum)."""
    overlapped = device.type == "cuda"
    if device.type == "cpu" and precision == "fp32":
        try:
            from fasttrain.peaks import measure_cpu
        except ImportError:  # numba missing: the general path below
            pass
        else:
            import torch

            steptime.hold_freed_memory()
            p = measure_cpu(n_threads=1)
            torch.set_num_threads(1)  # after numba, whose pool may raise OpenMP's thread count
            peaks = classify.Peaks(p["fp32_flops"], p["bandwidth"], "fasttrain.peaks, 1 thread")
            return peaks, time.thread_time, "one thread, its CPU time", overlapped
    return classify.device_peaks(device, precision), time.perf_counter, "wall time", overlapped


def read_sum(points: list[Point]) -> tuple[float, float, tuple, tuple | None, tuple, str]:
    """(eff, t_launch, held, unbounded, unidentified, note) of the sum (a CPU's step)."""
    eff, launch = steptime.fit(points)
    held, free = steptime.bounds_held(points)
    return eff, launch, held, free, (), ""


def read_max(points: list[Point]) -> tuple[float, float, tuple, tuple | None, tuple, str]:
    """(eff, t_issue, held, unbounded, unidentified, note) of the max (a GPU's step,
    overlap.read_two): an unidentified constant is the default within what the points allow;
    an efficiency above 1 is held at 1, as steptime.fit holds it."""
    r = overlap.read_two(points)
    eff, issue, unknown, notes = r.efficiency, r.issue_s, [], []
    if "efficiency" in r.unidentified:
        eff = max(steptime.DEFAULT_EFFICIENCY, r.efficiency)
        unknown.append("efficiency")
        notes.append(f"EFFICIENCY NOT IDENTIFIED: both steps issue-bound (flat per call), so "
                     f"the device never showed; they allow any efficiency ≥ "
                     f"{r.efficiency:.3g}, and the figures use {min(eff, 1.0):.3g} (the default "
                     f"{steptime.DEFAULT_EFFICIENCY}, or that bound if higher)")
    if "issue_s" in r.unidentified:
        issue = min(steptime.DEFAULT_LAUNCH_S, r.issue_s)
        unknown.append("launch_s")
        notes.append(f"COST PER CALL NOT IDENTIFIED: both steps device-bound (in proportion "
                     f"to their roofline), so issuing never showed; they allow any cost ≤ "
                     f"{r.issue_s * 1e6:.3g} µs per call, and the figures use "
                     f"{issue * 1e6:.3g} µs (the default, or that bound if lower)")
    held = ("efficiency",) if eff > 1 else ()
    regimes = ", ".join(f"batch {p.batch_size} {g}-bound"
                        for p, g in zip(points, r.regimes, strict=True))
    note = f"read as the slower of device and host ({regimes})"
    return (min(eff, 1.0), issue, held, (eff, issue) if held else None, tuple(unknown),
            "; ".join([note, *notes]))


def calibrate(cfg: TrainConfig, model=None, data=None, *, loss=None,
              steps: int = steptime.STEPS) -> tuple[Fit, dict]:
    """Measure the configuration at its batch size and `second_batch` on its device (as
    `_measuring` says) and read the model's two constants from the two steps (module
    docstring), with the figures behind them."""
    import torch

    from fasttrain.engine.run import build
    from fasttrain.lab.memory import free_memory, users_code

    points, setup, device, threads = [], None, "", torch.get_num_threads()
    try:
        for b in (cfg.batch_size, second_batch(cfg)):
            run = build(dataclasses.replace(cfg, batch_size=b), model=model, data=data,
                        loss=loss, verbose=False)
            try:
                if setup is None:
                    setup, device = _measuring(run.device, cfg.precision), _device_name(run.device)
                peaks, clock, how, overlapped = setup
                with users_code(run):
                    times = steptime.time_steps(run, steps, clock=clock)
                    work = steptime.count_run(run)  # the optimizer's path as timed here
            finally:
                del run
                free_memory()
            points.append(Point(b, steptime.roofline_s(work, peaks.flops, peaks.bandwidth),
                                work.ops, statistics.median(times), tuple(times)))
    finally:
        torch.set_num_threads(threads)
    eff, launch, held, free, unknown, note = (read_max if overlapped else read_sum)(points)
    p, q = points
    source = (f"fitted on {device} to {cfg.model} at batch {p.batch_size} and {q.batch_size} "
              f"({cfg.precision}; median of {steps} steps, {how}: {p.measured_s * 1e3:.4g} and "
              f"{q.measured_s * 1e3:.4g} ms; per-op roofline {p.roofline_s * 1e3:.3g} and "
              f"{q.roofline_s * 1e3:.3g} ms, {p.ops} and {q.ops} calls; peaks {peaks.source}: "
              f"{peaks.flops / 1e9:.0f} GFLOP/s, {peaks.bandwidth / 1e9:.0f} GB/s"
              + (f"; {note}" if note else "") + f"): efficiency {eff:.2g} (carried over), "
              f"{launch * 1e6:.2g} µs per call (this device's only)")
    fitted = Fit(eff, launch, device, source, held, free, unknown,
                 "max" if overlapped else "sum")
    if held:
        fitted = dataclasses.replace(fitted, source=f"{source}. {steptime.held_note(fitted)}")
    basis = {"device": device, "points": [dataclasses.asdict(x) for x in points],
             "peak_flops": peaks.flops, "bandwidth": peaks.bandwidth, "peaks": peaks.source,
             "clock": how, "steps": steps, "model": fitted.model, "efficiency": eff,
             "launch_s": launch, "held": list(held), "unidentified": list(unknown),
             "unbounded": {"efficiency": free[0], "launch_s": free[1]} if free else None}
    return fitted, basis


def _device_name(device) -> str:
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return device.type
