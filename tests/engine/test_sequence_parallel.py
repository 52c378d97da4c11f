"""Sequence parallel and loss parallel in gpt's tensor-parallel plan (models/gpt.py,
engine/tensor_parallel.py), on CPU processes (gloo).

The whole runs (tp=2 and fsdp × tp 2×2 equal one process within 1e-5 after 6 steps, loss
and weights) are in test_tensor_parallel.py: sequence and loss parallel are what --tp
does for gpt. Here: the layouts themselves (the residual stream sequence-sharded, the logits
vocab-sharded and never whole), the activation bytes that saves, which runs get loss parallel,
and a user's step under --tp (whole logits).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from fasttrain.engine.inputs import cross_entropy
from fasttrain.engine.tensor_parallel import wants_loss_parallel
from fasttrain.models.gpt import GPT
from tests.engine.launch import Part
from tests.engine.test_tensor_parallel import ARGS, assert_same_run, train_here

B, T, VOCAB, WIDTH = 4, 32, 65, 32  # the driver's defaults; 65 = 33 + 32 rows: an uneven split


def plain_step(model, batch):
    """A user's step (--step tests.engine.test_sequence_parallel:plain_step): the default
    step's loss, but the engine cannot know that, so the model hands it whole logits."""
    x, y = batch
    return cross_entropy(model(x), y)


def test_loss_parallel_only_for_the_built_in_cross_entropy_and_the_models_own_plan():
    model = GPT((T,), VOCAB, n_layer=1, n_embd=WIDTH)
    default = SimpleNamespace(step_name="", loss_fn=cross_entropy)
    assert wants_loss_parallel(default, model, None)
    assert not wants_loss_parallel(default, model, {"blocks.0.mlp.fc": None})  # a given plan
    assert not wants_loss_parallel(SimpleNamespace(step_name="pkg:step", loss_fn=cross_entropy),
                                   model, None)
    assert not wants_loss_parallel(SimpleNamespace(step_name="", loss_fn=torch.nn.functional
                                                   .mse_loss), model, None)
    no_keyword = SimpleNamespace(parallelize=lambda tp_mesh: None)  # a user's plain hook
    assert not wants_loss_parallel(default, no_keyword, None)


# tp_driver.py's measurement, a command of the session's shared 2-process launch (a launch of
# its own cost the start-up and imports of 3 processes: torchrun's and 2 workers').
DRIVEN = Part(__name__, 2, [])
DRIVEN.add("driver", call="tests.engine.tp_driver:case")


@pytest.fixture(scope="module")
def driven(shared) -> dict:
    part = DRIVEN.bound(shared)
    part("driver").ok()
    return json.loads((part.root / "driver" / "result.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["loss_parallel", "gathered_logits"])
def test_the_split_model_computes_the_whole_models_loss_and_gradients(driven, mode):
    got, want = driven[mode], driven["one_process"]
    assert abs(got["loss"] - want["loss"]) < 1e-5, (got["loss"], want["loss"])
    assert got["grad_diff"] < 1e-5, got["grad_diff"]
    # Between the tensor-parallel pairs the residual stream is this rank's half of the sequence.
    assert driven[mode]["layouts"]["stream"] == ["Tensor", [B, T // 2, WIDTH]]


@pytest.mark.slow
def test_loss_parallel_keeps_the_logits_vocab_sharded_and_saves_their_bytes(driven):
    lp, whole = driven["loss_parallel"], driven["gathered_logits"]
    assert lp["layouts"]["logits"] == ["DTensor", [B, T, 33], ["S(2)"]]  # rank 0: rows 0..32
    assert whole["layouts"]["logits"] == ["Tensor", [B, T, VOCAB], []]
    # log-softmax keeps its output for backward: [B·T, 33] here instead of [B·T, 65] (fp32).
    assert whole["saved_bytes"] - lp["saved_bytes"] >= B * T * (VOCAB - 33) * 4, (lp, whole)
    assert lp["saved_bytes"] < driven["one_process"]["saved_bytes"]


STEP = ["--step", "tests.engine.test_sequence_parallel:plain_step", "--max-steps", "3"]
TWO = Part(__name__, 2, ARGS)  # in the session's shared 2-process launch (launch.Part)
TWO.add("tp", *STEP, "--tp", "2")


@pytest.fixture(scope="module")
def two(shared) -> Part:
    return TWO.bound(shared)


@pytest.mark.slow
def test_a_user_step_under_tp_gets_whole_logits_and_trains_as_one_process(tmp_path, two):
    one = train_here(tmp_path / "one", *STEP)  # one process: pytest's
    assert one.returncode == 0, one.stdout + one.stderr
    two("tp").ok()
    assert_same_run(tmp_path / "one", two.root / "tp")
