"""Early stopping is part of a run's state: checkpointed (its best value, the evaluations waited),
so that a run interrupted mid-way stops where an uninterrupted one does, and a run that stopped
early, resumed as it is (a requeued job, a script that always passes --resume auto), has nothing
to train — unless --patience is raised, or --early-stop names another metric."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import fasttrain
from fasttrain.errors import UserError
from tests.conftest import run_cli

PER_EPOCH = 6  # 120 training samples (160 less a quarter held out), batch 20


def make() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 3))


def data():
    """Noisy labels: the validation loss falls for a few epochs, then rises as the net overfits."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 8, generator=g)
    y = (x[:, 0] > 0).long() + (torch.rand(160, generator=g) < 0.3).long()
    return x, y


def train(**kw):
    run = fasttrain.build(model=make(), data=data(), **{
        **dict(val_fraction=0.25, epochs=40, batch_size=20, lr=0.05, early_stop="val_loss",
               patience=2, log_every=100, device="cpu", progress=False, verbose=False), **kw})
    fasttrain.fit(run)
    return run


def evals(run) -> list[int]:
    return [r["step"] for r in run.history if r["kind"] == "eval"]


@pytest.fixture(scope="module")
def whole():
    run = train()
    assert run.stop and run.step < 40 * PER_EPOCH, run.history  # it stops early
    return run


def test_an_interrupted_run_stops_where_an_uninterrupted_one_does(tmp_path, whole):
    # Interrupted at the evaluation before the stop: one evaluation without improvement so far.
    at = whole.step - PER_EPOCH
    train(out=str(tmp_path), max_steps=at)
    resumed = train(out=str(tmp_path), resume="auto")
    assert resumed.stop == whole.stop
    assert evals(resumed) == [whole.step]  # it lost count: went on to a later evaluation
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, whole.model.state_dict()[k]), k


def test_a_run_that_stopped_early_resumed_as_it_is_has_nothing_to_train(tmp_path, whole,
                                                                          capsys):
    train(out=str(tmp_path))
    metrics = (tmp_path / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    again = train(out=str(tmp_path), resume="auto", epochs=80)  # more epochs do not lift it
    assert again.step == whole.step and again.history == []
    err = capsys.readouterr().err
    assert (f"nothing to train: the run finished at step {whole.step}" in err
            and "val_loss has not improved for 2 evaluations" in err
            and "larger --patience" in err), err
    assert (tmp_path / "metrics.jsonl").read_bytes() == metrics


def test_a_larger_patience_lets_it_go_on_and_another_metric_counts_afresh(tmp_path, whole,
                                                                          capsys):
    train(out=str(tmp_path))
    capsys.readouterr()
    more = train(out=str(tmp_path), resume="auto", patience=4)
    out = capsys.readouterr().out
    assert "patience 2 → 4 (val_loss has not improved for 2 of 4 evaluations: goes on)" in out
    assert more.step > whole.step and more.stop != whole.stop
    train(out=str(tmp_path), resume="auto", patience=4, early_stop="val_accuracy")
    assert "early_stop 'val_loss' → 'val_accuracy' (val_accuracy counted afresh)" in (
        capsys.readouterr().out)


def test_cli_resume_keeps_the_runs_early_stop(tmp_path, whole, capsys):
    args = ["train", "--model", f"{__name__}:make", "--data", f"{__name__}:data",
            "--val-fraction", "0.25", "--epochs", "40", "--batch-size", "20", "--lr", "0.05",
            "--log-every", "100", "--device", "cpu", "--no-progress", "--out", str(tmp_path)]
    code, out, err = run_cli(capsys, *args, "--early-stop", "val_loss", "--patience", "2")
    assert code == 0 and f"done at step {whole.step}" in out, err
    # A requeued job's bare --resume auto: the early stop comes from the run's config.toml.
    code, out, err = run_cli(capsys, "train", "--out", str(tmp_path), "--resume", "auto",
                             "--device", "cpu", "--no-progress")
    assert code == 0 and "nothing to train" in err, out + err
    assert err.count("has not improved") == 1, err  # said once


def test_old_checkpoints_load_and_a_damaged_early_stop_is_refused(tmp_path, whole):
    train(out=str(tmp_path), max_steps=whole.step - PER_EPOCH)
    path = sorted((tmp_path / "checkpoints").glob("step-*.pt"))[-1]
    saved = torch.load(path, weights_only=True)
    assert saved["early_stop"]["metric"] == "val_loss" and saved["early_stop"]["waited"] == 1
    for bad, words in ((-1, "early_stop.waited = -1"), ("1", "early_stop.waited is str")):
        torch.save({**saved, "early_stop": {**saved["early_stop"], "waited": bad}}, path)
        with pytest.raises(UserError, match=words.replace(".", r"\.")):
            train(out=str(tmp_path), resume=str(path))
    # Written before early stopping was checkpointed: it loads, and counts afresh.
    torch.save({k: v for k, v in saved.items() if k != "early_stop"}, path)
    resumed = train(out=str(tmp_path), resume="auto")
    assert resumed.step > whole.step
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert records[-1]["step"] == resumed.step


# -- an EarlyStop passed to fit (not --early-stop's): checkpointed and restored the same way -----


def train_yours(standard: bool, **kw):
    """The same run as `train`, its early stop an EarlyStop callback passed to fit; without the
    standard callbacks, the ones it needs passed too."""
    from fasttrain.engine.callbacks import Checkpointer, EarlyStop, Evaluator

    run = fasttrain.build(model=make(), data=data(), **{
        **dict(val_fraction=0.25, epochs=40, batch_size=20, lr=0.05, log_every=100,
               device="cpu", progress=False, verbose=False), **kw})
    early = EarlyStop("val_loss", patience=2)
    fasttrain.fit(run, callbacks=[early] if standard else [Evaluator(), early, Checkpointer()],
                  standard=standard)
    return run, early


@pytest.mark.parametrize("standard", [False, True])
def test_your_early_stop_callback_resumes_where_it_stood(tmp_path, whole, capsys, standard):
    alone, _ = train_yours(standard)
    assert alone.stop == whole.stop and alone.step == whole.step  # the same stop as --early-stop
    at = whole.step - PER_EPOCH  # interrupted after one evaluation without improvement
    train_yours(standard, out=str(tmp_path), max_steps=at)
    saved = torch.load(sorted((tmp_path / "checkpoints").glob("step-*.pt"))[-1],
                       weights_only=True)
    (mine,) = saved["callback_early_stops"]
    assert {**mine, "best": None} == {"metric": "val_loss", "best": None, "waited": 1,
                                      "mode": "min"} and math.isfinite(mine["best"])
    assert "early_stop" not in saved  # no --early-stop: the run's own slot stays empty
    capsys.readouterr()
    resumed, early = train_yours(standard, out=str(tmp_path), resume="auto")
    assert "resumed your EarlyStop('val_loss'): val_loss has not improved for 1 of 2" in (
        capsys.readouterr().out)
    assert resumed.stop == whole.stop and early.waited == 2
    assert evals(resumed) == [whole.step]  # not counted afresh: no later evaluation
    for k, v in resumed.model.state_dict().items():
        assert torch.equal(v, whole.model.state_dict()[k]), k
    # Stopped early and resumed as it is: stays stopped, as --early-stop's does.
    again, _ = train_yours(standard, out=str(tmp_path), resume="auto", epochs=80)
    assert again.step == whole.step and again.history == []
    assert "patience to your EarlyStop to go on" in capsys.readouterr().err


def test_your_early_stop_without_a_saved_count_is_a_warning(tmp_path, whole, capsys):
    from fasttrain.engine.callbacks import Checkpointer, Evaluator

    # Checkpointed by a fit without the EarlyStop: nothing to restore it from.
    run = fasttrain.build(model=make(), data=data(), val_fraction=0.25, epochs=40,
                          batch_size=20, lr=0.05, log_every=100, device="cpu", progress=False,
                          verbose=False, out=str(tmp_path), max_steps=PER_EPOCH)
    fasttrain.fit(run, callbacks=[Evaluator(), Checkpointer()], standard=False)
    capsys.readouterr()
    train_yours(False, out=str(tmp_path), resume="auto")
    err = capsys.readouterr().err
    assert err.count("holds no count for your EarlyStop('val_loss')") == 1, err
    assert "counted afresh" in err


def test_a_damaged_count_of_your_early_stop_is_refused(tmp_path, whole):
    train_yours(False, out=str(tmp_path), max_steps=whole.step - PER_EPOCH)
    path = sorted((tmp_path / "checkpoints").glob("step-*.pt"))[-1]
    saved = torch.load(path, weights_only=True)
    mine = saved["callback_early_stops"][0]
    torch.save({**saved, "callback_early_stops": [{**mine, "waited": -1}]}, path)
    with pytest.raises(UserError, match=r"callback_early_stops\[0\]\.waited = -1"):
        train_yours(False, out=str(tmp_path), resume=str(path))
