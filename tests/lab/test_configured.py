"""lab/configured.py and `experiment scaling --predict-only --model ...`: the configured model —
yours (pkg.module:factory) or a bundled one with your flags — predicted from one real step
counted here, in the same JSON as the bundled reference sizes."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch
from torch import nn

from fasttrain.lab import layout_choice
from tests.conftest import assert_one_line_error, run_cli

NET = """
    from torch import nn

    def build():
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 48), nn.ReLU(), nn.Linear(48, 10))
"""


@pytest.fixture
def yournet(tmp_path, monkeypatch):
    """`yournet:build`, a module of the user's in tmp_path: an MLP for MNIST-shaped images, so
    that the default data (MNIST, or its synthetic stand-in) fits it."""
    (tmp_path / "yournet.py").write_text(textwrap.dedent(NET))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "yournet:build"
    sys.modules.pop("yournet", None)


def _scaling(capsys, tmp_path, *argv):
    out = tmp_path / "s.json"
    code, text, err = run_cli(capsys, "experiment", "scaling", "--predict-only", *argv,
                              "--json", str(out))
    assert code == 0, err
    return json.loads(out.read_text()), text


def _keys(result: dict) -> tuple:
    """The JSON's schema: its keys, its options', and those of a predicted and a layout row."""
    return (set(result), set(result["options"]), set(result["predicted"][0]),
            set(result["layouts"][0]), set(result["layouts"][0]["candidates"][0]))


def _reference_flops(model: nn.Module, batch: int) -> float:
    """FLOPs of forward + backward by torch's FlopCounterMode, as the bundled specs count."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        logits = model(torch.rand(batch, 1, 28, 28))
        nn.functional.cross_entropy(logits, torch.zeros(batch, dtype=torch.long)).backward()
    return float(counter.get_total_flops())


@pytest.mark.parametrize("given", ["flag", "config"])
def test_your_model_is_predicted_from_one_step_counted_here(yournet, tmp_path, capsys, given):
    (tmp_path / "c.toml").write_text(f'model = "{yournet}"\nbatch_size = 32\n')
    model = (["--model", yournet, "--batch-size", "32"] if given == "flag"
             else ["--config", str(tmp_path / "c.toml")])
    result, text = _scaling(capsys, tmp_path, *model, "--nodes", "1,2,4")
    import yournet as mod

    net = mod.build()
    rows = result["predicted"]
    assert [(r["model"], r["gpus"]) for r in rows] == [(yournet, 8), (yournet, 16), (yournet, 32)]
    assert {r["params"] for r in rows} == {sum(p.numel() for p in net.parameters())}
    assert {r["batch_per_gpu"] for r in rows} == {32}
    assert rows[0]["flops_per_step"] == _reference_flops(net, 32)
    # weak scaling (batch per GPU fixed): the compute is the same on every GPU count, a step
    # never shorter with more GPUs, and the speed-up at most the GPUs
    assert len({r["compute_s"] for r in rows}) == 1
    steps = [r["step_s"] for r in rows]
    assert steps == sorted(steps) and steps[0] >= rows[0]["compute_s"]
    for r in rows:
        assert 0 < r["efficiency"] <= 1
        assert r["speedup"] == pytest.approx(r["gpus"] * r["efficiency"])
    # layouts: ddp and fsdp only, tensor and pipeline parallelism left out, each with why
    for row in result["layouts"]:
        assert [c["layout"] for c in row["candidates"]] == ["ddp", "fsdp"]
        assert row["pick"]["layout"] == "ddp" and row["model"] == yournet
        assert row["left_out"] == {
            "tp": "Sequential has no parallelize(tp_mesh), which --tp needs",
            "pp": "Sequential has no pipeline_split(n_stages), which --pp needs"}
        assert row["saved_per_sample"] > 0
    assert result["options"]["counted"]["model"] == yournet
    assert result["config"]["model"] == yournet and yournet in text
    bundled, _ = _scaling(capsys, tmp_path, "--predict-models", "mlp")
    assert _keys(result) == _keys(bundled)


def test_your_model_too_big_for_one_gpu_is_sharded(yournet, tmp_path, capsys):
    """The layout choice takes your model's counted bytes: on a GPU smaller than its 16 B per
    parameter (38,170 parameters: 611 kB), DDP does not fit and FSDP over 8 does."""
    result, _ = _scaling(capsys, tmp_path, "--model", yournet, "--batch-size", "32",
                         "--nodes", "1", "--gpu-memory-gb", "0.0005")
    (row,) = result["layouts"]
    ddp, fsdp = row["candidates"]
    assert ddp["state"] == 16 * 38_170 and not ddp["fits"]
    assert row["pick"]["layout"] == "fsdp" and fsdp["state"] == 16 * 38_170 // 8
    assert row["reason"].startswith("DDP needs")


def test_a_bundled_model_given_is_predicted_as_configured_not_the_list(tmp_path, capsys):
    """--model mlp --predict-only: mlp alone (not every bundled size), at the --batch-size given,
    with the figures the meta-device count of the same mlp and batch gives."""
    configured, _ = _scaling(capsys, tmp_path, "--model", "mlp", "--batch-size", "128")
    assert {r["model"] for r in configured["predicted"] + configured["layouts"]} == {"mlp"}
    reference, _ = _scaling(capsys, tmp_path, "--predict-models", "mlp")  # batch 128
    assert configured["options"]["counted"]["batch_size"] == 128
    assert reference["options"]["counted"] is None
    for mine, theirs in zip(configured["predicted"], reference["predicted"], strict=True):
        for key in ("params", "batch_per_gpu", "flops_per_step", "gpus"):
            assert mine[key] == theirs[key], key
        assert mine["speedup"] == pytest.approx(theirs["speedup"])
    (small, _) = _scaling(capsys, tmp_path, "--model", "mlp", "--batch-size", "16")
    assert {r["batch_per_gpu"] for r in small["predicted"]} == {16}


def test_a_configured_gpt_keeps_its_tensor_and_pipeline_layouts(tmp_path, capsys):
    result, _ = _scaling(capsys, tmp_path, "--model", "gpt", "--batch-size", "8",
                         "--block-size", "64")
    two = next(r for r in result["layouts"] if r["nodes"] == 2)
    layouts = [c["layout"] for c in two["candidates"]]
    assert "fsdp × tp 2" in layouts and "pp 2 × fsdp" in layouts and two["left_out"] == {}


class _Planned(nn.Module):
    """A user's model with its own tensor-parallel plan and split points."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def parallelize(self, tp_mesh):
        pass

    def pipeline_split(self, n_stages):
        return [self.fc]


def test_a_plan_of_yours_is_left_out_saying_its_traffic_is_not_modelled():
    why = dict(layout_choice.left_out_of(_Planned()))
    assert set(why) == {"tp", "pp"}
    assert "_Planned.parallelize(tp_mesh)'s traffic is not modelled" in why["tp"]
    assert "fasttrain memory --gpus W --pp N" in why["pp"]
    assert layout_choice.left_out_of(_gpt()) == ()


def _gpt():
    from fasttrain.models import build_model

    with torch.device("meta"):
        return build_model("gpt", in_shape=(32,), num_classes=65)


@pytest.mark.parametrize("given", ["flag", "config"])
def test_model_and_predict_models_together_is_one_line(tmp_path, capsys, given):
    (tmp_path / "c.toml").write_text('model = "mlp"\n')
    model = ["--model", "mlp"] if given == "flag" else ["--config", str(tmp_path / "c.toml")]
    out = tmp_path / "s.json"
    code, _, err = run_cli(capsys, "experiment", "scaling", "--predict-only", *model,
                           "--predict-models", "gpt", "--json", str(out))
    assert_one_line_error(code, err, "either --model mlp", "--predict-models gpt", "drop one")
    assert not out.exists()


@pytest.mark.parametrize("argv, words", [
    (["--model", "tests.engine.usermodel:make"],  # its 8 features are not MNIST's images
     ["one step of --model tests.engine.usermodel:make", "give the --data (and --loss)"]),
    (["--model", "tests.engine.usermodel:make", "--data", "tests.engine.usermodel:data"],
     ["float targets need a loss", "--loss mse"]),
    (["--model", "tests.engine.usermodel:nope", "--data", "tests.engine.usermodel:data"],
     ["tests.engine.usermodel has no 'nope'"]),
    (["--model", "mlp", "--batch-size", "0"], ["--batch-size"]),
])
def test_bad_input_for_your_model_is_one_line(tmp_path, capsys, argv, words):
    out = tmp_path / "s.json"
    code, _, err = run_cli(capsys, "experiment", "scaling", "--predict-only", *argv,
                           "--json", str(out))
    assert_one_line_error(code, err, *words)
    assert not out.exists()


def test_a_step_too_big_for_this_machine_names_scaling_not_plan(monkeypatch):
    """The step is counted on this machine's CPU: out of memory there is one line naming the
    command that counted it and the batch to shrink."""
    from fasttrain.engine.config import TrainConfig
    from fasttrain.errors import UserError
    from fasttrain.lab import configured, memory

    def oom(*_):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")

    monkeypatch.setattr(memory, "on_run", oom)
    with pytest.raises(UserError, match="experiment scaling counts one real step") as e:
        configured.describe(TrainConfig(model="mlp", batch_size=4096), task=None)
    assert "give a smaller --batch-size" in str(e.value)
