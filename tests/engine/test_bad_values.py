"""Every numeric flag and config value is range-checked before any work: one line, exit 2, no
traceback, nothing written. And stop requests outside the loop's usual path (a signal during
setup, a run without --out) say truthfully what was saved."""

import os
import signal

import pytest
import torch

from tests.conftest import assert_one_line_error, run_cli

TRAIN = ["train", "--model", "logreg", "--data", "synthetic", "--batch-size", "16",
         "--max-steps", "6", "--log-every", "2", "--device", "cpu", "--no-progress"]


@pytest.mark.parametrize("argv, words", [
    (["--seed", "-1"], ["--seed", "2³²−1"]),
    (["--seed", str(2**32)], ["--seed", str(2**32)]),
    (["--lr", "1e39"], ["--lr", "float32"]),
    (["--weight-decay", "inf"], ["--weight-decay"]),
    (["--grad-clip", "nan"], ["--grad-clip"]),
    (["--max-steps", str(2**40)], ["--max-steps", "out of range"]),
    (["--batch-size", "99999999999"], ["--batch-size"]),
])
def test_out_of_range_flags_are_one_line_and_write_nothing(capsys, tmp_path, argv, words):
    code, _, err = run_cli(capsys, *TRAIN, "--out", str(tmp_path / "run"), *argv)
    assert_one_line_error(code, err, *words)
    assert not (tmp_path / "run").exists()


def test_an_out_of_range_config_value_is_one_line(capsys, tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(f"seed = {2**40}\n")
    code, _, err = run_cli(capsys, *TRAIN, "--config", str(toml))
    assert_one_line_error(code, err, "--seed")


@pytest.mark.parametrize("flag, value", [("--mfu", "nan"), ("--peak-tflops", "inf"),
                                         ("--latency-us", "nan"), ("--step-floor-ms", "inf"),
                                         ("--intra", "inf")])
def test_non_finite_scaling_values_are_one_line(capsys, tmp_path, flag, value):
    out = tmp_path / "s.json"
    code, _, err = run_cli(capsys, "experiment", "scaling", "--predict-only", flag, value,
                           "--json", str(out))
    assert_one_line_error(code, err, flag if flag != "--intra" else "interconnect")
    assert not out.exists()


def test_a_batch_size_search_that_finds_nothing_exits_non_zero(capsys, tmp_path):
    path = tmp_path / "f.json"
    code, out, err = run_cli(capsys, "memory", "--model", "logreg", "--data", "synthetic",
                             "--device", "cpu", "--find-batch-size", "--memory-limit", "1e-6",
                             "--try-steps", "1", "--json", str(path))
    assert code == 2 and "even batch 8 does not fit" in err.strip().splitlines()[-1], err
    assert "Traceback" not in err and path.exists()  # the tries are still recorded


def test_a_signal_during_setup_stops_before_the_first_step(capsys, tmp_path, monkeypatch):
    import fasttrain.models as models

    build = models.build_model

    def build_then_signal(*a, **k):  # SIGTERM arrives while the run is being built
        os.kill(os.getpid(), signal.SIGTERM)
        return build(*a, **k)

    monkeypatch.setattr(models, "build_model", build_then_signal)
    code, _, err = run_cli(capsys, *TRAIN, "--out", str(tmp_path / "run"))
    assert code == 75 and "SIGTERM: stopped before the first step; nothing to save" in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_without_out_a_stop_says_nothing_was_saved(capsys, monkeypatch):
    step = torch.optim.AdamW.step
    calls = []

    def step_then_signal(self, *a, **k):  # SIGUSR1 after the third optimizer step
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGUSR1)
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", step_then_signal)
    code, _, err = run_cli(capsys, *TRAIN)
    assert code == 75, err
    assert "SIGUSR1: stopped at step 3; nothing was saved (no --out was given)" in err, err
    assert "checkpoint saved" not in err
