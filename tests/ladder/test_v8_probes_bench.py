"""benchmarks/v8_probes.py without a GPU: its exits on bad input, and that a probe which cannot run
is one line in its place while the other's figures are printed and written (the probes
themselves are tested in test_v8_workers.py and test_v8_chain.py)."""

import json
from pathlib import Path

import pytest
import torch

from fasttrain.ladder import build, v8_chain, v8_workers
from tests.conftest import import_benchmark

WORKERS = {"config": {"n": 60000, "batch": 128, "steps": 469, "lag": 6, "repeats": 3,
                      "rtol": 1.9e-6},
           "mma-scatter": {"us_per_step": {"median": 0.9, "min": 0.85, "max": 0.95},
                           "per_repeat": [0.85, 0.9, 0.95],
                           "phases_us": {"load": 0.1, "update": 0.3, "partials": 0.2,
                                         "reduce": 0.3},
                           "sms": 56, "check": {"p_err": 0.02, "w_err": 0.03, "ok": True}}}


@pytest.fixture
def bench(monkeypatch):
    v8 = import_benchmark("v8_probes")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(v8, "env_block", lambda: {"gpu": "a faked GPU"})
    monkeypatch.setattr(v8, "hardware_line", lambda env: env["gpu"])
    return v8


def test_a_probe_that_cannot_build_is_one_line_and_the_other_still_runs(bench, monkeypatch,
                                                                         tmp_path, capsys):
    monkeypatch.setattr(v8_workers, "measure", lambda **kw: WORKERS)

    def unavailable(**kw):
        raise build.Unavailable("nvcc not found on PATH")

    monkeypatch.setattr(v8_chain, "measure", unavailable)
    out = tmp_path / "v8.json"
    assert bench.main(["--data", "random", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mma-scatter: 0.90 µs a step (0.85-0.95)" in printed
    assert "v8 chain: ValueError: the chain's logits are real MNIST's" in printed
    result = json.loads(out.read_text())
    assert result["workers"]["mma-scatter"]["us_per_step"]["median"] == 0.9
    assert result["chain"] == {"error": "ValueError: the chain's logits are real MNIST's: run it "
                                        "with --data mnist"}
    assert result["grams"]["error"].startswith("ValueError: the Grams are checked against MNIST's")
    monkeypatch.setattr(bench, "chain", lambda repeats, data: unavailable())
    assert bench.main(["--data", "random"]) == 0
    assert "v8 chain: Unavailable: nvcc not found on PATH" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needs_gpu", [(["--repeats", "0"], False), ([], True)])
def test_bad_input_or_no_gpu_exits_2_with_one_line(bench, monkeypatch, capsys, argv, needs_gpu):
    if needs_gpu:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("v8_probes: ")


def test_gpu_checks_summary_reads_the_json_the_benchmark_writes(bench, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_check_figures

    monkeypatch.setattr(v8_workers, "measure", lambda **kw: WORKERS)
    out = tmp_path / "v8.json"
    assert bench.main(["--data", "random", "--json", str(out)]) == 0
    lines = gpu_check_figures.FIGURES["v8-probes"](out)
    assert any("mma-scatter: 0.90 µs a step" in line for line in lines), lines
    assert lines[-2:] == [
        "v8 chain: ValueError: the chain's logits are real MNIST's: run it with --data mnist",
        "v8 grams: ValueError: the Grams are checked against MNIST's: run them with --data mnist"]


def test_the_chain_and_the_grams_share_one_set_of_mnist_inputs(bench, monkeypatch, capsys):
    from fasttrain.ladder import v8_grams

    made = []
    monkeypatch.setattr(bench, "_INPUTS", {})
    monkeypatch.setattr(bench, "workers", lambda repeats, data: WORKERS)
    monkeypatch.setattr(v8_chain, "mnist_epoch", lambda: made.append(1) or {"n": 60000})
    monkeypatch.setattr(v8_chain, "load_library", lambda: "lib")
    seen = []
    monkeypatch.setattr(v8_chain, "measure",
                        lambda repeats, inp: seen.append(inp) or {"error": "chain ran"})
    grams = {"steps": 469, "repeats": 5, "equal_numpy": True,
             "us_per_epoch": {"median": 312.5, "min": 310.0, "max": 320.0, "runs": []}}
    monkeypatch.setattr(v8_grams, "time_grams",
                        lambda lib, inp, repeats: seen.append(inp) or grams)
    assert bench.main(["--data", "mnist", "--repeats", "2"]) == 0
    assert made == [1] and seen[0] is seen[1], "one MNIST epoch's inputs for both probes"
    out = capsys.readouterr().out
    assert "v8 Grams on the GPU (L = 6, bias pixel; 469 steps): 312.5 µs an epoch" in out
