"""Token sequences your collate_fn pads per batch (targets -100 where padded) train the same
update whatever the accumulation: the default step's cross-entropy is weighed by the tokens each
micro-batch holds (loop.accumulate_tokens), not averaged per micro-batch."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import fasttrain
from fasttrain.engine.loop import accumulate, accumulate_tokens
from tests.engine.launch import Part
from tests.engine.test_stream import FAST


class Uneven(Dataset):
    """8 next-token pairs of lengths 2, 5, ..., 23: micro-batches of very different tokens."""

    def __init__(self, masked: int = 0):
        self.masked = masked  # the first `masked` samples' targets all -100 (a prompt, masked)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        ids = torch.randint(0, 50, (2 + 3 * i,), generator=torch.Generator().manual_seed(i))
        return ids, ids.roll(1) if i >= self.masked else torch.full_like(ids, -100)


def pad(samples):
    """Pad to the batch's longest: inputs with 0, targets with -100 (ignored by the loss)."""
    longest = max(len(x) for x, _ in samples)
    x = torch.zeros(len(samples), longest, dtype=torch.long)
    y = torch.full((len(samples), longest), -100, dtype=torch.long)
    for j, (a, b) in enumerate(samples):
        x[j, :len(a)], y[j, :len(b)] = a, b
    return x, y


def lm() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 50))


def loader() -> DataLoader:
    """For `--data tests.engine.test_padded_accumulation:loader`: this process's micro-batches
    of 8 (FT_ACCUM accumulation steps, WORLD_SIZE processes)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return DataLoader(Uneven(), batch_size=8 // world // int(os.environ["FT_ACCUM"]),
                      collate_fn=pad)


def trained(accum: int, masked: int = 0):
    loader = DataLoader(Uneven(masked), batch_size=8 // accum, collate_fn=pad)
    run = fasttrain.build(model=lm(), data=loader, batch_size=8, accum_steps=accum, max_steps=1,
                          optimizer="sgd", momentum=0.0, **{**FAST, "lr": 1.0, "log_every": 1})
    fasttrain.fit(run)
    return run


def test_padded_token_sequences_accumulate_to_the_big_batchs_update():
    whole = trained(1)
    assert whole.forward_backward is accumulate  # one micro-batch: its mean is the step's
    for accum in (2, 4):
        run = trained(accum)
        assert run.forward_backward is accumulate_tokens
        for k, v in whole.model.state_dict().items():
            torch.testing.assert_close(run.model.state_dict()[k], v, rtol=1e-5, atol=1e-6)
        # the logged loss is the step's mean over its tokens too
        assert run.history[0]["loss"] == pytest.approx(whole.history[0]["loss"], rel=1e-5)



def test_a_micro_batch_of_padding_alone_adds_nothing_not_nan():
    whole, run = trained(1, masked=2), trained(4, masked=2)  # micro-batch 0: samples 0 and 1
    for k, v in whole.model.state_dict().items():
        torch.testing.assert_close(run.model.state_dict()[k], v, rtol=1e-5, atol=1e-6)


PADDED = ["--model", "tests.engine.test_padded_accumulation:lm", "--data",
          "tests.engine.test_padded_accumulation:loader", "--batch-size", "8", "--max-steps", "1",
          "--optimizer", "sgd", "--momentum", "0", "--lr", "1.0", "--device", "cpu",
          "--no-progress", "--accum-steps", "2"]
TWO = Part(__name__, 2, PADDED)  # in the session's shared 2-process launch (launch.Part)
TWO.add("ddp", "--parallel", "ddp", env={"FT_ACCUM": "2"})


@pytest.fixture(scope="module")
def two(shared) -> Part:
    return TWO.bound(shared)


@pytest.mark.slow
def test_padded_token_sequences_on_two_gloo_ranks_train_the_one_process_update(tmp_path, two):
    # Averaged per rank, two ranks' micro-batches of 4 moved the weights up to 0.05 away from
    # one process's batch of 8 (SGD, lr 1); weighed by tokens, by rounding only.
    from safetensors.torch import load_file

    from tests.engine.test_tensor_parallel import train_here

    proc = train_here(tmp_path / "one", args=PADDED, env={"FT_ACCUM": "2"})  # pytest's process
    assert proc.returncode == 0, proc.stdout + proc.stderr
    two("ddp").ok()
    one, ddp = (load_file(d / "weights.safetensors") for d in (tmp_path / "one", two.root / "ddp"))
    for k, v in one.items():
        torch.testing.assert_close(ddp[k], v, rtol=1e-5, atol=1e-6, msg=k)
