"""benchmarks/input_pipeline.py on a handful of images: its data, its augmentation, and one short
in-process round of every contender producing a result of the documented schema (no timing)."""

import json
import random
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import import_benchmark, tiny_images


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("input_pipeline")


@pytest.fixture
def pngs(bench, tmp_path):
    data = tiny_images(n_train=12, n_test=1)
    return data, bench.write_pngs(tmp_path, data.train_x, data.train_y)


def test_pngs_decode_to_the_images_and_are_reused(bench, pngs, tmp_path):
    data, samples = pngs
    assert bench.list_pngs(str(tmp_path), 12) == samples
    assert bench.list_pngs(str(tmp_path), 5) == samples[:5]
    assert [label for _, label in samples] == data.train_y.tolist()
    plain = bench.PngFolder(samples, augmented=False)
    for i in range(len(plain)):
        x, label = plain[i]
        assert x.shape == (1, 28, 28) and x.dtype.is_floating_point
        np.testing.assert_array_equal((x[0].numpy() * 255).round(), data.train_x[i])
        assert label == data.train_y[i]
    stamps = [Path(p).stat().st_mtime_ns for p, _ in samples]
    assert bench.write_pngs(tmp_path, data.train_x, data.train_y) == samples
    assert [Path(p).stat().st_mtime_ns for p, _ in samples] == stamps  # not rewritten


def test_augment_is_a_padded_crop_flipped_half_the_time(bench):
    img = np.random.default_rng(0).integers(1, 256, size=(28, 28), dtype=np.uint8)
    padded = np.pad(img, 2)
    rng, seen = random.Random(0), set()
    for _ in range(400):
        out = bench.augment(img, rng)
        assert out.shape == (28, 28)
        match = [(dy, dx, flip) for dy in range(5) for dx in range(5) for flip in (0, 1)
                 if np.array_equal(out, padded[dy:dy + 28, dx:dx + 28][:, ::-1] if flip
                                   else padded[dy:dy + 28, dx:dx + 28])]
        assert len(match) == 1
        seen.add(match[0])
    assert len(seen) == 50  # every offset, flipped and not
    again = random.Random(0)
    assert np.array_equal(bench.augment(img, again), bench.augment(img, random.Random(0)))


def test_one_round_of_every_contender_gives_the_schema(bench, pngs, tmp_path):
    _, samples = pngs
    s = bench.Settings(images_dir=str(tmp_path), limit=12, batch_size=4, workers=0, warmup=1,
                       steps=2, device="cpu")
    result = bench.run_all(s, samples, rounds=1, measure_one=bench.measure, echo=lambda _: None)
    assert result["schema"] == "fasttrain.input_pipeline/1"
    assert {"cpu", "cores", "torch", "git_commit"} <= set(result["env"])
    assert result["config"]["batch_size"] == 4 and result["config"]["images"] == 12
    assert len(result["load"]["before"]) == len(result["load"]["after"]) == 3
    rows = result["rows"]
    assert [(r["regime"], r["contender"]) for r in rows] == [
        (g, c) for g in bench.REGIMES for c in bench.CONTENDERS]
    for r in rows:  # a peer not installed here is a row saying so
        expected = "ok" if bench.unavailable(r["contender"]) is None else "unavailable"
        assert r["status"] == expected, r["reason"]
        if expected == "ok":
            assert r["samples_per_s_median"] > 0 and len(r["samples_per_s_rounds"]) == 1
    hand = [r for r in rows if r["contender"] == "hand-written"]
    assert all(r["vs_hand"] == 1.0 for r in hand)
    assert len(result["runs"]) == 8
    assert all(r["window_s"] > 0 for r in result["runs"] if r["status"] == "ok")
    ok = [r for r in result["runs"] if r["status"] == "ok"]
    assert all(r["main_cpu_ms_per_step"] >= 0 for r in ok)  # this process: always read
    assert all(r["main_cpu_ms_per_step_median"] is not None for r in rows if r["status"] == "ok")
    result["targets"] = bench.targets(rows)
    assert set(result["targets"]) == set(bench.REGIMES)
    out = tmp_path / "result.json"
    from fasttrain.report import write_json

    write_json(out, result)
    assert json.loads(out.read_text())["rows"] == rows
    bench.table(result)  # renders


def test_a_failing_contender_is_a_failed_row(bench, monkeypatch):
    monkeypatch.setattr(bench, "unavailable", lambda name: None)  # every peer "installed"
    def measure_one(name, regime, s, samples):
        if name == "lightning":
            raise RuntimeError("boom")
        return {"samples_per_s": {"hand-written": 100.0}.get(name, 50.0)}

    s = bench.Settings(images_dir="unused")
    result = bench.run_all(s, [], rounds=2, measure_one=measure_one, echo=lambda _: None,
                           regimes=("input-bound",))
    rows = {r["contender"]: r for r in result["rows"]}
    assert rows["lightning"]["status"] == "failed" and "boom" in rows["lightning"]["reason"]
    assert rows["fasttrain"]["vs_hand"] == 0.5 and rows["fasttrain"]["vs_best_peer"] == 1.0
    assert bench.targets(result["rows"])["input-bound"]["met"] is None  # no path: not judged


def test_the_paired_ratio_is_the_median_of_per_round_ratios(bench):
    # Round 0: fasttrain 90 vs hand 100; round 1: 200 vs 250 (a faster machine that round);
    # round 2: fasttrain only (no pair). Paired: median(0.9, 0.8) = 0.85; of medians: 145/175.
    runs = [{"regime": "compute-bound", "round": r, "contender": c, "status": "ok",
             "samples_per_s": v}
            for r, c, v in ((0, "fasttrain", 90.0), (0, "hand-written", 100.0),
                            (1, "fasttrain", 200.0), (1, "hand-written", 250.0),
                            (2, "fasttrain", 100.0))]
    rows = {r["contender"]: r for r in
            bench.summarize(runs, ("fasttrain", "hand-written"), {"compute-bound": "cnn"})}
    assert rows["fasttrain"]["vs_hand_paired"] == pytest.approx(0.85)
    assert rows["fasttrain"]["vs_hand"] == pytest.approx(100.0 / 175.0)
    assert rows["hand-written"]["vs_hand_paired"] == 1.0


def test_a_missing_peer_is_unavailable(bench, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "accelerate" else real(name, *a))
    assert "accelerate is not installed" in bench.unavailable("accelerate")
    assert bench.unavailable("hand-written") is None


def test_the_window_times_only_the_steps_after_warmup(bench):
    clock = bench.Window(bench.Settings(images_dir="unused", warmup=2, steps=3, batch_size=10))
    for _ in range(4):
        clock.tick()
    with pytest.raises(RuntimeError, match="only 4 of 5 steps"):
        clock.row(10)
    clock.tick()
    row = clock.row(10)
    assert clock.t0 <= clock.start <= clock.end
    assert row["samples_per_s"] == pytest.approx(30 / (clock.end - clock.start))


def test_a_run_in_a_fresh_process_reports_its_row(bench, pngs, tmp_path):
    s = bench.Settings(images_dir=str(tmp_path), limit=12, batch_size=4, workers=0, warmup=1,
                       steps=2, device="cpu")
    row = bench.measure_in_child("hand-written", "input-bound", s, pngs[1])
    assert row["samples_per_s"] > 0 and row["window_s"] > 0


def test_targets_are_judged_on_medians_of_a_streamed_fasttrain(bench, monkeypatch):
    monkeypatch.setattr(bench, "unavailable", lambda name: None)
    speeds = {"fasttrain": [99.0, 101.0, 97.0], "lightning": [100.0] * 3,
              "accelerate": [90.0] * 3, "hand-written": [100.0] * 3}

    def measure_one(name, regime, s, samples):
        return {"samples_per_s": speeds[name].pop(), "path": "streamed"}

    result = bench.run_all(bench.Settings(images_dir="unused"), [], rounds=3,
                           measure_one=measure_one, echo=lambda _: None,
                           regimes=("compute-bound",))
    ft = result["rows"][0]
    assert ft["samples_per_s_median"] == 99.0 and ft["spread"] == pytest.approx(4 / 99)
    judged = bench.targets(result["rows"])["compute-bound"]
    assert judged["ratio"] == pytest.approx(0.99) and judged["met"] is True
    assert judged["largest_spread"] == pytest.approx(4 / 99)


def test_the_workers_cpu_is_read_from_this_process_children(bench, tmp_path):
    import os

    def stat(pid, comm, ppid, utime, stime):
        (tmp_path / str(pid)).mkdir()
        rest = ["S", ppid, *[0] * 9, utime, stime, *[0] * 5]  # fields 3.. of proc(5)
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(map(str, rest)))

    hz = os.sysconf("SC_CLK_TCK")
    stat(11, "pt_data_worker", os.getpid(), 3 * hz, hz)  # a worker: 4 s
    stat(12, "odd) name (", os.getpid(), hz // 2, 0)  # a name holding ") ": 0.5 s
    stat(13, "someone else", os.getpid() + 1, 100 * hz, 0)  # not a child of this process
    (tmp_path / "self").mkdir()
    assert bench.children_cpu_s(str(tmp_path)) == pytest.approx(4.5, abs=1 / hz)
    assert bench.children_cpu_s(str(tmp_path / "missing")) is None


def test_threads_are_a_count_or_torchs_default(bench, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--threads", "-1"])
    assert e.value.code == 2 and "--threads -1" in capsys.readouterr().err
    assert bench.Settings(images_dir="unused").threads == 0  # torch's own, unless asked
