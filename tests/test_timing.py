import pytest

from fasttrain.timing import EpochTimes, time_epochs


def test_epoch_ms_is_the_mean_of_the_latter_half():
    t = EpochTimes((100.0, 50.0, 12.0, 10.0, 11.0, 9.0))
    assert t.epoch_ms == pytest.approx(10.0)  # epochs 3..5
    s = t.summary()
    assert (s["epoch_ms_min"], s["epoch_ms_max"], s["total_ms"]) == (9.0, 100.0, 192.0)
    assert s["epoch_ms_median"] == pytest.approx(11.5)
    assert EpochTimes((7.0,)).epoch_ms == 7.0


def test_device_is_synchronized_around_every_clock_read():
    events = []
    times, results = time_epochs(
        lambda e: events.append(f"epoch{e}") or e * 2,
        3,
        sync=lambda: events.append("sync"),
        on_epoch=lambda e, ms, r: events.append(f"done{e}"),
    )
    assert events[:4] == ["sync", "epoch0", "sync", "done0"]
    assert events.count("sync") == 6 and len(times.ms) == 3 and results == [0, 2, 4]
