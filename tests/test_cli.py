"""`fasttrain bench` and `fasttrain env` through the CLI root, and every kind of bad input."""

import json

import pytest

from fasttrain.cli import main
from tests.conftest import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def bench_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--data", "synthetic", "--epochs", "2", "--repeats", "2", "--impl",
            "numpy-cpu,numba-tiled,floor-gemm,roofline", "--json", str(out / "r.json"),
            "--plot", str(out / "r.png"), "--no-progress"]
    assert main(argv) == 0
    return json.loads((out / "r.json").read_text()), out


def test_bench_writes_self_describing_json(bench_result):
    result, _ = bench_result
    assert result["schema"] == "fasttrain.bench/2"
    assert {"cpu", "cores", "python", "torch", "numpy", "git_commit", "cpu_flags", "cpu_threads",
            "peaks"} <= result["env"].keys()
    assert result["config"]["data"] == "synthetic" and result["config"]["synthetic"] is True
    assert result["config"]["repeats"] == 2
    rows = {r["impl"]: r for r in result["rows"]}
    assert list(rows) == ["numpy-cpu", "numba-tiled", "floor-gemm", "roofline"]
    for name in ("numpy-cpu", "numba-tiled", "floor-gemm"):
        r = rows[name]
        assert r["status"] == "ok" and len(r["repeats"]) == 2
        assert len(r["source"]["sha256"]) == 64
        for rep in r["repeats"]:
            assert 0 < rep["epoch_ms_min"] <= rep["epoch_ms_median"] <= rep["epoch_ms_max"]
            assert rep["total_ms"] == pytest.approx(sum(rep["epoch_ms_all"]))
            assert rep["setup_ms"] > 0
        assert r["epoch_ms_repeat_min"] <= r["epoch_ms"] <= r["epoch_ms_repeat_max"]
    assert rows["numpy-cpu"]["check"]["ok"] and rows["floor-gemm"]["check"] is None
    assert rows["roofline"]["roofline"]["flops"] == 4 * 60000 * 784 * 10
    assert rows["roofline"]["repeats"] == []
    assert rows["numpy-cpu"]["test_accuracy"] > 0.7
    assert rows["numba-tiled"]["test_accuracy"] == pytest.approx(
        rows["numpy-cpu"]["test_accuracy"], abs=0.002)
    assert rows["floor-gemm"]["test_accuracy"] is None


def test_bench_plot_is_a_png(bench_result):
    _, out = bench_result
    assert (out / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_table_labels_synthetic_data(capsys):
    code, out, _ = run_cli(capsys, "bench", "--data", "synthetic", "--quick",
                       "--impl", "floor-gemm", "--no-progress")
    assert code == 0 and "SYNTHETIC" in out and "floor-gemm" in out and "2 epochs" in out


def test_unavailable_row_is_listed_with_its_reason(monkeypatch, capsys):
    from fasttrain.ladder import numba_fused

    monkeypatch.setattr(numba_fused.NumbaFused, "unavailable",
                        classmethod(lambda cls, env, cfg: "numba is not installed"))
    code, out, _ = run_cli(capsys, "bench", "--data", "synthetic", "--epochs", "1",
                       "--impl", "numba-fused", "--no-progress")
    assert code == 0 and "unavailable" in out and "numba is not installed" in out


@pytest.mark.parametrize("argv, words", [
    (["--impl", "numpy-gpu"], ["numpy-gpu", "known:"]),
    (["--epochs", "0"], ["--epochs"]),
    (["--epochs", "-3"], ["--epochs"]),
    (["--batch-size", "0"], ["--batch-size"]),
    (["--lr", "nan"], ["--lr"]),
    (["--lr", "inf"], ["--lr"]),
    (["--epochs", "two"], ["--epochs"]),
    (["--repeats", "0"], ["--repeats"]),
    (["--data", "cifar"], ["--data"]),
    (["--json", "/nonexistent-dir/r.json"], ["--json", "does not exist"]),
])
def test_bad_flags_are_one_line_errors(capsys, argv, words):
    code, _, err = run_cli(capsys, "bench", "--data", "synthetic", *argv)
    assert_one_line_error(code, err, *words)


def test_json_path_that_is_a_directory(capsys, tmp_path):
    code, _, err = run_cli(capsys, "bench", "--data", "synthetic", "--json", str(tmp_path))
    assert_one_line_error(code, err, "is a directory")


def test_bad_input_loses_nothing_on_disk(capsys, tmp_path):
    existing = tmp_path / "r.json"
    existing.write_text("precious")
    code, _, err = run_cli(capsys, "bench", "--data", "synthetic", "--epochs", "0",
                       "--json", str(existing))
    assert_one_line_error(code, err)
    assert existing.read_text() == "precious"


def test_corrupt_data_file_is_a_one_line_error(capsys, tmp_path):
    d = tmp_path / "mnist"
    d.mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (d / name).write_bytes(b"\x00\x00\x08\x03 not really an idx file")
    code, _, err = run_cli(capsys, "bench", "--data-dir", str(tmp_path), "--epochs", "1")
    assert_one_line_error(code, err)
    assert "mnist" in err


def test_cuda_without_gpu_is_a_user_error(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code, _, err = run_cli(capsys, "bench", "--data", "synthetic", "--device", "cuda")
    assert_one_line_error(code, err, "cuda")


def test_env_prints_the_env_block(capsys):
    code, out, _ = run_cli(capsys, "env", "--json")
    block = json.loads(out)
    assert code == 0 and block["cores"] >= 1 and block["torch"]


def test_module_entry_point_runs():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "fasttrain", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "bench" in r.stdout


def test_a_closed_pipe_ends_quietly():
    """`fasttrain env --json | head` printed a BrokenPipeError traceback once head had read."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        r = subprocess.run([sys.executable, "-m", "fasttrain", "env", "--json"], stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert r.returncode == 1


@pytest.mark.parametrize("argv, words", [
    (["--model", "gpt"], ["tinyshakespeare"]),
    (["--batch-size", "10", "--accum-steps", "3"], ["--accum-steps"]),
    (["--precision", "tf32"], ["tf32"]),
    (["--config", "/nonexistent.toml"], ["no such file"]),
    (["--resume", "auto"], ["--out"]),
    (["--lr", "-1"], ["--lr"]),
])
def test_train_bad_settings_are_one_line_errors(capsys, argv, words):
    code, _, err = run_cli(capsys, "train", "--data", "synthetic", "--device", "cpu", *argv)
    assert_one_line_error(code, err, *words)


def test_train_runs_end_to_end(capsys, tmp_path):
    code, out, err = run_cli(capsys, "train", "--model", "logreg", "--data", "synthetic",
                         "--batch-size", "256", "--max-steps", "30", "--log-every", "10",
                         "--no-progress", "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert "test_accuracy" in out
    assert (tmp_path / "run" / "weights.safetensors").exists()
    assert (tmp_path / "run" / "checkpoints").is_dir()


def test_train_refuses_an_unwritable_out(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, _, err = run_cli(capsys, "train", "--model", "logreg", "--data", "synthetic",
                       "--out", str(blocker / "run"))
    assert_one_line_error(code, err, "--out")
    assert blocker.read_text() == "not a folder"


def test_bench_help_states_every_default(capsys):
    """`fasttrain bench --help` left out the defaults of --batch-size, --lr, --seed, --data and
    --device: a user reading it could not tell what a bare `fasttrain bench` runs."""
    import argparse

    from fasttrain.bench import bench_parser

    sub = argparse.ArgumentParser().add_subparsers()
    bench_parser(sub)
    p = sub.choices["bench"]
    for action in p._actions:
        # by identity: --seed's default 0 == False, and `in` would skip it
        if all(action.default is not v for v in (None, False, argparse.SUPPRESS)) and action.help:
            assert "default" in action.help, (action.dest, action.help)


def test_resume_says_when_the_precision_is_not_the_runs(capsys, tmp_path):
    """`--out R --resume auto --epochs N` takes the run's settings but not its speed switches: a
    bf16 run went on in fp32 and the `resumed from` line listed only the epochs."""
    out = str(tmp_path / "run")
    common = ("--model", "logreg", "--data", "synthetic", "--batch-size", "256", "--no-progress",
              "--out", out)
    code, _, err = run_cli(capsys, "train", *common, "--max-steps", "4", "--precision", "bf16")
    assert code == 0, err
    code, out_text, err = run_cli(capsys, "train", "--out", out, "--resume", "auto",
                                  "--max-steps", "6", "--no-progress")
    assert code == 0, err
    line = next(x for x in out_text.splitlines() if x.startswith("resumed from"))
    assert "precision 'bf16' → 'fp32'" in line and "--precision bf16 keeps it" in line
    code, out_text, err = run_cli(capsys, "train", "--out", out, "--resume", "auto",
                                  "--max-steps", "8", "--precision", "fp32", "--no-progress")
    assert code == 0 and "precision" not in next(  # config.toml holds the last leg's fp32
        x for x in out_text.splitlines() if x.startswith("resumed from"))
