"""Any step, optimizer and schedule (steps.py, optim.py), the user's errors shown as theirs
(usercode.py) and plain log lines when stderr is a file."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import fasttrain
from fasttrain.engine.optim import param_groups
from fasttrain.errors import UserCodeError, UserError
from tests.conftest import run_cli
from tests.engine import userstep
from tests.engine.conftest import image_task, text_task

LM = dict(block_size=16, batch_size=16, lr=1e-2, seed=3, device="cpu",
          progress=False, epochs=50)


def weights(run):
    return {k: v.detach().clone() for k, v in run.model.state_dict().items()}


def train_lm(steps: int, **kw):
    run = fasttrain.build(model=userstep.make_lm(), data=text_task(), max_steps=steps,
                          verbose=False, **{**LM, **kw})
    fasttrain.fit(run)
    return run


def test_a_user_step_equals_the_default_step():
    common = dict(model="mlp", batch_size=32, accum_steps=2, max_steps=5, seed=4,
                  device="cpu", progress=False)
    default = fasttrain.build(data=image_task(), verbose=False, **common)
    fasttrain.fit(default)
    mine = fasttrain.build(data=image_task(), verbose=False,
                           step=lambda model, b: F.cross_entropy(model(b[0]), b[1]), **common)
    fasttrain.fit(mine)
    for k, v in weights(default).items():
        assert torch.equal(v, weights(mine)[k]), k
    assert mine.cfg.step.startswith("python:tests.engine.test_steps:")


def test_an_hf_style_step_with_bf16_and_accumulation_resumes_bit_identically(tmp_path):
    kw = dict(step=userstep.hf_step, precision="bf16", accum_steps=2, log_every=3)
    whole = train_lm(12, **kw)
    logs = [r["loss"] for r in whole.history if r["kind"] == "train"]
    assert logs[-1] < 0.9 * logs[0], logs  # it learns
    torch.manual_seed(123)  # the resumed run must restore everything itself
    train_lm(6, out=str(tmp_path), checkpoint_every=6, **kw)
    resumed = train_lm(12, out=str(tmp_path), resume="auto", **kw)
    assert resumed.step == 12
    for k, v in weights(resumed).items():
        assert torch.equal(v, weights(whole)[k]), k


def test_a_dict_step_logs_its_extras_in_training_and_evaluation():
    run = train_lm(6, step=userstep.step_with_extras, log_every=2, val_fraction=0.2)
    train = [r for r in run.history if r["kind"] == "train"]
    assert len(train) == 3
    for r in train:  # "twice" is 2 × the loss, averaged the same way: equal to float32 rounding
        assert r["twice"] == pytest.approx(2 * r["loss"], rel=1e-5), r
        assert 0 <= r["hits"] <= 1
    ev = [r for r in run.history if r["kind"] == "eval"][-1]
    for split in ("val", "test"):
        assert ev[f"{split}_twice"] == pytest.approx(2 * ev[f"{split}_loss"], rel=1e-5), ev
        assert 0 <= ev[f"{split}_hits"] <= 1
    assert "test_token_accuracy" not in ev  # the default step's metrics need its output


@pytest.mark.parametrize("switches", [
    dict(model="mlp", compile=True, accum_steps=2),
    dict(model="gpt", activation_checkpointing=True, accum_steps=2, precision="bf16"),
])
def test_a_user_step_gets_the_switches_the_default_step_gets(switches):
    from tests.engine.conftest import fit

    task = text_task() if switches["model"] == "gpt" else image_task()
    step = "lm_step" if switches["model"] == "gpt" else "xy_step"
    common = dict(batch_size=16, max_steps=3, seed=5, **switches)
    default = fit(task, **common)
    mine = fit(task, step=f"tests.engine.userstep:{step}", **common)
    wrapped = mine.forward if switches.get("compile") else mine.model
    assert type(wrapped).__name__ == ("OptimizedModule" if switches.get("compile") else "GPT")
    if switches.get("activation_checkpointing"):
        assert any(type(m).__name__ == "Checkpointed" for m in mine.model.modules())
    for k, v in weights(default).items():
        assert torch.equal(v, weights(mine)[k]), k


@pytest.mark.parametrize("step, words", [
    (lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none"), ["scalar", "[16]"]),
    (lambda m, b: {"total": F.cross_entropy(m(b[0]), b[1])}, ["'loss'", "total"]),
    (lambda m, b: {"loss": F.cross_entropy(m(b[0]), b[1]), "acc": torch.ones(2)},
     ["'acc'", "scalar"]),
])
def test_a_step_returning_no_scalar_loss_is_one_line(step, words):
    run = fasttrain.build(model="mlp", data=image_task(), step=step, batch_size=16, max_steps=1,
                          device="cpu", progress=False, verbose=False)
    with pytest.raises(UserError) as e:
        fasttrain.fit(run)
    assert len(str(e.value).splitlines()) == 1
    for w in words:
        assert w in str(e.value), (w, str(e.value))


# -- optimizer and schedule --------------------------------------------------------------------


def test_built_ins_do_not_decay_biases_and_norms():
    model = userstep.make_lm()
    run = fasttrain.build(model=model, data=text_task(), step=userstep.hf_step, max_steps=1,
                          weight_decay=0.1, verbose=False, **LM)
    decayed, kept = run.opt.param_groups
    assert [id(p) for p in decayed["params"]] == [id(model.embed.weight), id(model.head.weight)]
    assert [id(p) for p in kept["params"]] == [id(model.norm.weight), id(model.norm.bias),
                                               id(model.head.bias)]
    assert (decayed["weight_decay"], kept["weight_decay"]) == (0.1, 0.0)
    assert len(param_groups(model, decay_norm_and_bias=True)) == 1
    run = fasttrain.build(model=userstep.make_lm(), data=text_task(), step=userstep.hf_step,
                          max_steps=1, weight_decay=0.1, decay_norm_and_bias=True,
                          optimizer="sgd", verbose=False, **LM)
    assert [g["weight_decay"] for g in run.opt.param_groups] == [0.1]
    assert len(run.opt.param_groups[0]["params"]) == 5


def test_a_factory_that_leaves_parameters_out_is_refused():
    with pytest.raises(UserError, match="leaves 3 trainable"):
        fasttrain.build(model=userstep.make_lm(), data=text_task(), step=userstep.hf_step,
                        optimizer=lambda groups: torch.optim.SGD(groups[0]["params"], lr=0.1),
                        verbose=False, **{k: v for k, v in LM.items() if k != "lr"})


@pytest.mark.parametrize("flags, named", [
    (dict(lr=0.5), "--lr"),
    (dict(weight_decay=0.1, momentum=0.5), "--momentum, --weight-decay"),
])
def test_flags_an_optimizer_factory_would_ignore_are_refused(flags, named):
    # They reached only the built-ins: with a factory, --lr 0.5 trained at the factory's lr
    # while config.toml said 0.5 (a sweep over --lr gave the same run every time).
    with pytest.raises(UserError, match=f"^{named} with --optimizer mine:opt: .*drop the flags"):
        fasttrain.TrainConfig(optimizer="mine:opt", **flags).validate()
    fasttrain.TrainConfig(optimizer="adamw", **flags).validate()  # the built-ins take them
    fasttrain.TrainConfig(optimizer="mine:opt").validate()  # the defaults are not "given"


def test_zero1_refuses_an_optimizer_factory():
    with pytest.raises(UserError, match="zero1"):
        fasttrain.TrainConfig(optimizer="mine:opt", parallel="zero1").validate()
    with pytest.raises(UserError, match="replaces --schedule"):
        fasttrain.TrainConfig(scheduler="mine:sched", schedule="cosine").validate()


def test_user_optimizer_and_onecycle_resumed_mid_run_equal_an_uninterrupted_run(capsys,
                                                                                  tmp_path):
    from safetensors.torch import load_file

    args = ["train", "--model", "tests.engine.userstep:make_lm", "--data", "synthetic-text",
            "--step", "tests.engine.userstep:hf_step", "--optimizer", "tests.engine.userstep:adamw",
            "--scheduler", "tests.engine.userstep:onecycle", "--block-size", "16",
            "--batch-size", "16", "--epochs", "50", "--deterministic", "--device", "cpu",
            "--no-progress", "--log-every", "3"]
    steps = str(userstep.TOTAL_STEPS)
    code, _, err = run_cli(capsys, *args, "--max-steps", steps, "--out", str(tmp_path / "a"))
    assert code == 0, err
    code, _, err = run_cli(capsys, *args, "--max-steps", "5", "--checkpoint-every", "5",
                           "--out", str(tmp_path / "b"))
    assert code == 0, err
    saved = torch.load(tmp_path / "b" / "checkpoints" / "step-00000005.pt", weights_only=True)
    assert saved["scheduler"]["total_steps"] == userstep.TOTAL_STEPS  # OneCycleLR's own state
    assert [g["weight_decay"] for g in saved["optimizer"]["param_groups"]] == [0.1, 0.0]
    code, out, err = run_cli(capsys, *args, "--max-steps", steps, "--resume", "auto",
                             "--out", str(tmp_path / "b"))
    assert code == 0 and "resumed from" in out, err
    whole = load_file(tmp_path / "a" / "weights.safetensors")
    resumed = load_file(tmp_path / "b" / "weights.safetensors")
    for k, v in whole.items():
        assert torch.equal(v, resumed[k]), k


# -- what a user sees --------------------------------------------------------------------------


def _cli(*argv: str, stderr) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fasttrain", "train", *argv], stdout=stderr,
                          stderr=stderr, text=True, timeout=600)


def test_an_error_in_the_users_code_shows_their_frames_and_one_line(tmp_path):
    log = tmp_path / "log.txt"
    with log.open("w") as f:
        proc = _cli("--model", "tests.engine.userstep:make_broken", "--data", "synthetic-text",
                    "--step", "tests.engine.userstep:hf_step", "--block-size", "16",
                    "--batch-size", "8", "--max-steps", "2", "--device", "cpu", stderr=f)
    text = log.read_text()
    assert proc.returncode == 1, text
    lines = text.rstrip("\n").splitlines()
    assert lines[-1] == ("error in your step function tests.engine.userstep:hf_step on batch "
                         "(int64[8, 16], int64[8, 16]): ValueError: boom: cannot use hidden "
                         "states of shape (8, 16, 16)"), text
    frames = [line for line in lines if line.startswith('  File "')]
    assert [f.rsplit(" in ", 1)[1] for f in frames] == ["hf_step", "forward",
                                                       "_reshape_wrongly"], text
    assert all("tests/engine/userstep.py" in f for f in frames), text
    assert "/fasttrain/" not in text and "/torch/" not in text, text


def test_an_error_in_the_users_model_names_it_and_keeps_a_python_traceback():
    run = fasttrain.build(model=userstep.make_broken(), data=text_task(), verbose=False, **LM)
    with pytest.raises(UserCodeError) as e:
        fasttrain.fit(run)
    assert str(e.value).startswith("error in your model's forward (BrokenLM) on batch "
                                   "(int64[16, 16], int64[16, 16]): ValueError: boom"), e.value
    import traceback

    files = [f.filename for f in traceback.extract_tb(e.value.__traceback__)]
    assert files[-2:] == [userstep.__file__] * 2  # below fit: the user's frames only
    assert sum("/fasttrain/" in f for f in files) == 1  # fit, where it is raised


class BadData(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            raise KeyError(f"sample {i} is missing")
        return torch.zeros(2)


@pytest.mark.parametrize("workers", [0, 1])
def test_an_error_in_the_users_dataset_names_it(workers):
    from fasttrain.engine import usercode

    loader = torch.utils.data.DataLoader(BadData(), batch_size=2, num_workers=workers)
    with pytest.raises(UserCodeError) as e:
        list(usercode.pulled(loader))
    # In a worker only the text of its traceback comes back: function names, not classes.
    name = "__getitem__) in DataLoader worker 0" if workers else "BadData.__getitem__"
    assert str(e.value).startswith(f"error in your dataset ({name}"), e.value
    assert str(e.value).endswith("KeyError: 'sample 5 is missing'"), e.value
    assert __file__ in e.value.frames and "/torch/" not in e.value.frames, e.value.frames
    # The workers are stopped when the error is raised, not when the error is freed (which
    # waited out torch's 5 s status timeout).
    assert not multiprocessing.active_children()


def test_plain_log_lines_when_stderr_is_a_file(tmp_path):
    log = tmp_path / "log.txt"
    with log.open("w") as f:
        proc = _cli("--model", "tests.engine.userstep:make_lm", "--data", "synthetic-text",
                    "--step", "tests.engine.userstep:step_with_extras", "--block-size", "16",
                    "--batch-size", "16", "--max-steps", "4", "--log-every", "2",
                    "--device", "cpu", stderr=f)
    text = log.read_text()
    assert proc.returncode == 0, text
    lines = [line for line in text.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["2/4", "4/4"], text
    for line in lines:
        assert " loss " in line and " hits " in line and "tokens/s" in line, line
        assert line.split("ETA ")[1].count(":") == 2, line
    assert any(line.startswith("eval at step 4") and "test_hits" in line
               for line in text.splitlines()), text
    assert "\x1b[" not in text  # no terminal escapes in a file


class CountingSGD(torch.optim.Optimizer):
    """A hand-written SGD with momentum and state of its own (a step count, a norm average)."""

    def __init__(self, params, lr=0.05):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                s = self.state[p]
                if not s:
                    s["n"], s["buf"], s["norm"] = 0, torch.zeros_like(p), torch.zeros(())
                s["n"] += 1
                s["norm"].mul_(0.9).add_(0.1 * p.grad.norm())
                s["buf"].mul_(0.9).add_(p.grad)
                p.add_(s["buf"], alpha=-group["lr"] / (1 + s["norm"]) * (1 + 0.01 * s["n"]))


def two_optimizers(groups):
    """AdamW for the embedding, a hand-written SGD for the rest (a model and its head)."""
    params = [p for g in groups for p in g["params"]]
    return [torch.optim.AdamW(params[:1], lr=1e-2), CountingSGD(params[1:])]


def test_a_list_of_optimizers_steps_each_and_resumes_bit_for_bit(tmp_path):
    # A factory could return one optimizer only: two (a head with its own) were refused, and one
    # of the user's own wrapping both lost their learning rates on resume (load_state_dict makes
    # new param_groups, which the scheduler no longer reached).
    def train(steps, **kw):
        run = fasttrain.build(model=userstep.make_lm(), data=text_task(), step=userstep.hf_step,
                              optimizer=two_optimizers, accum_steps=2, grad_clip=0.5,
                              scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 3, 0.5),
                              max_steps=steps, verbose=False,
                              **{k: v for k, v in LM.items() if k != "lr"}, **kw)
        fasttrain.fit(run)
        return run

    whole = train(10)
    first, second = whole.opt.optimizers
    assert first.param_groups[0]["lr"] == 1e-2 * 0.5 ** 3 and len(second.state) == 4
    assert all(s["n"] == 10 for s in second.state.values())
    train(4, out=str(tmp_path), checkpoint_every=4)
    resumed = train(10, out=str(tmp_path), resume="auto")
    assert resumed.opt.optimizers[0].param_groups[0]["lr"] == 1e-2 * 0.5 ** 3
    for k, v in weights(resumed).items():
        assert torch.equal(v, weights(whole)[k]), k


def test_optimizers_that_share_a_parameter_or_a_sharded_layout_are_one_line():
    from types import SimpleNamespace

    from fasttrain.engine import optim

    cfg, model = fasttrain.TrainConfig(optimizer="mine:opt"), userstep.make_lm()

    def twice(groups):
        params = [p for g in groups for p in g["params"]]
        return [torch.optim.SGD(params, lr=0.1), torch.optim.SGD(params[:1], lr=0.1)]

    with pytest.raises(UserError, match="share parameters"):
        optim.optimizer(cfg, model, SimpleNamespace(sharded=False), twice, "mine:opt")
    with pytest.raises(UserError, match="returned 2 optimizers, which --parallel fsdp"):
        optim.optimizer(cfg, model, SimpleNamespace(sharded=True), two_optimizers, "mine:opt")
