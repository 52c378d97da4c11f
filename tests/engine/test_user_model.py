"""A user's own nn.Module, loss and float regression data through the public path: Python API
(`fasttrain.build` / `fit` / `load`) and the CLI (`--model pkg.module:factory`), with the
switches a user would combine; the bundled models take the same path (see conftest.fit)."""

from __future__ import annotations

import json

import pytest
import torch

import fasttrain
from fasttrain.errors import UserError
from tests.conftest import assert_one_line_error, run_cli
from tests.engine import usermodel
from tests.engine.launch import Part

COMMON = dict(batch_size=64, accum_steps=2, precision="bf16", lr=1e-2, seed=1, log_every=4,
              device="cpu", progress=False)


def weights(run):
    return {k: v.detach().clone() for k, v in run.model.state_dict().items()}


def made():
    torch.manual_seed(0)  # a user's module is initialized before build: seed it the same way
    return usermodel.make()


def train(steps: int, out=None, resume=None, **kw):
    run = fasttrain.build(model=made(), data=usermodel.data(), loss=usermodel.huber,
                          max_steps=steps, epochs=10, out=out, resume=resume, verbose=False,
                          **{**COMMON, **kw})
    fasttrain.fit(run)
    return run


def test_a_user_model_learns_a_regression_with_bf16_and_accumulation():
    run = train(24)
    evals = [r for r in run.history if r["kind"] == "eval"]
    train_logs = [r for r in run.history if r["kind"] == "train"]
    assert train_logs[-1]["loss"] < 0.7 * train_logs[0]["loss"], train_logs
    assert "test_loss" in evals[-1] and "test_accuracy" not in evals[-1]  # float targets


def test_checkpoint_and_resume_is_bit_identical(tmp_path):
    whole = weights(train(16))
    # The resumed run starts from other weights: the checkpoint must restore everything.
    torch.manual_seed(123)
    train(8, out=str(tmp_path), checkpoint_every=8)
    resumed = train(16, out=str(tmp_path), resume="auto")  # extends max_steps 8 → 16
    assert resumed.step == 16
    for k, v in weights(resumed).items():
        assert torch.equal(v, whole[k]), k


def test_load_returns_the_trained_module(tmp_path):
    run = train(4, out=str(tmp_path))
    loaded = fasttrain.load(tmp_path, model=usermodel.make())
    x = usermodel.data()["test"][0]
    with torch.no_grad():
        assert torch.equal(loaded(x), run.model.eval()(x))


def test_load_without_the_module_of_a_run_built_from_python_names_the_way(tmp_path):
    # The run's model.json held the module's class path, which load() then tried as --model:
    # "--model 'tests.engine.usermodel.Net': give a bundled name or an import path ...".
    train(2, out=str(tmp_path))
    with pytest.raises(UserError) as e:
        fasttrain.load(tmp_path)
    assert "passed from Python" in str(e.value) and "model=" in str(e.value), e.value


def test_activation_checkpointing_on_named_modules_gives_the_same_training():
    plain = weights(train(4, precision="fp32"))
    run = fasttrain.build(model=made(), data=usermodel.data(), loss=usermodel.huber,
                          max_steps=4, activation_checkpointing=True, checkpoint=["body"],
                          verbose=False, **{**COMMON, "precision": "fp32"})
    fasttrain.fit(run)
    assert sum(type(m).__name__ == "Checkpointed" for m in run.model.modules()) == 4
    for k, v in weights(run).items():
        torch.testing.assert_close(v, plain[k], atol=1e-6, rtol=0)


def test_float_inputs_pass_unchanged_and_uint8_are_scaled():
    x = torch.rand(64, 8) * 100  # far outside [0, 1]: a silent ÷255 would show
    run = fasttrain.build(model=torch.nn.Linear(8, 3), data=(x, torch.randint(0, 3, (64,))),
                          batch_size=64, device="cpu", verbose=False)
    (bx, _), = next(iter([list(run.batches.micro_batches(0))]))
    assert sorted(bx.tolist()) == sorted(x.tolist())
    pixels = torch.full((64, 8), 255, dtype=torch.uint8)
    run = fasttrain.build(model=torch.nn.Linear(8, 3), data=(pixels, torch.zeros(64).long()),
                          batch_size=64, device="cpu", verbose=False)
    (bx, _), = list(run.batches.micro_batches(0))
    assert bx.dtype == torch.float32 and bool((bx == 1.0).all())


@pytest.mark.parametrize("x, y, words", [
    (torch.rand(32, 8, dtype=torch.float64), torch.rand(32), ["float64", "x.float()"]),
    (torch.rand(32, 8), torch.rand(31), ["32 inputs but 31 targets"]),
    (torch.rand(32, 8).int(), torch.rand(32), ["torch.int32", "uint8"]),
    (torch.rand(32, 8), torch.rand(32), ["float targets need a loss", "mse"]),
])
def test_wrong_data_is_one_line_naming_the_fix(x, y, words):
    with pytest.raises(UserError) as e:
        fasttrain.build(model=usermodel.make(), data=(x, y), batch_size=16, device="cpu",
                        verbose=False)
    for w in words:
        assert w in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("progress", [False, True])
def test_early_stopping_on_a_validation_split(capsys, progress):
    class Stuck(torch.nn.Module):  # cannot learn: its validation loss never improves
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def forward(self, x):
            return torch.zeros(len(x), 3) * self.w

    x, y = torch.rand(200, 4), torch.randint(0, 3, (200,))
    run = fasttrain.build(model=Stuck(), data=(x, y), val_fraction=0.2, epochs=50,
                          batch_size=32, early_stop="val_loss", patience=2, device="cpu",
                          progress=progress, verbose=False)
    fasttrain.fit(run)
    evals = [r for r in run.history if r["kind"] == "eval"]
    assert len(evals) == 3 and run.stop and "val_loss" in run.stop
    # why it ended early, said where progress is shown (from Python as from the CLI)
    assert (run.stop in capsys.readouterr().err) == progress
    assert {"val_loss", "val_accuracy"} <= evals[0].keys()


@pytest.mark.parametrize("metric, values, stops", [
    # A language model's perplexity falls as it learns: it was taken as a metric to raise, so
    # a run improving steadily was stopped after --patience evaluations.
    ("val_perplexity", [40.0, 30.0, 20.0, 15.0], False),
    ("val_perplexity", [40.0, 41.0, 42.0], True),
    ("val_mae", [0.5, 0.4, 0.3], False),
    ("val_loss", [2.0, 2.1, 2.2], True),
    ("val_token_accuracy", [0.1, 0.2, 0.3], False),
    ("val_accuracy", [0.3, 0.2, 0.1], True),
])
def test_early_stop_knows_which_way_a_metric_improves(metric, values, stops):
    from types import SimpleNamespace

    from fasttrain.engine.callbacks import EarlyStop

    early, run = EarlyStop(metric, patience=2), SimpleNamespace(stop=None)
    for v in values:
        early.on_eval(run, {metric: v})
    assert (run.stop is not None) == stops, run.stop


def test_cli_trains_a_model_given_by_import_path(capsys, tmp_path):
    args = ["train", "--model", "tests.engine.usermodel:make", "--data",
            "tests.engine.usermodel:data", "--loss", "tests.engine.usermodel:huber",
            "--batch-size", "64", "--accum-steps", "2", "--precision", "bf16", "--epochs", "1",
            "--device", "cpu", "--no-progress", "--out", str(tmp_path)]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    assert "micro-batch 32 per rank × 2 accumulation" in err
    assert "done at step 8: test_loss" in out
    # A finished run is extended by a larger --epochs.
    code, out, err = run_cli(capsys, *[a if a != "1" else "2" for a in args], "--resume", "auto")
    assert code == 0, err
    assert "resumed from" in out and "done at step 16" in out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [8, 16]
    module = fasttrain.load(tmp_path)  # rebuilt from the factory the run names
    assert isinstance(module, usermodel.Regressor)
    # Resumed again as it is (a requeued job): nothing to train, nothing written again.
    files = {p.name: p.read_bytes() for p in (tmp_path / "metrics.jsonl",
                                              tmp_path / "weights.safetensors")}
    code, out, err = run_cli(capsys, *[a if a != "1" else "2" for a in args], "--resume", "auto")
    assert code == 0, err
    assert "nothing to train: the run finished at step 16" in err
    assert {p: (tmp_path / p).read_bytes() for p in files} == files


def test_cli_names_a_bad_import_path(capsys):
    code, _, err = run_cli(capsys, "train", "--model", "no_such_pkg.nets:make", "--device",
                           "cpu")
    assert_one_line_error(code, err, "no_such_pkg", "cannot import")


USER = ["--model", "tests.engine.usermodel:make", "--data", "tests.engine.usermodel:data",
        "--loss", "tests.engine.usermodel:huber", "--batch-size", "64", "--accum-steps", "2",
        "--optimizer", "sgd", "--lr", "0.05", "--max-steps", "16", "--device", "cpu",
        "--no-progress"]
TWO = Part(__name__, 2, USER)  # in the session's shared 2-process launch (launch.Part)
TWO.add("ddp", "--parallel", "ddp")


@pytest.fixture(scope="module")
def two(shared) -> Part:
    return TWO.bound(shared)


@pytest.mark.slow
def test_ddp_on_two_gloo_processes_matches_one_process(tmp_path, two):
    from safetensors.torch import load_file

    from tests.engine.test_tensor_parallel import train_here

    proc = train_here(tmp_path / "one", args=USER)  # one process: pytest's
    assert proc.returncode == 0, proc.stdout + proc.stderr
    two("ddp").ok()
    got = {name: load_file(out / "weights.safetensors")
           for name, out in (("one", tmp_path / "one"), ("ddp", two.root / "ddp"))}
    for k, v in got["one"].items():
        torch.testing.assert_close(got["ddp"][k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_memory_takes_a_model_given_by_import_path(capsys, tmp_path):
    code, _, err = run_cli(capsys, "memory", "--model", "tests.engine.usermodel:make", "--data",
                           "tests.engine.usermodel:data", "--loss", "tests.engine.usermodel:huber",
                           "--batch-size", "32", "--device", "cpu", "--json",
                           str(tmp_path / "m.json"))
    assert code == 0, err
    row = json.loads((tmp_path / "m.json").read_text())["rows"][0]
    params = sum(p.numel() for p in usermodel.make().parameters())
    assert row["params"] == params and row["weights"] == 4 * params


def test_the_start_line_names_data_from_python_and_synthetic_data_plainly():
    # Audit: "training ...Sequential on python on cpu" and "training cnn on synthetic (synthetic)".
    from fasttrain.engine.run import describe

    run = fasttrain.build(model=made(), data=usermodel.data(), loss=usermodel.huber, max_steps=1,
                          verbose=False, **COMMON)
    assert " on your data on " in describe(run), describe(run)
    run = fasttrain.build(model="mlp", data="synthetic", max_steps=1, verbose=False)
    assert " on synthetic on " in describe(run), describe(run)
