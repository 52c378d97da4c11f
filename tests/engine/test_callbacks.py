"""The standard callbacks (engine/callbacks.py): early stopping's metric is checked at start."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fasttrain
from fasttrain.engine.callbacks import EarlyStop
from fasttrain.errors import UserError
from tests.conftest import assert_one_line_error, run_cli


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def data():
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(160, 4, generator=g), torch.randint(0, 3, (160,), generator=g)
    return {"train": (x[:120], y[:120]), "test": (x[120:], y[120:])}


def build(**kw):
    return fasttrain.build(model=net(), data=data(), **{
        **dict(epochs=3, batch_size=20, device="cpu", progress=False, verbose=False), **kw})


# An --early-stop metric the evaluations never report was found at the first evaluation: after
# a whole epoch of training (hours on a real run), then exit 2, the epoch lost.
@pytest.mark.parametrize("kw, words", [
    ({"early_stop": "val_loss"}, ["no validation set", "--val-fraction", "test_loss"]),
    ({"early_stop": "val_acc", "val_fraction": 0.2}, ["val_accuracy", "val_loss"]),
    ({"early_stop": "loss", "val_fraction": 0.2}, ["val_loss", "test_accuracy"]),
])
def test_an_early_stop_metric_never_reported_is_refused_at_build(kw, words):
    with pytest.raises(UserError) as e:
        build(**kw)
    for w in words:
        assert w in str(e.value)
    assert f"--early-stop {kw['early_stop']}" in str(e.value)
    assert "\n" not in str(e.value)


def test_every_metric_an_evaluation_reports_is_accepted():
    for metric in ("val_loss", "val_accuracy", "test_loss", "test_accuracy", "val_mae"):
        run = build(early_stop=metric, val_fraction=0.2, max_steps=1,
                    metrics={"mae": lambda out, y: (out.argmax(-1) - y).abs().float().mean()})
        fasttrain.fit(run)
        assert run.history[-1]["kind"] == "eval" and metric in run.history[-1]


def test_your_early_stop_callback_is_checked_before_the_first_step():
    run = build(val_fraction=0.2)
    with pytest.raises(UserError) as e:
        fasttrain.fit(run, callbacks=[EarlyStop("val_acuracy")])
    assert run.step == 0
    assert "your EarlyStop('val_acuracy')" in str(e.value) and "val_accuracy" in str(e.value)


def test_a_step_of_yours_is_checked_for_its_split_only():
    # Its extras are known from its first step only: a name of them passes the build...
    def step(model, batch):
        x, y = batch
        return {"loss": nn.functional.cross_entropy(model(x), y), "hits": torch.tensor(1.0)}

    run = build(step=step, early_stop="val_hits", val_fraction=0.2, max_steps=1)
    fasttrain.fit(run)
    assert "val_hits" in run.history[-1]
    # ... but a split the data does not have is refused at build.
    with pytest.raises(UserError, match="no validation set"):
        build(step=step, early_stop="val_hits")


def test_cli_refuses_it_before_training(capsys, tmp_path):
    code, out, err = run_cli(capsys, "train", "--model", "logreg", "--data", "synthetic",
                             "--early-stop", "val_loss", "--max-steps", "2", "--device", "cpu",
                             "--no-progress", "--out", str(tmp_path / "run"))
    assert_one_line_error(code, err, "--early-stop val_loss", "--val-fraction")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
