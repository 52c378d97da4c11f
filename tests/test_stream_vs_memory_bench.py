"""benchmarks/stream_vs_memory.py on this CPU: its summary arithmetic on rows made by hand, the
rounds' order and early stop with a stand-in for training, one tiny real run through both data
paths into its JSON, and the gpu-check step's flags. No assertion depends on speed."""

import json
import statistics

import pytest

from tests.conftest import import_benchmark
from tests.test_gpu_check import load_script


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("stream_vs_memory")


def row(k: int, path: str, speed: float, loss: float = 2.0) -> dict:
    return {"round": k, "path": path, "samples_per_s": speed, "first_loss": loss}


def test_summary_by_hand(bench):
    rows = [row(0, "in memory", 1000), row(0, "streamed", 900, 2.002),
            row(1, "streamed", 1200), row(1, "in memory", 1500),
            row(2, "in memory", 800), row(2, "streamed", 780)]
    s = bench.summarize(rows, loader_samples_per_s=4000, target=0.9)
    assert s["in_memory_samples_per_s"] == 1000 and s["streamed_samples_per_s"] == 900
    assert s["ratio"] == pytest.approx(0.9) and s["meets_target"] is True
    assert s["paired_ratios"] == pytest.approx([0.9, 0.8, 0.975])  # in round order
    assert s["paired_ratio_median"] == pytest.approx(0.9)
    assert s["first_loss_max_rel_diff"] == pytest.approx(1e-3)
    assert s["loading_headroom"] == pytest.approx(4.0)
    assert s["target"] == 0.9
    assert bench.summarize(rows, None, target=0.91)["meets_target"] is False
    assert bench.summarize(rows, None)["loading_headroom"] is None


def test_rounds_alternate_the_order_and_stop_at_the_time_limit(bench, monkeypatch):
    calls = []

    def fake_train(path, x, y, args):
        calls.append(path)
        return {"path": path, "data_on_device": path == "in memory", "ms_per_step": 1.0,
                "samples_per_s": 100.0 if path == "in memory" else 95.0,
                "logs_samples_per_s": [], "first_loss": 2.0}

    monkeypatch.setattr(bench, "train", fake_train)
    monkeypatch.setattr(bench, "loader_alone", lambda x, y, args: 1000.0)
    args = bench.parse(["--device", "cpu", "--rounds", "3", "--samples", "64", "--steps", "4",
                        "--log-every", "2"])
    result = bench.measure(args)
    assert calls == ["in memory", "streamed", "streamed", "in memory", "in memory", "streamed"]
    assert result["rounds_done"] == 3 and result["stopped_early"] is None
    assert result["summary"]["ratio"] == pytest.approx(0.95)

    calls.clear()
    args.max_seconds = 0  # every round after the first would end too late
    result = bench.measure(args)
    assert calls == ["in memory", "streamed"] and result["rounds_done"] == 1
    assert result["stopped_early"].startswith("after 1 of 3 rounds")


def test_steps_must_hold_two_logs(bench):
    with pytest.raises(SystemExit):
        bench.parse(["--steps", "10", "--log-every", "6"])


def test_a_tiny_cpu_run_trains_both_paths_alike_into_its_json(bench, tmp_path, capsys):
    out = tmp_path / "r.json"
    bench.main(["--device", "cpu", "--rounds", "2", "--steps", "4", "--log-every", "2",
                "--batch-size", "16", "--samples", "256", "--workers", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["schema"] == "fasttrain.stream-vs-memory/1"
    assert {"cpu", "torch", "git_commit"} <= set(result["env"])
    assert result["config"]["batch_size"] == 16 and result["config"]["target"] == 0.9
    assert result["config"]["data"].startswith("synthetic")
    rows = result["rows"]
    assert [(r["round"], r["path"]) for r in rows] == [
        (0, "in memory"), (0, "streamed"), (1, "streamed"), (1, "in memory")]
    for r in rows:
        assert len(r["logs_samples_per_s"]) == 1  # 2 logs, the first dropped
        assert r["samples_per_s"] == statistics.median(r["logs_samples_per_s"]) > 0
        assert r["data_on_device"] == (r["path"] == "in memory")
    # Same seed, samples and order on both paths: the same first loss (the CPU is exact here).
    first = {r["first_loss"] for r in rows}
    assert len(first) == 1, first
    s = result["summary"]
    speed = {p: statistics.median(r["samples_per_s"] for r in rows if r["path"] == p)
             for p in ("in memory", "streamed")}
    assert s["ratio"] == pytest.approx(speed["streamed"] / speed["in memory"])
    assert s["meets_target"] == (s["ratio"] >= 0.9)
    by = {(r["round"], r["path"]): r["samples_per_s"] for r in rows}
    assert s["paired_ratios"] == pytest.approx(
        [by[k, "streamed"] / by[k, "in memory"] for k in (0, 1)])
    assert s["loader_alone_samples_per_s"] > 0
    assert s["loading_headroom"] == pytest.approx(s["loader_alone_samples_per_s"]
                                                  / speed["in memory"])
    assert "ratio" in capsys.readouterr().out


def test_the_gpu_check_step_runs_it_on_cuda_into_its_result_file_near_the_end(bench, tmp_path):
    names = [s.name for s in load_script().plan(tmp_path, "2026-01-01-some-gpu")]
    # near the end: only the peers and the torch.compile steps (minutes of compiling) after it
    at = names.index("stream-vs-memory")
    assert names[at + 1:] == ["peers-in-memory", "compiled-tests", "compiled-sweep"]
    step = load_script().plan(tmp_path, "2026-01-01-some-gpu")[at]
    assert step.limit_s <= 60
    gpu_check = load_script()
    args = bench.parse(gpu_check.step_argv(step, step.limit_s)[2:])  # SystemExit: a flag gone
    assert args.device == "cuda" and args.json == str(tmp_path / step.outputs[0])
    assert args.max_seconds == step.limit_s - gpu_check.FLAG_MARGIN_S == 40
    assert bench.parse(gpu_check.step_argv(step, 30)[2:]).max_seconds == 10  # a spent budget
    assert step.outputs == ["results/2026-01-01-some-gpu-stream-vs-memory.json"]


def test_the_gpu_check_summary_reads_its_figures(bench, tmp_path, monkeypatch):
    rows = [row(0, "in memory", 1000), row(0, "streamed", 950)]
    result = {"config": {"batch_size": 512, "precision": "fp32", "workers": 4},
              "rounds_done": 1, "stopped_early": "after 1 of 5 rounds: ...",
              "summary": bench.summarize(rows, 5000)}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    gpu_check = load_script()
    step = [s for s in gpu_check.plan(tmp_path, "t") if s.name == "stream-vs-memory"][0]
    monkeypatch.setattr(step, "outputs", [path.name])
    lines = gpu_check.figures(step, tmp_path)
    assert lines[0].startswith("streamed ÷ in memory 0.950 (target ≥ 0.9: met)"), lines
    assert "5.0× the in-memory speed" in lines[2] and lines[3].startswith("stopped early")
