"""`plan --calibrate`'s two points: read by the sum on a CPU, by the max on a GPU (each constant
from the point on its side; unidentified where both are on one side), on planted steps."""

import dataclasses

import pytest
import torch

from fasttrain.engine.config import TrainConfig
from fasttrain.lab import calibration, classify, overlap, steptime

CFG = TrainConfig(model="logreg", data="synthetic", batch_size=64, device="cpu")
PEAKS = classify.Peaks(1e11, 2e10, "planted")


def test_the_second_calibration_batch_splits_into_accumulation_steps():
    assert calibration.second_batch(CFG) == 32
    assert calibration.second_batch(dataclasses.replace(CFG, batch_size=1)) == 2
    assert calibration.second_batch(dataclasses.replace(CFG, batch_size=8, accum_steps=8)) == 16


def test_calibration_fits_two_batch_sizes_and_reports_its_basis():
    threads = torch.get_num_threads()
    fit, basis = calibration.calibrate(CFG, steps=3)
    assert torch.get_num_threads() == threads  # one thread while measuring, restored after
    assert basis["clock"] == "one thread, its CPU time" and basis["model"] == "sum"
    assert [p["batch_size"] for p in basis["points"]] == [64, 32]
    assert 0 < fit.efficiency <= 1 and fit.launch_s >= 0 and fit.device == "cpu"
    assert (fit.efficiency, fit.launch_s) == (basis["efficiency"], basis["launch_s"])
    points = [steptime.Point(**{**p, "step_times_s": tuple(p["step_times_s"])})
              for p in basis["points"]]
    assert steptime.fit(points) == (fit.efficiency, fit.launch_s)  # the basis is what was fitted
    assert all(len(p.step_times_s) == 3 and p.ops > 0 for p in points)
    assert "fitted on cpu to logreg at batch 64 and 32" in fit.source


# -- the max, on planted points ------------------------------------------------------------------


def _points(eff: float, issue: float, shapes, spread: float = 0.0) -> list[steptime.Point]:
    """Points whose median steps are max(R/eff, n·issue) exactly, their steps ±spread around
    it: shapes are (batch, roofline_s, calls)."""
    out = []
    for b, r, n in shapes:
        t = overlap.step_s(r, n, eff, issue)
        steps = tuple(t * (1 + spread * k) for k in (-1, -0.5, 0, 0.5, 1))
        out.append(steptime.Point(b, r, n, t, steps))
    return out


def test_each_constant_comes_from_the_point_on_its_side():
    # 40 calls at 30 µs: 1.2 ms to issue; batch 32's device 0.5 ms (host-bound), 512's 8 ms
    points = _points(0.4, 3e-5, [(512, 3.2e-3, 40), (32, 2e-4, 40)])
    r = overlap.read_two(points)
    assert r.regimes == ("device", "host") and r.unidentified == ()
    assert (r.efficiency, r.issue_s) == pytest.approx((0.4, 3e-5), rel=1e-12)
    eff, launch, held, free, unknown, note = calibration.read_max(points)
    assert (eff, launch) == pytest.approx((0.4, 3e-5), rel=1e-12)
    assert (held, free, unknown) == ((), None, ())
    assert "batch 512 device-bound, batch 32 host-bound" in note
    # the sum read the same steps as both terms added: another efficiency, another cost per call
    assert steptime.fit(points) != pytest.approx((0.4, 3e-5), rel=0.05)


def test_flat_steps_leave_the_efficiency_unidentified():
    # both host-bound: 1.2 ms whatever the batch; the device (0.2 and 0.8 ms at eff 0.9) never
    # shows: any efficiency ≥ R/T of the larger (0.72 ms / 1.2 ms = 0.6) fits them
    points = _points(0.9, 3e-5, [(32, 1.8e-4, 40), (128, 7.2e-4, 40)])
    r = overlap.read_two(points)
    assert r.regimes == ("host", "host") and r.unidentified == ("efficiency",)
    assert r.issue_s == pytest.approx(3e-5) and r.efficiency == pytest.approx(0.6)
    eff, launch, held, free, unknown, note = calibration.read_max(points)
    assert eff == pytest.approx(0.6) and launch == pytest.approx(3e-5)
    assert unknown == ("efficiency",) and "EFFICIENCY NOT IDENTIFIED" in note
    lower = _points(0.9, 3e-5, [(32, 1.8e-5, 40), (128, 7.2e-5, 40)])  # allows eff ≥ 0.06
    eff, *_ = calibration.read_max(lower)
    assert eff == steptime.DEFAULT_EFFICIENCY  # the default, inside what the points allow


def test_steps_in_proportion_to_the_roofline_leave_the_cost_per_call_unidentified():
    # both device-bound (4 and 16 ms at eff 0.5); issuing 40 calls at 1 µs never shows
    points = _points(0.5, 1e-6, [(32, 2e-3, 40), (128, 8e-3, 40)])
    r = overlap.read_two(points)
    assert r.regimes == ("device", "device") and r.unidentified == ("issue_s",)
    assert r.efficiency == pytest.approx(0.5) and r.issue_s == pytest.approx(4e-3 / 40)
    eff, launch, held, free, unknown, note = calibration.read_max(points)
    assert eff == pytest.approx(0.5) and unknown == ("launch_s",)
    assert launch == steptime.DEFAULT_LAUNCH_S  # the default: below the 100 µs they allow
    assert "COST PER CALL NOT IDENTIFIED" in note


def test_a_rise_within_the_steps_jitter_is_not_read_as_the_device():
    # host-bound at both batches, the larger's median 5% up by chance; its steps ±20%
    shapes = [(32, 1e-5, 40), (512, 1.6e-4, 40)]
    flat = _points(0.4, 3e-5, shapes, spread=0.2)
    noisy = [flat[0], dataclasses.replace(flat[1], measured_s=flat[1].measured_s * 1.05,
             step_times_s=tuple(t * 1.05 for t in flat[1].step_times_s))]
    assert overlap.read_two(noisy).regimes == ("host", "host")
    # the same medians with steps ±1%: the rise is measured, and is the device's
    tight = [dataclasses.replace(p, step_times_s=tuple(
        p.measured_s * (1 + 0.01 * k) for k in (-1, 0, 1))) for p in noisy]
    r = overlap.read_two(tight)
    assert r.regimes == ("host", "device")
    assert r.efficiency == pytest.approx(1.6e-4 / (1.2e-3 * 1.05))


def test_an_efficiency_above_one_is_held_at_its_bound():
    points = _points(1.25, 3e-5, [(512, 3.2e-3, 40), (32, 2e-4, 40)])
    eff, launch, held, free, unknown, _ = calibration.read_max(points)
    assert eff == 1.0 and held == ("efficiency",)
    assert free == pytest.approx((1.25, 3e-5))


def test_a_calibration_on_a_gpu_reads_its_steps_by_the_max(monkeypatch):
    """Real counted logreg steps, their times planted as the max of a device at efficiency 0.4
    and a host issuing at a cost that puts batch 32 host-bound and batch 64 device-bound."""
    work = steptime.count(CFG)
    r64 = steptime.roofline_s(work, PEAKS.flops, PEAKS.bandwidth)
    r32 = steptime.roofline_s(steptime.count(dataclasses.replace(CFG, batch_size=32)),
                              PEAKS.flops, PEAKS.bandwidth)
    issue = (r32 + r64) / 2 / 0.4 / work.ops  # between the two devices' times

    def planted_steps(run, steps, clock=None):
        w = steptime.count_run(run)
        return [overlap.step_s(steptime.roofline_s(w, PEAKS.flops, PEAKS.bandwidth), w.ops,
                               0.4, issue)] * steps

    monkeypatch.setattr(calibration, "_measuring",
                        lambda device, precision: (PEAKS, None, "planted", True))
    monkeypatch.setattr(steptime, "time_steps", planted_steps)
    fit, basis = calibration.calibrate(CFG, steps=3)
    assert fit.model == "max" and basis["model"] == "max" and fit.unidentified == ()
    assert (fit.efficiency, fit.launch_s) == pytest.approx((0.4, issue), rel=1e-9)
    assert "batch 64 device-bound, batch 32 host-bound" in fit.source
