"""The user's mistakes and crashes, each one clear line: losses that would broadcast
(inputs.py), a user step with float targets (run.py), errors in the user's factories and in-memory
Datasets shown as theirs (usercode.py), a --lr that would not apply on resume (resume.py), a
OneCycleLR shorter than the run (optim.py) and --resume auto on unreadable checkpoints
(checkpoint.py). Tiny models, a few steps."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fasttrain
from fasttrain.errors import UserCodeError, UserError
from tests.conftest import assert_one_line_error, run_cli
from tests.engine import usermodel, userstep
from tests.engine.conftest import text_task
from tests.engine.test_rundir import assert_error_after_start, snapshot
from tests.engine.test_rundir import train as train_logreg

QUICK = dict(batch_size=16, max_steps=1, device="cpu", progress=False, verbose=False)
# A regression run from the command line: usermodel's model and float data (8 steps an epoch).
REGRESSION = ["train", "--model", "tests.engine.usermodel:make", "--data",
              "tests.engine.usermodel:data", "--batch-size", "64", "--device", "cpu",
              "--no-progress"]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """write(name, source): a module of the user's in tmp_path, importable as `name` for the
    test (`--model name:fn`); forgotten afterwards so that another test may reuse the name."""
    made = []

    def write(name: str, source: str):
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        made.append(name)
        return path

    yield write
    for name in made:
        sys.modules.pop(name, None)


def mse_step(model, batch):
    """A user's step for float targets: `--step tests.engine.test_user_errors:mse_step`."""
    x, y = batch
    return F.mse_loss(model(x), y)


# -- 1. a named loss refuses shapes that would broadcast -----------------------------------------


@pytest.mark.parametrize("loss, model, y, shapes", [
    ("mse", nn.Linear(8, 1), torch.rand(32), ["(16, 1)", "(16,)", "nn.Flatten(0)"]),
    ("l1", nn.Linear(8, 1), torch.rand(32), ["(16, 1)", "(16,)", "nn.Flatten(0)"]),
    # a sequence model whose logits were not pooled: [B, T, classes] for [B] labels
    ("cross_entropy", nn.Sequential(nn.Unflatten(1, (2, 4)), nn.Linear(4, 3)),
     torch.randint(0, 3, (32,)), ["(16, 2, 3)", "(16,)"]),
])
def test_a_named_loss_refuses_an_output_of_another_shape(loss, model, y, shapes):
    run = fasttrain.build(model=model, data=(torch.rand(32, 8), y), loss=loss, **QUICK)
    with pytest.raises(UserError) as e:
        fasttrain.fit(run)
    assert "\n" not in str(e.value), e.value
    for w in [f"--loss {loss}", *shapes]:
        assert w in str(e.value), (w, str(e.value))


def test_the_cli_refuses_an_mse_output_of_another_shape_with_one_line(capsys, user_module):
    user_module("ft_unflattened", """
        from torch import nn

        def make():
            return nn.Linear(8, 1)  # [B, 1] against usermodel's [B] targets
        """)
    code, _, err = run_cli(capsys, *REGRESSION, "--model", "ft_unflattened:make", "--loss",
                           "mse", "--max-steps", "1")
    assert_error_after_start(code, err, "--loss mse", "(64, 1)", "(64,)")


def test_matching_shapes_still_train():
    run = fasttrain.build(model=usermodel.make(), data=usermodel.data(n=64), loss="l1", **QUICK)
    fasttrain.fit(run)
    assert run.step == 1


def unreduced(output, target):
    """A loss of the user's that forgot to reduce: one value per sample."""
    return F.cross_entropy(output, target, reduction="none")


@pytest.mark.parametrize("loss, got", [
    (unreduced, "shape [16]"),
    (lambda o, t: F.cross_entropy(o, t).reshape(1), "shape [1]"),
    (lambda o, t: 0.5, "float"),
])
def test_a_loss_of_yours_that_returns_no_scalar_is_one_line(loss, got):
    # It crashed inside torch's backward ("grad can be implicitly created only for scalar
    # outputs") or in the loss sum, with fasttrain's and torch's frames.
    run = fasttrain.build(model=nn.Linear(8, 3), data=(torch.rand(32, 8),
                                                       torch.randint(0, 3, (32,))),
                          loss=loss, **QUICK)
    with pytest.raises(UserError) as e:
        fasttrain.fit(run)
    assert "\n" not in str(e.value), e.value
    for w in ["your loss", got, "scalar", ".mean()"]:
        assert w in str(e.value), (w, str(e.value))


def test_the_cli_names_a_loss_that_returns_no_scalar(capsys):
    code, _, err = run_cli(capsys, "train", "--model", "tests.engine.usermodel:make", "--data",
                           "tests.engine.usermodel:data", "--loss",
                           "tests.engine.test_user_errors:unreduced_mse", "--batch-size", "64",
                           "--device", "cpu", "--no-progress", "--max-steps", "1")
    assert_error_after_start(code, err, "tests.engine.test_user_errors:unreduced_mse",
                             "shape [64]")


def unreduced_mse(output, target):
    return F.mse_loss(output, target, reduction="none")


# -- 2. a user step computes its own loss: float targets need no --loss ---------------------------


def test_a_user_step_trains_on_float_targets_without_a_loss(capsys, tmp_path):
    code, out, err = run_cli(capsys, *REGRESSION, "--step",
                             "tests.engine.test_user_errors:mse_step", "--max-steps", "2",
                             "--out", str(tmp_path))
    assert code == 0, err
    assert "done at step 2: test_loss" in out, out


def test_without_a_step_float_targets_still_need_a_loss(capsys):
    code, _, err = run_cli(capsys, *REGRESSION, "--max-steps", "1")
    assert_one_line_error(code, err, "float targets need a loss")


# -- 3. an exception in the user's --model / --data factory is shown as theirs --------------------


@pytest.mark.parametrize("flag", ["--model", "--data"])
def test_an_error_in_a_factory_shows_the_users_frames_and_one_line(capsys, user_module, flag):
    path = user_module("ft_factories", """
        def make():
            return _layers(3)

        def _layers(n):
            raise ValueError(f"cannot build {n} layers")

        def load():
            return _read("no-such-file.csv")

        def _read(name):
            return open(name).read()
        """)
    fn = "make" if flag == "--model" else "load"
    code, _, err = run_cli(capsys, *REGRESSION, flag, f"ft_factories:{fn}", "--loss", "mse",
                           "--max-steps", "1")
    assert code == UserCodeError.exit_code, err
    lines = err.rstrip("\n").splitlines()
    what = ("ValueError: cannot build 3 layers" if flag == "--model" else
            "FileNotFoundError: [Errno 2] No such file or directory: 'no-such-file.csv'")
    assert lines[-1] == f"error in your {flag[2:]} factory ft_factories:{fn}: {what}", err
    assert lines[0] == "Traceback (most recent call last):", err
    frames = [line for line in lines if line.startswith('  File "')]
    assert [f.rsplit(" in ", 1)[1] for f in frames] == (
        ["make", "_layers"] if flag == "--model" else ["load", "_read"]), err
    assert all(str(path) in f for f in frames), err
    assert "/fasttrain/" not in err and "/torch/" not in err, err


def test_an_error_in_a_factory_called_from_python_is_a_user_code_error(user_module):
    user_module("ft_factory_api", """
        def make():
            raise RuntimeError("weights file missing")
        """)
    with pytest.raises(UserCodeError) as e:
        fasttrain.build(model="ft_factory_api:make", data=usermodel.data(n=64), loss="mse",
                        **QUICK)
    assert str(e.value) == ("error in your model factory ft_factory_api:make: RuntimeError: "
                            "weights file missing"), e.value


# -- 4. an exception in the user's Dataset read into memory names the sample ----------------------


class Unreadable(torch.utils.data.Dataset):
    """Eight (input, class) samples, one of which cannot be decoded."""

    def __init__(self, bad: int):
        self.bad = bad

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == self.bad:
            return self.decode(i)
        return torch.zeros(4), i % 2

    def decode(self, i):
        raise TypeError(f"cannot decode sample {i}")


@pytest.mark.parametrize("bad", [0, 5])  # 0: the size estimate's read (check_fits); 5: the rest
def test_an_error_in_an_in_memory_dataset_names_the_index(bad):
    with pytest.raises(UserCodeError) as e:
        fasttrain.build(model=nn.Linear(4, 2), data=Unreadable(bad), data_in_memory=True,
                        **QUICK)
    assert str(e.value) == (f"error in your dataset (Unreadable.__getitem__) at index {bad}: "
                            f"TypeError: cannot decode sample {bad}"), e.value
    frames = [line for line in e.value.frames.splitlines() if line.startswith('  File "')]
    assert [f.rsplit(" in ", 1)[1] for f in frames] == ["__getitem__", "decode"], e.value.frames
    assert all(__file__ in f for f in frames), e.value.frames


def test_the_cli_reports_an_in_memory_dataset_error_as_the_users(capsys, user_module):
    user_module("ft_bad_dataset", """
        import torch

        class Broken(torch.utils.data.Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                return torch.zeros(8), torch.tensor(1.0) / self.missing

        def load():
            return Broken()
        """)
    code, _, err = run_cli(capsys, *REGRESSION, "--data", "ft_bad_dataset:load",
                           "--data-in-memory", "--loss", "mse", "--max-steps", "1")
    assert code == UserCodeError.exit_code, err
    assert err.rstrip("\n").splitlines()[-1] == (
        "error in your dataset (Broken.__getitem__) at index 0: AttributeError: 'Broken' "
        "object has no attribute 'missing'"), err
    assert "/fasttrain/" not in err and "/torch/" not in err, err


# -- 5. a new --lr is refused on resume when the user's optimizer or scheduler sets it ------------


@pytest.mark.parametrize("owner, words", [
    # A factory's optimizer never takes --lr: refused as any --lr with it is (config.py).
    (["--optimizer", "tests.engine.userstep:adamw"], ["--lr with --optimizer", "drop the flags"]),
    (["--scheduler", "tests.engine.userstep:onecycle"], ["--lr 0.5", "--scheduler",
                                                          "resume with --lr 0.001"]),
], ids=["optimizer", "scheduler"])
def test_a_changed_lr_is_refused_when_the_user_sets_the_learning_rate(capsys, tmp_path, owner,
                                                                       words):
    args = [*REGRESSION, "--loss", "mse", *owner, "--checkpoint-every", "2", "--out",
            str(tmp_path)]
    code, _, err = run_cli(capsys, *args, "--max-steps", "2")
    assert code == 0, err
    before = snapshot(tmp_path)
    code, _, err = run_cli(capsys, *args, "--max-steps", "4", "--resume", "auto", "--lr", "0.5")
    assert_one_line_error(code, err, *words)
    assert snapshot(tmp_path) == before
    code, out, err = run_cli(capsys, *args, "--max-steps", "4", "--resume", "auto")
    assert code == 0 and "resumed from" in out and "changed: lr" not in out, out + err


# -- 6. a user scheduler shorter than the run is refused at build ---------------------------------


def test_a_onecycle_shorter_than_the_run_is_refused_at_build():
    kw = dict(model=userstep.make_lm(), data=text_task(), step=userstep.hf_step,
              scheduler=userstep.onecycle, block_size=16, batch_size=16, epochs=50,
              device="cpu", progress=False, verbose=False)
    steps = userstep.TOTAL_STEPS
    with pytest.raises(UserError) as e:
        fasttrain.build(max_steps=steps + 1, **kw)
    assert "\n" not in str(e.value), e.value
    for w in [f"is {steps} steps long", f"this run {steps + 1}", f"total_steps={steps + 1}",
              f"--max-steps {steps}"]:
        assert w in str(e.value), (w, str(e.value))
    assert fasttrain.build(max_steps=steps, **kw).sched.total_steps == steps  # as long: fine


ONECYCLE_STEPS = {"total": userstep.TOTAL_STEPS}  # what onecycle_of_length builds, changeable


def onecycle_of_length(optimizer):
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2,
                                               total_steps=ONECYCLE_STEPS["total"])


def test_a_onecycle_whose_checkpoint_is_shorter_than_the_resumed_run_is_refused(
        tmp_path, monkeypatch):
    """OneCycleLR keeps its length in its state: a resume restores the saved one, so a factory
    now building a longer one passes the build's check, and the restored schedule is checked
    again (it would raise at its 13th step, from inside torch)."""
    steps = userstep.TOTAL_STEPS
    kw = dict(data=text_task(), step=userstep.hf_step, scheduler=onecycle_of_length,
              block_size=16, batch_size=16, epochs=50, device="cpu", progress=False,
              verbose=False, out=str(tmp_path / "run"), checkpoint_every=steps)
    fasttrain.fit(fasttrain.build(model=userstep.make_lm(), max_steps=steps, **kw))
    monkeypatch.setitem(ONECYCLE_STEPS, "total", 2 * steps)
    with pytest.raises(UserError) as e:
        fasttrain.build(model=userstep.make_lm(), max_steps=2 * steps, resume="auto", **kw)
    assert "\n" not in str(e.value)
    for w in [f"is {steps} steps long (its length as the checkpoint saved it)",
              f"this run {2 * steps}"]:
        assert w in str(e.value), (w, str(e.value))


# -- 7. --resume auto never starts a run over whose checkpoints all fail to load ------------------


def test_resume_auto_refuses_a_run_whose_checkpoints_none_loads(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = train_logreg(capsys, out, "--max-steps", "4", "--checkpoint-every", "2")
    assert code == 0, err
    (out / "weights.safetensors").unlink()  # as if killed after its last checkpoint
    checkpoints = sorted((out / "checkpoints").glob("step-*.pt"))
    assert len(checkpoints) == 2
    for path in checkpoints:
        path.write_bytes(b"a damaged disk")
    before = snapshot(out)
    code, _, err = train_logreg(capsys, out, "--max-steps", "4", "--resume", "auto")
    lines = err.strip().splitlines()
    # one warning per skipped file, then the refusal
    assert [line.startswith("warning: skipping") for line in lines] == [True, True, False], err
    assert_one_line_error(code, lines[-1], "no readable checkpoint", str(out), "new --out")
    assert snapshot(out) == before


def test_pin_memory_on_a_cpu_is_a_warning_and_ignored(capsys):
    """As torch's DataLoader does: a script written for a GPU (pin_memory=True) runs on a CPU."""
    run = fasttrain.build(model="logreg", data="synthetic", batch_size=16, max_steps=2,
                          pin_memory=True, device="cpu", progress=False, verbose=False)
    assert run.cfg.pin_memory is False
    assert "warning: --pin-memory speeds up host-to-GPU copies; on cpu there are none: ignored" \
        in capsys.readouterr().err
    fasttrain.fit(run)
    assert run.step == 2


class _Counted(torch.utils.data.IterableDataset):
    """n items with a length: (tensor([i]), i % 4)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return ((torch.tensor([float(i)]), i % 4) for i in range(self.n))


@pytest.mark.parametrize("n, batch, workers, unused, warned", [
    (80, 16, 0, 0, False), (80, 16, 3, 32, True),
    (100, 64, 0, 36, False),  # one reader drops one partial batch, as map-style data does
])
def test_a_stream_whose_readers_drop_much_says_so(capsys, n, batch, workers, unused, warned):
    """Each reader (process × worker) of a stream batches its own share and drops its partial
    batch: 80 items at batch 16 are 5 steps read by one reader, but 1 step each read by 3 (26 or
    27 items apiece): 32 of the 80 unused, which the build says."""
    run = fasttrain.build(model=torch.nn.Linear(1, 4), data={"train": _Counted(n)},
                          batch_size=batch, workers=workers, epochs=1, device="cpu",
                          progress=False, verbose=False)
    assert run.batches.steps_per_epoch == (n - unused) // batch
    err = capsys.readouterr().err
    if warned:
        assert f"{unused} of its {n} items a pass (40%) are not trained on" in err
        assert "its 3 readers" in err
    else:
        assert "not trained on" not in err
