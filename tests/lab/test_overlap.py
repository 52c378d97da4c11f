"""The overlapped step (max of the device's roofline term and the host's issuing) and its exact
least squares, on points planted by hand."""

import pytest

from fasttrain.lab import overlap, steptime


def _planted(eff: float, issue: float, shapes) -> list[steptime.Point]:
    """Points whose steps follow max(R/eff, n·issue) exactly: shapes are (roofline_s, calls)."""
    return [steptime.Point(i, r, n, overlap.step_s(r, n, eff, issue))
            for i, (r, n) in enumerate(shapes)]


# Two host-bound points (flat: 40 calls at 30 µs = 1.2 ms) and two device-bound ones.
MIXED = [(1e-5, 40), (1e-4, 40), (2e-3, 60), (8e-3, 160)]


def test_the_step_is_the_slower_of_issuing_and_computing():
    assert overlap.step_s(1e-3, 10, 0.5, 1e-5) == pytest.approx(2e-3)  # the device: 2 ms
    assert overlap.step_s(1e-3, 300, 0.5, 1e-5) == pytest.approx(3e-3)  # the host: 3 ms


def test_predict_s_overlapped_is_the_max_and_the_default_the_sum():
    work = steptime.StepWork({(1e12, 0.0): 1, (0.0, 1e9): 9}, 0)  # 10 calls
    device = 1e12 / 1e14 + 9 * 1e9 / 1e12  # 0.01 + 0.009 s of roofline
    assert steptime.predict_s(work, 1e14, 1e12, 0.5, 1e-3) == pytest.approx(device / 0.5 + 0.01)
    assert steptime.predict_s(work, 1e14, 1e12, 0.5, 1e-3, overlapped=True) == pytest.approx(
        device / 0.5)
    assert steptime.predict_s(work, 1e14, 1e12, 0.5, 1e-2, overlapped=True) == pytest.approx(0.1)


def test_the_fit_recovers_planted_constants_from_both_regimes():
    eff, issue = overlap.fit(_planted(0.4, 3e-5, MIXED))
    assert eff == pytest.approx(0.4) and issue == pytest.approx(3e-5)


def test_the_fit_is_a_least_squares_no_grid_point_beats():
    points = _planted(0.4, 3e-5, MIXED)
    noisy = [steptime.Point(p.batch_size, p.roofline_s, p.ops, p.measured_s * k)
             for p, k in zip(points, (1.2, 0.9, 1.1, 0.95), strict=True)]

    def loss(eff, issue):
        return sum((overlap.step_s(p.roofline_s, p.ops, eff, issue) / p.measured_s - 1) ** 2
                   for p in noisy)

    best = loss(*overlap.fit(noisy))
    grid = [(e / 100, t * 1e-6) for e in range(5, 101) for t in range(0, 80)]
    assert best <= min(loss(e, t) for e, t in grid) + 1e-12


def test_a_constant_no_point_informs_is_held_at_its_bound():
    host_bound = _planted(0.4, 3e-5, [(1e-5, 40), (2e-5, 40)])  # the device never shows
    eff, issue = overlap.fit(host_bound)
    assert eff == 1.0 and issue == pytest.approx(3e-5)
    device_bound = _planted(0.4, 0.0, [(1e-3, 40), (4e-3, 40)])  # the host never shows
    eff, issue = overlap.fit(device_bound)
    assert eff == pytest.approx(0.4) and issue == 0.0


def test_one_point_is_refused():
    with pytest.raises(ValueError, match="at least two"):
        overlap.fit(_planted(0.4, 3e-5, MIXED[:1]))
