"""benchmarks/peers_in_memory.py as an instrument: every contender trains through its API on
tensors, fasttrain on its in-memory path, and the summary's ratios are the ones stated."""

import pytest
import torch

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("peers_in_memory")


def test_every_contender_trains_in_process_and_fasttrain_stays_in_memory(bench, monkeypatch):
    g = torch.Generator().manual_seed(0)
    data = torch.rand(64, 1, 28, 28, generator=g), torch.randint(0, 10, (64,), generator=g)
    monkeypatch.setattr(bench, "tensors", lambda data_dir, limit: data)
    s = bench.Settings(images_dir="", batch_size=16, workers=0, warmup=1, steps=2)
    result = bench.run_all(s, 1, ("mlp",), None, 64, measure_one=bench.measure,
                           echo=lambda _: None, steps={"mlp": 3})
    assert result["config"]["steps"] == {"mlp": 3}
    rows = {r["contender"]: r for r in result["rows"]}
    assert set(rows) == set(bench.CONTENDERS)
    for name, r in rows.items():  # a peer not installed here is a row saying so
        expected = "ok" if bench.unavailable(name) is None else "unavailable"
        assert r["status"] == expected, r["reason"]
    assert rows["hand-indexed"]["vs_reference"] == 1.0
    assert all(run["steps"] == 3 for run in result["runs"])


def test_fasttrain_refuses_to_be_timed_off_its_in_memory_path(bench, monkeypatch):
    import fasttrain

    real = fasttrain.build
    monkeypatch.setattr(fasttrain, "build", lambda **kw: real(**{**kw, "data": torch.utils.data
                                                                 .TensorDataset(*kw["data"])}))
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(32, 1, 28, 28, generator=g), torch.randint(0, 10, (32,), generator=g)
    s = bench.Settings(images_dir="", batch_size=16, workers=0, warmup=1, steps=1)
    with pytest.raises(RuntimeError, match="streamed path, not the in-memory one"):
        bench.train_fasttrain(bench.make_model("mlp", 0), x, y, s, bench.Window(s))


def test_ratios_to_the_careful_hand_loop_of_medians_and_paired(bench):
    runs = [{"model": "mlp", "round": r, "contender": c, "status": "ok", "samples_per_s": v,
             "main_cpu_ms_per_step": 1.0}
            for r, c, v in ((0, "fasttrain", 90.0), (0, "hand-indexed", 100.0),
                            (1, "fasttrain", 160.0), (1, "hand-indexed", 200.0))]
    rows = {r["contender"]: r for r in bench.summarize(runs, ("mlp",),
                                                       ("fasttrain", "hand-indexed"))}
    assert rows["fasttrain"]["vs_reference"] == pytest.approx(125.0 / 150.0)
    assert rows["fasttrain"]["vs_reference_paired"] == pytest.approx(0.85)  # median(0.9, 0.8)
    assert rows["hand-indexed"]["vs_reference_paired"] == 1.0


def test_max_seconds_starts_no_run_that_would_end_after_it_and_each_run_is_saved(bench):
    """Runs of 10 s on a fake clock, at most 35 s: runs end at 10, 20, 30; a fourth would end at
    40. The result so far is saved after every run (a step killed from outside keeps it)."""
    now = [0.0]

    def measure_one(name, model, s, data_dir, limit):
        now[0] += 10.0
        return {"samples_per_s": 100.0, "main_cpu_ms_per_step": 1.0}

    saved = []
    s = bench.Settings(images_dir="", batch_size=16, workers=0, warmup=1, steps=2)
    contenders = ("fasttrain", "hand-indexed")
    result = bench.run_all(s, 2, ("mlp",), None, 64, contenders, measure_one=measure_one,
                           echo=lambda _: None, max_seconds=35, save=saved.append,
                           clock=lambda: now[0])
    assert [(r["round"], r["contender"]) for r in result["runs"]] == [
        (0, "fasttrain"), (0, "hand-indexed"), (1, "hand-indexed")]  # round 2 rotated
    assert (result["runs_done"], result["runs_planned"]) == (3, 4)
    assert result["stopped_early"] == ("after 3 of 4 runs: another (~10 s, the longest so far) "
                                       "would end after --max-seconds 35 (30 s spent)")
    assert [r["runs_done"] for r in saved] == [1, 2, 3, 3]  # after each run, then the end
    assert saved[0]["stopped_early"] is None and saved[-1] == result
    rows = {r["contender"]: r for r in result["rows"]}
    assert rows["fasttrain"]["samples_per_s_rounds"] == [100.0]
    assert rows["hand-indexed"]["samples_per_s_rounds"] == [100.0, 100.0]

    now[0] = 0.0  # stopped in the first round: a contender not run says why
    first = bench.run_all(s, 2, ("mlp",), None, 64, contenders, measure_one=measure_one,
                          echo=lambda _: None, max_seconds=15, clock=lambda: now[0])
    assert [(r["contender"], r["status"], r["reason"]) for r in first["rows"]] == [
        ("fasttrain", "ok", None), ("hand-indexed", "not run", "--max-seconds 15 reached first")]

    now[0] = 0.0  # without a limit every run runs
    assert bench.run_all(s, 2, ("mlp",), None, 64, contenders, measure_one=measure_one,
                         echo=lambda _: None, clock=lambda: now[0])["runs_done"] == 4
