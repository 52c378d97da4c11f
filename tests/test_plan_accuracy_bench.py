"""benchmarks/plan_accuracy.py on this CPU: its scheme arithmetic on exact points, one tiny
round of its point-building, timing, counting and fitting by the wall clock (the clock of
--device cuda), its flags, and --device cuda without CUDA (one line, exit 2, nothing measured).
No assertion depends on speed."""

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from fasttrain.lab import steptime
from fasttrain.peaks import cpu_threads
from tests.conftest import BENCHMARKS, import_benchmark
from tests.test_gpu_check import load_script


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("plan_accuracy")


def exact_rows(constants: dict) -> list[dict]:
    """Rows whose steps follow the model exactly: model → (eff, launch_s), 3 batch sizes each."""
    rows = []
    for model, (eff, launch) in constants.items():
        for b in (8, 16, 32):
            roof, ops = b * 1e-4, 40
            t = roof / eff + ops * launch
            rows.append({"model": model, "batch_size": b, "roofline_s": roof, "ops": ops,
                         "totals_roofline_s": roof / 2, "measured_s": t,
                         "point": steptime.Point(b, roof, ops, t)})
    return rows


def test_each_point_is_predicted_from_fits_that_did_not_see_it(bench):
    rows = exact_rows({"a": (0.5, 1e-4), "b": (0.1, 2e-5)})
    bench.predict(rows)
    for r in rows:
        p = r["predictions"]
        assert set(p) == set(bench.SCHEMES)
        me = f"{r['model']}@{r['batch_size']}"
        assert all(me not in s["fitted_on"] for s in p.values())
        assert len(p["other batch sizes"]["fitted_on"]) == 2
        assert all(f.startswith(r["model"]) for f in p["other batch sizes"]["fitted_on"])
        assert not any(f.startswith(r["model"]) for f in p["other models"]["fitted_on"])
        # The model's own two other points give back its own constants, hence the step.
        assert p["other batch sizes"]["error"] == pytest.approx(0, abs=1e-9)
        assert p["other models"]["error"] == pytest.approx(
            p["other models"]["predicted_s"] / r["measured_s"] - 1)
    # The other model's constants are not this one's: carried over, they miss.
    assert all(abs(r["predictions"]["other models"]["error"]) > 0.3 for r in rows)
    points = {"a": ("synthetic", (8, 16, 32)), "b": ("synthetic", (8, 16, 32))}
    within = bench.within_target(rows, points)
    assert within["other batch sizes"] == {"all": 6, "of": 6, "target_batches": 4,
                                           "of_target": 4, "worst": pytest.approx(0, abs=1e-9)}
    assert within["other models"]["all"] == 0
    assert abs(within["other models"]["worst"]) == max(
        abs(r["predictions"]["other models"]["error"]) for r in rows)


def test_a_cpu_is_timed_by_the_wall_clock_at_measured_peaks_when_asked(bench):
    peaks, clock = bench.measuring("cpu", "wall")
    assert clock is time.perf_counter and peaks.source == "measured"


def test_a_tiny_run_by_the_wall_clock_builds_times_counts_predicts_and_writes(
        bench, monkeypatch, tmp_path):
    points = {"logreg": ("synthetic", (4, 8, 16)), "mlp": ("synthetic", (4, 8, 16))}
    monkeypatch.setitem(bench.POINTS, "cpu", points)
    env = {"cpu": "test CPU", "cores": 2, "python": "3", "torch": torch.__version__, "numpy": "2"}
    monkeypatch.setattr(bench, "env_block", lambda: dict(env))  # numba's start: seconds
    gates = []
    monkeypatch.setattr(bench, "wait_quiet", lambda most, patience: gates.append(most) or {
        "quiet": True, "waited_s": 0.0, "runnable_last": []})
    threads, path = torch.get_num_threads(), tmp_path / "result.json"
    # torch's thread count as a user's process starts with it (one per core; tests/conftest.py
    # gives pytest one): the wall clock's peaks are measured with it, before --threads applies.
    torch.set_num_threads(cpu_threads())
    try:
        assert bench.main(["--clock", "wall", "--rounds", "2", "--steps", "1", "--quiet", "7",
                           "--malloc", "default", "--json", str(path)]) == 0
    finally:
        torch.set_num_threads(threads)
    result = json.loads(path.read_text())
    config = result["config"]
    assert (config["device"], config["clock"], config["threads"]) == ("cpu", "wall", 1)
    assert config["timing"].startswith("wall clock") and not config["freed_memory_held"]
    assert gates == [7, 7] and len(result["load"]["rounds"]) == 2
    assert result["peaks"]["source"] == "measured" and result["peaks"]["flops"] > 0
    rows = result["rows"]
    assert [(r["model"], r["batch_size"]) for r in rows] == [
        (m, b) for m, (_, bs) in points.items() for b in bs]
    for r in rows:
        assert r["flops"] > 0 and r["bytes"] > 0 and r["ops"] > 0 and r["roofline_s"] > 0
        assert len(r["step_times_s"]) == 2 and min(r["step_times_s"]) > 0
        assert r["measured_s"] == pytest.approx(sum(r["step_times_s"]) / 2)  # median of two
        for s in bench.SCHEMES:
            p = r["predictions"][s]
            assert p["predicted_s"] > 0 and 0 < p["efficiency"] <= 1 and p["launch_s"] >= 0
            assert p["error"] == pytest.approx(p["predicted_s"] / r["measured_s"] - 1)
    # The bigger batch asks for more of the same model's work; the calls stay the same.
    by = {(r["model"], r["batch_size"]): r for r in rows}
    assert by["mlp", 16]["flops"] > by["mlp", 4]["flops"]
    assert by["mlp", 16]["ops"] == by["mlp", 4]["ops"]
    within = result["within_target"]
    assert all(w["of"] == 6 and w["of_target"] == 4 for w in within.values())
    # scripts/gpu-check's summary reads the same file.
    figures = load_script().readers._plan_accuracy_figures(path)
    assert figures[0].startswith(f"other batch sizes: {within['other batch sizes']['all']}/6 ")
    assert len(figures) == len(bench.SCHEMES) + 1 + len(rows)


def test_a_run_built_elsewhere_than_asked_is_an_error(bench, monkeypatch):
    monkeypatch.setattr(bench, "build", lambda *a, **k: SimpleNamespace(
        device=torch.device("cpu")))
    with pytest.raises(RuntimeError, match="built on cpu, not cuda"):
        bench.build_runs({"logreg": ("synthetic", (8,))}, "cuda")


def test_flags_resolve_per_device(bench):
    cpu = bench.parse([])
    assert cpu.device == "cpu" and {k: getattr(cpu, k) for k in bench.CPU_ONLY} == bench.CPU_ONLY
    gpu = bench.parse(["--device", "cuda", "--clock", "wall"])
    assert gpu.clock == "wall" and gpu.threads is gpu.malloc is gpu.quiet is None
    assert bench.POINTS["cuda"].keys() == bench.POINTS["cpu"].keys()


@pytest.mark.parametrize("argv", [["--device", "cuda", "--threads", "1"],
                                  ["--device", "cuda", "--clock", "cpu"],
                                  ["--device", "cuda", "--quiet", "3"],
                                  ["--clock", "cpu", "--threads", "2"], ["--steps", "0"]])
def test_bad_flags_exit_2(bench, argv, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_result_files_are_named_by_date_and_device(bench):
    gpu = bench.default_path({"gpu": "NVIDIA H100 80GB HBM3"}, "cuda")
    cpu = bench.default_path({"cpu": "AMD EPYC 7B13", "cores": 2}, "cpu")
    day = time.strftime("%Y-%m-%d")
    assert gpu.name == f"{day}-nvidia-h100-80gb-hbm3-plan-accuracy.json"
    assert cpu.name == f"{day}-cpu-amd-epyc-7b13-2core-plan-accuracy.json"
    assert gpu.parent == cpu.parent == BENCHMARKS / "results"


def test_cuda_without_cuda_is_one_line_and_exit_2_before_anything_is_measured(
        bench, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "env_block", lambda: pytest.fail("measured without CUDA"))
    monkeypatch.setattr(bench, "build_runs", lambda *a: pytest.fail("built without CUDA"))
    assert bench.main(["--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "--device cuda: CUDA is not available" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: the script would measure")
def test_the_script_itself_exits_2_without_cuda(tmp_path):
    out = tmp_path / "never.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "plan_accuracy.py"), "--device",
                           "cuda", "--json", str(out)], capture_output=True, text=True,
                          timeout=120, cwd=BENCHMARKS.parent,
                          env={**os.environ, "PYTHONPATH": str(BENCHMARKS.parent / "src")})
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "CUDA is not available" in done.stderr and not out.exists()


def _result_file(path, rows: list[dict]) -> None:
    """A small plan-accuracy result as the script writes it (the fields --from-json reads)."""
    models = sorted({r["model"] for r in rows})
    config = {"points": {m: {"data": "synthetic", "batch_sizes": [8, 16, 32]} for m in models}}
    path.write_text(json.dumps({"schema": "fasttrain.plan-accuracy/2", "env": {}, "config": config,
                                "peaks": None, "rows": rows}))


def overlapped_rows(constants: dict, slower: tuple = ()) -> list[dict]:
    """Rows whose steps follow max(R/eff, n·issue) exactly, the (model, batch) in `slower`
    measured 1.5× slower: model → (eff, issue_s)."""
    rows = []
    for model, (eff, issue) in constants.items():
        for b in (8, 16, 32):
            roof, ops = b * 1e-4, 40
            t = max(roof / eff, ops * issue) * (1.5 if (model, b) in slower else 1)
            rows.append({"model": model, "batch_size": b, "roofline_s": roof, "ops": ops,
                         "totals_roofline_s": roof, "measured_s": t})
    return rows


def test_from_json_refits_and_rescores_without_measuring(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "build_runs", lambda *a: pytest.fail("measured"))
    src, out = tmp_path / "in.json", tmp_path / "out.json"
    same = {"a": (0.4, 8e-5), "b": (0.4, 8e-5)}  # one machine: one efficiency, one issue cost
    _result_file(src, overlapped_rows(same))
    assert bench.main(["--from-json", str(src), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["refit_of"] == str(src) and "not a new measurement" in result["note"]
    for scheme in ("overlapped, other points", "overlapped, other models"):
        w = result["within_target"][scheme]
        assert (w["all"], w["of"]) == (6, 6) and w["worst"] == pytest.approx(0, abs=1e-9)
    # The sum per model reads the host-bound point's flat step as roofline it does not have.
    assert result["within_target"]["other batch sizes"]["all"] < 6
    assert "overlapped, other points: 6/6 within ±30%" in capsys.readouterr().out
    # What `plan --calibrate` does on a GPU, per model from its two other batch sizes: exact
    # where they straddle the regimes (16 from 8 and 32; 32 from 8 and 16); batch 8 (host-bound,
    # 3.2 ms) from 16 and 32, both device-bound, finds no cost per call: the default 5 µs, within
    # the 100 µs they allow, predicts the device's 2 ms: −37.5%, and says it was unidentified.
    for r in result["rows"]:
        c = r["predictions"]["calibrated, other batch sizes"]
        if r["batch_size"] == 8:
            assert c["unidentified"] == ["launch_s"] and c["error"] == pytest.approx(-0.375)
        else:
            assert c["unidentified"] == [] and c["error"] == pytest.approx(0, abs=1e-9)

    # One point 1.5× slower than the machine's model: predicted from the five others (exact,
    # so their fit is the planted one) it is off by 1/1.5 − 1 = −33%, and counted a miss.
    _result_file(src, overlapped_rows(same, slower={("b", 16)}))
    assert bench.main(["--from-json", str(src), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    slow = next(r for r in result["rows"] if (r["model"], r["batch_size"]) == ("b", 16))
    assert slow["predictions"]["overlapped, other points"]["error"] == pytest.approx(-1 / 3)
    assert "b@16" not in slow["predictions"]["overlapped, other points"]["fitted_on"]
    w = result["within_target"]["overlapped, other points"]
    errors = [r["predictions"]["overlapped, other points"]["error"] for r in result["rows"]]
    assert w["all"] == sum(abs(e) <= 0.3 for e in errors) <= 5
    assert abs(w["worst"]) == max(abs(e) for e in errors) >= 1 / 3 - 1e-9


def test_from_json_reproduces_a_committed_results_own_scores(bench, tmp_path):
    path = BENCHMARKS / "results" / "2026-11-27-nvidia-h100-80gb-hbm3-plan-accuracy.json"
    committed = json.loads(path.read_text())
    result = bench.refit(str(path))
    for old, new in zip(committed["rows"], result["rows"], strict=True):
        for scheme in ("other batch sizes", "other models", "one efficiency"):
            assert new["predictions"][scheme]["error"] == pytest.approx(
                old["predictions"][scheme]["error"], rel=1e-9)
    for scheme, w in committed["within_target"].items():
        assert result["within_target"][scheme]["all"] == w["all"]


def test_from_json_of_a_file_it_did_not_write_is_one_line_and_exit_2(bench, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    assert bench.main(["--from-json", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--from-json" in err and "plan-accuracy" in err
