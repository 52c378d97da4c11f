"""A stream without length is --max-steps long in one process, as under torchrun: passes restart
as often as it takes, each a new epoch (under torchrun ending on every rank where the shortest
share does); --epochs, given, ends it sooner; a resume mid-pass (the first or a later one) is
bit-identical; a pass that holds no step is one line, not an endless loop of empty passes
(engine/stream.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset

import fasttrain
from fasttrain.engine.config import TrainConfig
from fasttrain.errors import UserError
from tests.engine.streamdata import Numbers, tiny
from tests.engine.test_stream import FAST, one_line, stream_of, weights


class Drawn(IterableDataset):
    """64 items a pass, each drawn at random (a random transform) and shifted by the epoch its
    set_epoch was given: what a pass reads depends on which pass it is. Records the epochs."""

    def __init__(self):
        self.epoch, self.epochs = 0, []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs.append(epoch)

    def __iter__(self):
        return ((torch.rand(3) + self.epoch, i % 4) for i in range(64))


def dropped() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 4))


def test_a_stream_without_length_trains_max_steps_in_one_process_each_pass_an_epoch(capsys):
    # 64 items at batch 8: 8 steps a pass. A run of 20 steps is 2.5 passes, not one pass of 8.
    data = Drawn()
    run = fasttrain.build(model=dropped(), data=data, batch_size=8, max_steps=20,
                          **{**FAST, "verbose": True})
    assert "20 steps of 8 (a stream without length, restarted as often as it takes)" in (
        capsys.readouterr().err)
    fasttrain.fit(run)
    assert (run.step, run.epoch, run.step_in_epoch) == (20, 2, 4)
    assert data.epochs == [0, 1, 2]  # each pass a new epoch
    logged = [(r["step"], r["epoch"]) for r in run.history if r["kind"] == "train"]
    assert logged == [(4, 0), (8, 0), (12, 1), (16, 1), (20, 2)]


def test_given_epochs_end_a_stream_without_length_sooner_and_the_start_line_says_so(capsys):
    run = fasttrain.build(model=tiny(), data=Numbers(64), batch_size=8, max_steps=100,
                          epochs=2, **{**FAST, "verbose": True})
    assert "100 steps of 8 (or 2 pass(es) of a stream without length, if they end first)" in (
        capsys.readouterr().err)
    fasttrain.fit(run)
    assert (run.step, run.epoch) == (16, 2)


def test_under_torchrun_a_pass_without_length_ends_where_the_shortest_share_does():
    from fasttrain.engine.agree import steps_together

    # Rank 0's share: 5 steps of 2 micro-batches; the other rank's counts say it has 3.
    other = iter([2, 2, 2, 1, 0])
    got = list(steps_together(iter(range(10)), 2, lambda n: [n, next(other)]))
    assert got == [0, 1, 2, 3, 4, 5]  # 3 steps, then the pass ends on both ranks
    # A pass some rank cannot start: every rank raises the same error, from the counts.
    with pytest.raises(UserError, match=r"\[2, 0\]"):
        list(steps_together(iter(range(10)), 2, lambda n: [n, 0],
                            lambda counts: UserError(f"counts {counts}")))
    # A resumed pass (no `short`) that holds no more steps simply ends.
    assert list(steps_together(iter(range(1)), 2, lambda n: [n, 2])) == []
    s = stream_of(Numbers(64), rank=0, world=2, epochs=3)
    assert not s.endless and s.counts is not None  # a pass ends, and the ranks agree where


@pytest.mark.slow
def test_a_stream_without_length_under_torchrun_restarts_passes_as_one_process_does(tmp_path):
    """Two gloo ranks with uneven shares (5 and 3 steps a pass): every pass ends on both at
    step 3, each a new epoch (set_epoch, the logs), and --epochs ends the run."""
    import json

    from tests.engine.launch import Launch

    # Both runs in one launch (launch.py), each with its own $FT_SEEN while it runs.
    launch = Launch(tmp_path, 2, ["--model", "tests.engine.streamdata:tiny", "--data",
                                  "tests.engine.streamdata:uneven", "--batch-size", "16",
                                  "--log-every", "1", "--parallel", "ddp", "--device", "cpu",
                                  "--no-progress"])
    for name, extra in (("steps", ["--max-steps", "8"]),
                        ("epochs", ["--max-steps", "100", "--epochs", "2"])):
        (tmp_path / f"seen-{name}").mkdir()
        launch.add(name, *extra, env={"FT_SEEN": str(tmp_path / f"seen-{name}")})

    def train(out: str) -> list[dict]:
        ran = launch(out).ok()
        assert not any("cannot end a stream" in err for err in ran.stderrs), ran.log
        lines = (tmp_path / out / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == "train"]

    logged = [(r["step"], r["epoch"]) for r in train("steps")]
    assert logged == [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (6, 1), (7, 2), (8, 2)]
    for rank in (0, 1):  # each pass a new epoch on every rank, whatever its share
        seen = tmp_path / "seen-steps" / f"epochs-rank{rank}.txt"
        assert seen.read_text().split() == ["0", "1", "2"]
    logged = train("epochs")
    assert logged[-1]["step"] == 6 and logged[-1]["epoch"] == 1  # two passes of 3 steps


@pytest.mark.parametrize(("cut", "workers", "where"), [
    (5, 0, (0, 5)),  # mid first pass
    (8, 0, (0, 8)),  # its last step: the pass's end not yet seen
    (13, 0, (1, 5)),  # mid second pass
    (13, 2, (1, 5)),
])
def test_a_stream_without_length_resumed_mid_pass_is_bit_identical(tmp_path, cut, workers,
                                                                   where):
    common = dict(batch_size=8, workers=workers, **FAST)
    whole = fasttrain.build(model=dropped(), data=Drawn(), max_steps=20, **common)
    fasttrain.fit(whole)
    cut_run = fasttrain.build(model=dropped(), data=Drawn(), max_steps=cut, out=str(tmp_path),
                              **common)
    fasttrain.fit(cut_run)  # checkpoints at its end
    torch.rand(7)  # the resumed run must restore every random stream itself
    resumed = fasttrain.build(model=dropped(), data=Drawn(), max_steps=20, out=str(tmp_path),
                              resume="auto", **common)
    assert (resumed.epoch, resumed.step_in_epoch) == where
    fasttrain.fit(resumed)
    assert (resumed.step, resumed.epoch) == (20, 2)
    for k, v in weights(whole).items():
        assert torch.equal(weights(resumed)[k], v), k
    epochs = [r["epoch"] for r in resumed.history if r["kind"] == "train"]
    assert epochs[-1] == 2  # the epoch counter went on from the checkpoint's


def test_a_finished_stream_run_resumed_says_that_max_steps_extends_it(tmp_path, capsys):
    common = dict(model=tiny(), batch_size=8, max_steps=4, out=str(tmp_path), **FAST)
    fasttrain.fit(fasttrain.build(data=Numbers(64), **common))
    run = fasttrain.build(data=Numbers(64), resume="auto", **common)
    assert fasttrain.fit(run) == {} and run.step == 4
    err = capsys.readouterr().err
    assert "nothing to train" in err and "give a larger --max-steps to extend it" in err


class Once(IterableDataset):
    """A stream read once: its __iter__ hands back the same generator every time (a common
    mistake), so every pass after the first is empty."""

    def __init__(self, n: int = 40):
        self.items = ((torch.tensor([float(i)]), 0) for i in range(n))

    def __iter__(self):
        return self.items


def test_a_stream_read_once_is_one_line_not_endless_empty_passes():
    s = stream_of(Once())
    assert len(list(s.micro_batches(0))) == 4  # 38 items after the build's probe of 2
    with pytest.raises(UserError) as e:
        list(s.micro_batches(1))
    one_line(e, "pass 1", "gave 0 micro-batch(es)", "__iter__ must start it afresh")
    # fit would start empty passes without end (here: 50, then a silent end at step 4)
    run = fasttrain.build(model=tiny(), data=Once(), batch_size=8, max_steps=100, epochs=50,
                          **FAST)
    with pytest.raises(UserError) as e:
        fasttrain.fit(run)
    one_line(e, "pass 1")
    assert run.step == 4


@pytest.mark.parametrize(("n", "kw"), [(6, {}), (12, {"batch_size": 16, "accum_steps": 2})])
def test_a_stream_smaller_than_a_step_is_one_line(n, kw):
    with pytest.raises(UserError) as e:
        list(stream_of(Numbers(n), **kw).micro_batches(0))
    one_line(e, "pass 0", "less than the", "--batch-size")


def test_a_resumed_pass_that_holds_no_more_steps_is_not_an_error():
    # A checkpoint at a pass's last step resumes there: the rest of the pass is empty.
    s = stream_of(Numbers(64))
    assert list(s.micro_batches(0, start_step=8)) == []


def test_epochs_left_unset_is_recorded_as_unset_and_means_one_pass_for_data_with_length():
    from fasttrain.engine.configfile import to_toml

    assert TrainConfig().epochs is None and "# epochs = (not set)" in to_toml(TrainConfig())
    assert TrainConfig().epoch_limit() == 1 and TrainConfig(epochs=3).epoch_limit(False) == 3
    assert TrainConfig().epoch_limit(sized=False) == float("inf")
