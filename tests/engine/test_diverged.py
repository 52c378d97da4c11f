"""A loss that becomes non-finite stops the run (status 3) saying what was kept and what to try;
no checkpoint is ever written from a run that has diverged — by its loss, or by weights that
inf/NaN gradients spoiled under a finite loss — and a resume that would replay the divergence
(the same --lr, --grad-clip, --precision) says so. A user's model, under accumulation, fp32 and
bf16 (CPU autocast), with and without --out."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fasttrain
from fasttrain.engine import Diverged
from fasttrain.engine.checkpoint import complete
from tests.conftest import run_cli

ACCUM = 2
AT = 7  # the optimizer step whose loss is NaN (Bomb), or whose gradients are (GradBomb: 6)


class Bomb(nn.Module):
    """A regressor whose output is NaN from optimizer step AT on. Its training micro-batches are
    counted in a buffer: checkpointed, so a resume replays the divergence as a real one would."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 1)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        out = self.lin(x).squeeze(-1)
        if self.training:
            self.calls += 1
            out = out * self.spoil()
        return out

    def spoil(self):
        return float("nan") if int(self.calls) > (AT - 1) * ACCUM else 1.0


class GradBomb(Bomb):
    """A finite loss all along, but NaN gradients at step 6 (d/db sqrt(0·b)): the weights are
    NaN after it, and the loss from step 7 on."""

    def spoil(self):
        if int(self.calls) == (AT - 1) * ACCUM:
            return 1 + torch.sqrt(self.lin.bias.sum() * 0)
        return 1.0


def make() -> nn.Module:
    torch.manual_seed(0)
    return Bomb()


def data() -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(640, 8, generator=g)
    return {"train": (x[:512], x[:512].sum(1)), "test": (x[512:], x[512:].sum(1))}


def train(model: nn.Module, **kw):
    run = fasttrain.build(model=model, data=data(), **{
        **dict(loss="mse", batch_size=32, accum_steps=ACCUM, epochs=2, log_every=4,
               checkpoint_every=3, device="cpu", progress=False, verbose=False), **kw})
    with pytest.raises(Diverged) as e:
        fasttrain.fit(run)
    return str(e.value)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("out", [True, False])
def test_a_nan_loss_stops_saying_what_was_kept_and_what_to_try(tmp_path, precision, out):
    said = train(make(), precision=precision, out=str(tmp_path) if out else None)
    assert "the training loss became nan by step 8" in said  # read at the log after step 7
    if out:
        assert complete(tmp_path / "checkpoints")[-1][0] == 6
        assert "the last good checkpoint, step 6, is kept" in said, said
    else:  # it said a checkpoint was kept
        assert "nothing was saved (no --out was given)" in said, said
    assert "a lower --lr (this run's: 0.001) or --grad-clip" in said
    assert "fp16" not in said  # "bf16 instead of fp16" is advice for fp16 runs only


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_nan_gradients_under_a_finite_loss_never_become_the_last_good_checkpoint(tmp_path,
                                                                                 precision):
    torch.manual_seed(0)
    said = train(GradBomb(), precision=precision, out=str(tmp_path))
    # Step 6's checkpoint would hold NaN weights: resumed, even with a lower --lr, it diverges.
    (step, path), = complete(tmp_path / "checkpoints")[-1:]
    weights = torch.load(path, weights_only=True)["model"]
    assert all(v.isfinite().all() for v in weights.values()) and step == 3
    assert "the weights became inf or NaN by step 6" in said, said
    assert "last good checkpoint, step 3" in said


def test_status_3_and_a_resume_that_would_diverge_again_says_so(tmp_path, capsys):
    args = ["train", "--model", f"{__name__}:make", "--data", f"{__name__}:data", "--loss",
            "mse", "--batch-size", "32", "--accum-steps", str(ACCUM), "--epochs", "2",
            "--log-every", "4", "--checkpoint-every", "3", "--device", "cpu", "--no-progress",
            "--out", str(tmp_path)]
    code, _, err = run_cli(capsys, *args)
    assert code == 3 and "last good checkpoint, step 6, is kept" in err, err
    # A requeue, or a script that always resumes: the same settings replay the divergence.
    again = ["train", "--out", str(tmp_path), "--resume", "auto", "--device", "cpu",
             "--no-progress"]
    code, out, err = run_cli(capsys, *again)
    assert code == 3 and "resumed from" in out and "step 6)" in out, out + err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "diverged after this step last time" in warnings[0], err
    assert "--lr 0.001, no --grad-clip, --precision fp32" in warnings[0]
    # With a lower --lr it is another run from here: no warning (this model diverges anyway).
    code, out, err = run_cli(capsys, *again, "--lr", "1e-4")
    assert "changed: lr 0.001 → 0.0001" in out and "warning" not in err, out + err


def test_a_run_that_diverged_before_its_first_checkpoint_restarts_with_the_warning(tmp_path,
                                                                                   capsys):
    said = train(make(), out=str(tmp_path), checkpoint_every=10)
    assert "no checkpoint had been saved yet: run again with a lower --lr" in said, said
    capsys.readouterr()
    train(make(), out=str(tmp_path), checkpoint_every=10, resume="auto")  # from the start
    assert "diverged after this step last time" in capsys.readouterr().err
