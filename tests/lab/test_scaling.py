"""The scaling experiment's model of a data-parallel step (fasttrain.lab.scaling), and its command
(`fasttrain experiment scaling`, fasttrain.commands.scaling) in prediction mode and measured."""

from __future__ import annotations

import json

import pytest

from fasttrain.cli import main
from fasttrain.errors import UserError
from fasttrain.lab import scaling
from tests.conftest import assert_one_line_error, run_cli


def test_ring_allreduce_time_is_two_n_minus_one_over_n_of_the_bytes():
    via = scaling.Link("test", bandwidth=100e9, latency=0.0)
    assert scaling.allreduce_s(1e9, 1, via) == 0
    assert scaling.allreduce_s(1e9, 2, via) == pytest.approx(1e9 / 100e9)
    assert scaling.allreduce_s(1e9, 8, via) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)
    slow = scaling.Link("test", bandwidth=100e9, latency=5e-6)
    assert scaling.allreduce_s(0, 8, slow) == pytest.approx(14 * 5e-6)


def test_buckets_follow_ddp_defaults():
    mib = 2**20
    assert scaling.buckets(100) == [100]
    assert scaling.buckets(60 * mib) == [mib, 25 * mib, 25 * mib, 9 * mib]
    assert sum(scaling.buckets(123_456_789)) == 123_456_789


def test_communication_hides_behind_backward_except_the_last_bucket():
    via = scaling.Link("test", bandwidth=50e9, latency=0.0)
    grads = 400 * 2**20
    long = scaling.step_time(1.0, grads, 16, via)  # backward 0.67 s ≫ all-reduce ~16 ms
    last = scaling.allreduce_s(scaling.buckets(grads)[-1], 16, via)
    assert long["exposed_s"] == pytest.approx(last)
    short = scaling.step_time(1e-3, grads, 16, via)  # nothing to hide behind
    assert short["exposed_s"] == pytest.approx(short["allreduce_s"] - 2e-3 / 3, rel=0.05)
    assert scaling.step_time(1e-3, grads, 1, via)["step_s"] == 1e-3


def test_bad_interconnect_is_a_user_error():
    assert scaling.link("nvlink4", 5).bandwidth == 450e9
    assert scaling.link("100", 5).bandwidth == 100e9
    with pytest.raises(UserError, match="nvlink4"):
        scaling.link("carrier-pigeon", 5)


def test_prediction_mode_writes_json_for_the_bundled_models(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["experiment", "scaling", "--predict-only", "--predict-models", "mlp,gpt-124m",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["schema"] == "fasttrain.experiment/1" and result["rows"] == []
    rows = {(r["model"], r["nodes"]): r for r in result["predicted"]}
    assert rows[("mlp", 1)]["params"] == 269_322 and rows[("mlp", 2)]["gpus"] == 16
    big = rows[("gpt-124m", 1)]
    assert 0.9 < big["efficiency"] <= 1 and big["speedup"] == pytest.approx(8 * big["efficiency"])
    assert "predicted" in capsys.readouterr().out


def test_a_failed_measured_run_says_trains_error_not_torchruns_banner(tmp_path):
    """A model of yours measured without the loss its float targets need: the row's reason is
    train's one line, which torchrun's failure report follows (its last line is '=====')."""
    out = tmp_path / "s.json"
    assert main(["experiment", "scaling", "--model", "tests.engine.usermodel:make", "--data",
                 "tests.engine.usermodel:data", "--device", "cpu", "--modes", "ddp", "--procs",
                 "1", "--steps", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert row["status"] == "failed"
    assert row["reason"].startswith("exit 1: error: float targets need a loss"), row["reason"]
    # Its one step fails here as well: measured without a prediction, which says why.
    assert result["predicted"] == [] and "predicted_state_bytes" not in row
    assert "float targets need a loss" in result["options"]["counted"]["error"]


def test_measured_rows_of_one_and_two_processes(tmp_path, capsys):
    """One real sweep: fsdp on 1 and 2 CPU processes (a torchrun each, the test's cost; a mode is
    only the `--parallel` it passes), a few steps each, each row beside the prediction for the
    model measured (not the bundled reference sizes)."""
    out = tmp_path / "s.json"
    assert main(["experiment", "scaling", "--model", "logreg", "--data", "synthetic",
                 "--device", "cpu", "--modes", "fsdp,dp", "--procs", "1,2", "--steps", "5",
                 "--optimizer", "adamw", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    ok = [r for r in rows if r["mode"] != "dp"]
    assert [(r["procs"], r["status"]) for r in ok] == [(1, "ok"), (2, "ok")], rows
    assert [r["param_bytes"] for r in ok] == [7850 * 4, 7850 * 4 // 2]  # a rank's shard
    for r in ok:  # AdamW: weights, grads and two moments (FSDP: halves), 2 step counters
        held = 7850 * 4 * 4 // (2 if r["mode"] == "fsdp" and r["procs"] == 2 else 1)
        assert r["predicted_state_bytes"] == held + 2 * 4, r
        assert r["state_ratio"] == pytest.approx(1, rel=0.01), r
    assert all(r["status"] == "unavailable" for r in rows if r["mode"] == "dp")
    assert {p["model"] for p in result["predicted"]} == {"logreg"}
    assert result["options"]["counted"]["model"] == "logreg"
    assert "measured ÷ predicted" in capsys.readouterr().out


def test_predict_models_in_the_measured_mode_is_one_line(capsys):
    """It would be ignored: the measured mode predicts the model it measures."""
    code, _, err = run_cli(capsys, "experiment", "scaling", "--model", "mlp", "--data",
                           "synthetic", "--device", "cpu", "--procs", "1", "--predict-models",
                           "gpt")
    assert_one_line_error(code, err, "--predict-models gpt is for --predict-only",
                          "drop --predict-models, or add --predict-only")
