"""The engine on the CPU: equivalences between switches, memorization, outputs, syncs, faults."""

import json
import math

import pytest
import torch

from fasttrain.engine import Diverged, TrainConfig, build
from fasttrain.engine import fit as fit_run
from fasttrain.errors import UserError
from fasttrain.models import MODELS
from tests.engine.conftest import fit, image_task, text_task, weights


def assert_same_weights(a, b, atol):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)


def test_accumulating_4x32_equals_one_batch_of_128():
    common = dict(model="mlp", optimizer="sgd", momentum=0.0, lr=0.1, max_steps=4, seed=3)
    big = fit(batch_size=128, accum_steps=1, **common)
    accum = fit(batch_size=128, accum_steps=4, **common)
    assert_same_weights(weights(big), weights(accum), atol=1e-6)
    one_step = weights(fit(batch_size=128, **{**common, "max_steps": 1}))
    assert any(not torch.equal(one_step[k], v) for k, v in weights(big).items()), \
        "4 steps must differ from 1: the comparison above would be vacuous"


@pytest.mark.parametrize("model", ["cnn", "gpt"])
def test_activation_checkpointing_gives_the_same_training(model):
    task = text_task() if model == "gpt" else image_task()
    common = dict(model=model, batch_size=32, max_steps=3, seed=1)
    plain = fit(task, **common)
    ckpt = fit(task, activation_checkpointing=True, **common)
    assert_same_weights(weights(plain), weights(ckpt), atol=1e-6)


def test_bf16_is_close_to_fp32():
    common = dict(model="cnn", batch_size=64, epochs=2, seed=2, lr=3e-3)
    fp32, bf16 = fit(**common), fit(precision="bf16", **common)
    l32 = [r for r in fp32.history if r["kind"] == "eval"][-1]["test_loss"]
    l16 = [r for r in bf16.history if r["kind"] == "eval"][-1]["test_loss"]
    assert abs(l32 - l16) < 0.1 * l32 + 0.02, (l32, l16)


def test_compiled_step_equals_eager():
    common = dict(model="mlp", batch_size=64, max_steps=3, seed=4)
    eager, compiled = fit(**common), fit(compile=True, **common)
    assert_same_weights(weights(eager), weights(compiled), atol=1e-5)


def test_a_run_gives_the_process_its_flags_back():
    """--deterministic and --precision set process-wide flags; a caller's code after the run
    (or the next run) starts from its own, whether the run trained or its build refused."""
    assert not torch.are_deterministic_algorithms_enabled()
    run = fit(model="mlp", batch_size=64, max_steps=2, deterministic=True)
    assert run.cfg.deterministic and not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # the caller's own choice
    try:
        fit(model="mlp", batch_size=64, max_steps=2)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        with pytest.raises(UserError, match="tf32"):
            fit(model="mlp", batch_size=64, max_steps=2, deterministic=True, precision="tf32")
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_fp16_uses_a_grad_scaler_and_reports_it():
    t = fit(model="mlp", batch_size=64, max_steps=4, log_every=2, precision="fp16")
    logs = [r for r in t.history if r["kind"] == "train"]
    assert logs and all("loss_scale" in r and r["skipped_steps"] >= 0 for r in logs)


@pytest.mark.parametrize("model", MODELS)
def test_every_model_memorizes_a_batch(model):
    """One batch, seen over and over (an epoch is one step): the loss must go to ~0."""
    # The smallest test split (one sample, one sequence): each epoch ends in an evaluation, which
    # the assertion does not read; 64 images took a third of resnet's CPU time, 400 tokens 40% of
    # gpt's (2-core EPYC, loaded, 2026-11-27: resnet 20.8 s → 14.1 s, gpt 14.6 → 8.9 s).
    if model == "gpt":
        task, batch = text_task(n_train_tokens=8 * 16 + 1, n_test_tokens=17), 8
    else:
        shape = (3, 32, 32) if model == "resnet" else (1, 28, 28)
        task, batch = image_task(n_train=32, n_test=1, shape=shape), 32
    # The last epoch's loss by epoch (torch 2.13, 2-core EPYC, 2026-11-27): resnet below 0.05 at
    # 9, 0.0023 at 20; cnn below 0.05 at 46 (a plateau at ~2.2 until ~30), 1e-3 at 52, <1e-4
    # from 55; mlp 0.0269 at 10, 1e-4 at 17; logreg 0.047 at 15, 0.0026 at 40; gpt below 0.05
    # at 40, 0.0301 at 72, then levels off (0.0285 at 150). Each count ends well under the bound.
    epochs = {"resnet": 20, "cnn": 64, "gpt": 80}.get(model, 40)
    t = fit(task, model=model, batch_size=batch, lr=3e-3, epochs=epochs, log_every=10)
    last = [r for r in t.history if r["kind"] == "train"][-1]  # mean of the last 10 steps
    assert last["loss"] < 0.05, f"{model} did not memorize: loss {last['loss']:.4f}"


def test_language_metrics_are_perplexity_and_tokens_per_second():
    t = fit(text_task(), batch_size=16, epochs=1, log_every=5)
    train = [r for r in t.history if r["kind"] == "train"]
    evals = [r for r in t.history if r["kind"] == "eval"]
    assert train[0]["tokens_per_s"] == pytest.approx(train[0]["samples_per_s"] * 16)
    assert evals[-1]["test_perplexity"] == pytest.approx(math.exp(evals[-1]["test_loss"]))


def test_run_directory_holds_config_metrics_plot_and_weights(tmp_path):
    from safetensors.torch import load_file

    t = fit(model="mlp", batch_size=64, epochs=2, log_every=2, out=str(tmp_path / "run"))
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    kinds = {r["kind"] for r in records}
    assert kinds == {"train", "eval"}
    train = [r for r in records if r["kind"] == "train"]
    assert {"loss", "lr", "samples_per_s", "step_ms", "peak_rss_gb"} <= train[0].keys()
    assert (run / "loss.png").read_bytes()[:4] == b"\x89PNG"
    saved = load_file(run / "weights.safetensors")
    assert_same_weights(saved, {k: v for k, v in weights(t).items()}, atol=0)
    assert 'model = "mlp"' in (run / "config.toml").read_text()
    import fasttrain

    assert_same_weights(fasttrain.load(run).state_dict(), weights(t), atol=0)  # rebuilt by name


def test_no_host_sync_between_logs(monkeypatch):
    """The loss is read once per log, the eval once per epoch: count every .item() that
    fasttrain's code makes (torch's own reads of CPU-side counters are not device syncs)."""
    import sys

    reads = []
    original = torch.Tensor.item

    def counting_item(self):
        if sys._getframe(1).f_globals.get("__name__", "").startswith("fasttrain"):
            reads.append(sys._getframe(1).f_code.co_name)
        return original(self)

    original_tolist = torch.Tensor.tolist

    def counting_tolist(self):
        if sys._getframe(1).f_globals.get("__name__", "").startswith("fasttrain"):
            reads.append(sys._getframe(1).f_code.co_name)
        return original_tolist(self)

    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    run = build(TrainConfig(model="mlp", batch_size=16, max_steps=12, log_every=4,
                            progress=False, device="cpu"), data=image_task(), verbose=False)
    reads.clear()
    fit_run(run)
    # 3 logs + 1 end-of-run evaluation (loss and accuracy together: 1 read)
    assert reads == ["log"] * 3 + ["evaluate"], reads


def test_non_finite_loss_stops_the_run(tmp_path):
    with pytest.raises(Diverged):
        fit(model="mlp", optimizer="sgd", lr=1e30, momentum=0.0, batch_size=64, max_steps=20,
            log_every=5, checkpoint_every=5, out=str(tmp_path))


def test_resume_refuses_a_different_run(tmp_path):
    fit(model="mlp", batch_size=64, max_steps=4, checkpoint_every=2, out=str(tmp_path))
    with pytest.raises(UserError, match="batch_size"):
        fit(model="mlp", batch_size=32, max_steps=4, out=str(tmp_path), resume="auto")


def test_corrupt_checkpoint_is_a_user_error(tmp_path):
    bad = tmp_path / "step-00000005.pt"
    bad.write_bytes(b"PK\x03\x04 this is not a checkpoint")
    with pytest.raises(UserError, match="unreadable"):
        fit(model="mlp", batch_size=64, max_steps=4, out=str(tmp_path), resume=str(bad))


def test_checkpoint_files_never_unpickle_code(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    bad = tmp_path / "evil.pt"
    torch.save({"format": "fasttrain.checkpoint/1", "x": Evil()}, bad, pickle_protocol=2)
    with pytest.raises(UserError):
        fit(model="mlp", batch_size=64, max_steps=4, out=str(tmp_path), resume=str(bad))
    del pickle


def test_dataloader_path_with_workers_equals_the_device_path():
    common = dict(model="mlp", batch_size=32, max_steps=6, seed=7)
    on_device = fit(data_on_device="on", **common)
    loader = fit(data_on_device="off", workers=2, **common)
    assert_same_weights(weights(on_device), weights(loader), atol=0)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_fused_optimizer_equals_the_default_one(optimizer):
    common = dict(model="mlp", batch_size=32, max_steps=5, seed=8, optimizer=optimizer)
    assert_same_weights(weights(fit(**common)), weights(fit(fused_optimizer=True, **common)),
                        atol=1e-6)


def test_schedules_warm_up_then_decay():
    from fasttrain.engine.optim import lr_factor

    cfg = TrainConfig(model="logreg", data="synthetic", batch_size=32, epochs=20, max_steps=100,
                      warmup_steps=10, schedule="cosine", progress=False, device="cpu")
    run = build(cfg, data=image_task(), verbose=False)
    f = [lr_factor(run.cfg, run, s) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:], strict=False)) and f[-1] < 0.01
    cfg = TrainConfig(schedule="onecycle", warmup_steps=0)
    g = [lr_factor(cfg, run, s) for s in range(100)]
    assert max(g) == pytest.approx(1.0) and g.index(max(g)) == 29 and g[-1] < 0.01


def test_out_of_memory_names_the_switches_that_would_fit(monkeypatch, capsys):
    run = build(TrainConfig(model="mlp", batch_size=64, max_steps=3, progress=False,
                            device="cpu"), data=image_task(), verbose=False)

    def oom(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(run, "loss_fn", oom)
    with pytest.raises(UserError) as e:
        fit_run(run)
    assert "--accum-steps 2" in str(e.value) and "--activation-checkpointing" in str(e.value)
    assert "weights" in capsys.readouterr().err


def test_a_logs_time_includes_the_device_work_it_waited_for(monkeypatch):
    """step_ms spans the sync at the log (the loss read waits for the queued steps): read
    before it, a GPU-bound run would show only how fast the host queued its steps. Here the
    clock moves only while the loss is read, as a device still busy with the steps would make
    it; every window is that 1 s."""
    import types

    from fasttrain.engine import callbacks, loop

    clock = [0.0]
    fake_time = types.SimpleNamespace(perf_counter=lambda: clock[0])
    original_tolist = torch.Tensor.tolist

    def waiting_tolist(self):
        clock[0] += 1.0
        return original_tolist(self)

    run = build(TrainConfig(model="mlp", batch_size=16, max_steps=12, log_every=4,
                            progress=False, device="cpu"), data=image_task(), verbose=False)
    monkeypatch.setattr(callbacks, "time", fake_time)
    monkeypatch.setattr(loop, "time", fake_time)
    monkeypatch.setattr(torch.Tensor, "tolist", waiting_tolist)
    fit_run(run)
    train = [r for r in run.history if r["kind"] == "train"]
    assert [r["step_ms"] for r in train] == [pytest.approx(250.0)] * 3


def test_max_steps_beyond_the_epochs_is_said(capsys):
    """--max-steps is a limit: when --epochs end the run first the user is told, not left to
    find a run of 4 steps where 2000 were asked for."""
    fit(model="logreg", batch_size=64, max_steps=2000)  # 256 samples: 4 steps an epoch
    err = capsys.readouterr().err
    assert "--max-steps 2000 is never reached" in err and "at step 4" in err
    fit(model="logreg", batch_size=64, max_steps=3)
    assert "never reached" not in capsys.readouterr().err


@pytest.mark.parametrize("first, then, words", [
    # --epochs given to extend a run that --max-steps (kept from its config) ended: it was told
    # to "give more --epochs", which it had just done.
    ({"max_steps": 3}, {"epochs": 3, "max_steps": 3}, ["--max-steps 3 ended it",
                                                       "a larger --max-steps"]),
    ({"epochs": 1}, {"epochs": 1}, ["--epochs 1 ended it", "more --epochs"]),
    ({}, {}, ["--epochs 1 (the default) ended it", "more --epochs"]),
])
def test_a_finished_run_says_which_limit_to_raise(tmp_path, capsys, first, then, words):
    fit(model="logreg", batch_size=64, out=str(tmp_path), **first)  # 4 steps an epoch
    capsys.readouterr()
    run = fit(model="logreg", batch_size=64, out=str(tmp_path), resume="auto", **then)
    err = capsys.readouterr().err
    assert f"nothing to train: the run finished at step {run.step}" in err
    for w in words:
        assert w in err, err


def test_a_run_that_is_all_warm_up_is_said(capsys):
    """A --warmup-steps not shorter than the run: the learning rate never reaches --lr and the
    schedule never decays it; it trained without a word."""
    fit(model="logreg", batch_size=64, max_steps=3, warmup_steps=10, schedule="cosine",
        lr=0.01)
    err = capsys.readouterr().err
    assert "--warmup-steps 10" in err and "3 steps" in err and "0.003" in err, err
    assert "cosine never decays it" in err
    fit(model="logreg", batch_size=64, max_steps=3, warmup_steps=2, schedule="cosine")
    assert "warm-up" not in capsys.readouterr().err


@pytest.mark.parametrize("schedule", ["cosine", "onecycle"])
def test_extending_a_run_stretches_its_schedule(tmp_path, schedule):
    """README: a longer run resumed goes on with the learning rates of a run planned that long."""
    kw = dict(model="logreg", batch_size=64, epochs=4, log_every=1, schedule=schedule)
    fit(max_steps=4, out=str(tmp_path), **kw)
    resumed = fit(max_steps=8, out=str(tmp_path), resume="auto", **kw)
    fresh = fit(max_steps=8, **kw)
    lrs = [[(r["step"], r["lr"]) for r in run.history if r["kind"] == "train"]
           for run in (resumed, fresh)]
    assert lrs[0] == lrs[1][4:] and len(lrs[0]) == 4
    if schedule == "cosine":  # the half-way step of the longer run: half of --lr
        assert [r for r in fresh.history if r["kind"] == "train"][3]["lr"] == pytest.approx(
            0.5 * fresh.cfg.lr)


@pytest.mark.parametrize("kw, words", [
    (dict(momentum=0.5), ["--momentum 0.5", "--optimizer sgd"]),
    (dict(patience=5), ["--patience 5", "--early-stop"]),
])
def test_a_setting_the_run_never_reads_is_said(capsys, kw, words):
    """--momentum under adamw, --patience without --early-stop: recorded in config.toml, yet
    nothing reads them; they were ignored without a word."""
    fit(model="logreg", batch_size=64, max_steps=1, **kw)
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err
    fit(model="logreg", batch_size=64, max_steps=1, optimizer="sgd", momentum=0.5)
    assert "warning" not in capsys.readouterr().err
