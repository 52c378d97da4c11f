"""Issue 23's combined case: a Dataset of dict samples (as Hugging Face data comes), streamed,
trained by an HF-style step `model(**batch).loss` with bf16 and accumulation, resumed mid-epoch
bit for bit; and the same batches refused with one line when no step is given."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import Dataset

import fasttrain
from fasttrain.engine import steps, streamdata
from fasttrain.errors import UserError
from tests.engine import userstep

SEQ, VOCAB = 8, 128


class DictTokens(Dataset):
    """Token windows as {"input_ids": [T], "labels": [T]}, plus a string field the engine must
    pass through untouched. Counts reads: streamed data is read afresh every epoch."""

    def __init__(self, n: int = 96):
        g = torch.Generator().manual_seed(1)
        self.tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i):
        self.reads += 1
        w = self.tokens[i]
        return {"input_ids": w[:-1], "labels": w[1:], "source": f"doc-{i}"}


def hf_dict_step(model, batch):
    assert isinstance(batch["source"], list) and batch["source"][0].startswith("doc-")
    return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss


def train(steps: int, data=None, **kw):
    run = fasttrain.build(model=userstep.make_lm(), data=data or DictTokens(), step=hf_dict_step,
                          precision="bf16", accum_steps=2, batch_size=16, epochs=10,
                          max_steps=steps, device="cpu", progress=False, log_every=2,
                          verbose=False, **kw)
    fasttrain.fit(run)
    return run


def weights(run):
    return {k: v.detach().clone() for k, v in run.model.state_dict().items()}


def test_dict_samples_stream_through_an_hf_style_step_with_bf16_accumulation_and_resume(tmp_path):
    data = DictTokens()
    whole = train(15, data)
    assert whole.batches.path == "streamed"
    # Every step read its own samples (nothing held in memory), plus the samples that build
    # batches to learn the batch's structure.
    assert data.reads == 15 * 16 + streamdata.PROBE
    logs = [r["loss"] for r in whole.history if r["kind"] == "train"]
    assert logs[-1] < logs[0], logs
    # 96 samples / 16 = 6 steps an epoch: stop in the middle of epoch 1, resume from there.
    torch.manual_seed(123)  # the resumed run must restore every random stream itself
    train(9, out=str(tmp_path), checkpoint_every=9)
    resumed = train(15, out=str(tmp_path), resume="auto")
    assert resumed.step == 15 and resumed.epoch == 2
    for k, v in weights(resumed).items():
        assert torch.equal(v, weights(whole)[k]), k


def test_dict_batches_without_a_step_are_one_line_naming_the_fix():
    with pytest.raises(UserError, match=r"not \(input, target\) pairs.*step=fn\(model, batch\)"):
        fasttrain.build(model=userstep.make_lm(), data=DictTokens(), batch_size=16,
                        device="cpu", verbose=False)


@pytest.mark.parametrize("as_data", ["dicts", "pairs in memory", "pairs streamed"])
def test_token_sequences_of_yours_report_tokens_per_second(as_data):
    # tokens/s was the bundled text's only: a language model of yours logged samples/s alone.
    tokens = DictTokens().tokens
    x, y = tokens[:, :-1], tokens[:, 1:]
    data = {"dicts": DictTokens(), "pairs in memory": (x, y),
            "pairs streamed": torch.utils.data.TensorDataset(x, y)}[as_data]
    step = hf_dict_step if as_data == "dicts" else userstep.hf_step
    run = fasttrain.build(model=userstep.make_lm(), data=data, step=step, batch_size=16,
                          max_steps=2, log_every=2, device="cpu", progress=False, verbose=False)
    fasttrain.fit(run)
    (record,) = [r for r in run.history if r["kind"] == "train"]
    assert record["tokens_per_s"] == pytest.approx(record["samples_per_s"] * SEQ)


def test_no_tokens_per_second_for_samples_that_are_not_token_sequences():
    x, y = torch.randint(0, VOCAB, (64, SEQ)), torch.randint(0, 4, (64,))  # one label a sample
    net = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 4), torch.nn.Flatten(),
                              torch.nn.Linear(4 * SEQ, 4))
    run = fasttrain.build(model=net, data=(x, y), batch_size=16, max_steps=2, log_every=2,
                          device="cpu", progress=False, verbose=False)
    fasttrain.fit(run)
    assert "tokens_per_s" not in run.history[0]


def token_splits(as_data: str) -> dict:
    tokens = DictTokens().tokens
    x, y = tokens[:, :-1], tokens[:, 1:]
    if as_data == "pairs in memory":
        return {"train": (x[:80], y[:80]), "test": (x[80:], y[80:])}
    return {k: torch.utils.data.TensorDataset(x[s], y[s])
            for k, s in (("train", slice(0, 80)), ("test", slice(80, None)))}


def next_token_lm() -> torch.nn.Module:
    """Logits [B, T, VOCAB] for ids [B, T]: what the default step's cross-entropy takes."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))


def last_eval(run) -> dict:
    fasttrain.fit(run)
    return [r for r in run.history if r["kind"] == "eval"][-1]


@pytest.mark.parametrize("as_data", ["pairs in memory", "pairs streamed"])
@pytest.mark.parametrize("loss", [None, "cross_entropy"])
def test_token_pairs_of_yours_under_the_cross_entropy_report_perplexity(as_data, loss):
    # val/test_perplexity were the bundled text's only: a language model of yours had its loss.
    run = fasttrain.build(model=next_token_lm(), data=token_splits(as_data), batch_size=16,
                          val_fraction=0.25, max_steps=2, device="cpu", progress=False,
                          verbose=False, **({"loss": loss} if loss else {}))
    record = last_eval(run)
    for split in ("val", "test"):
        assert record[f"{split}_perplexity"] == pytest.approx(
            math.exp(record[f"{split}_loss"])), record


def smoothed(output, target):
    return torch.nn.functional.cross_entropy(output.flatten(0, 1), target.flatten(),
                                             label_smoothing=0.1)


@pytest.mark.parametrize("case", ["your step", "your loss", "one label a sequence"])
def test_no_perplexity_where_the_loss_need_not_be_a_token_cross_entropy(case):
    # Your step may add anything to the loss (an auxiliary term, a weighting), your loss may be
    # smoothed: the exp of either is no perplexity. Nor is a loss over one label a sequence.
    kw = {"your step": dict(model=userstep.make_lm(), data=DictTokens(), step=hf_dict_step),
          "your loss": dict(model=next_token_lm(), data=token_splits("pairs in memory"),
                            loss=smoothed),
          "one label a sequence": dict(
              model=torch.nn.Sequential(torch.nn.Embedding(VOCAB, 4), torch.nn.Flatten(),
                                        torch.nn.Linear(4 * SEQ, 4)),
              data=(torch.randint(0, VOCAB, (64, SEQ)), torch.randint(0, 4, (64,))))}[case]
    run = fasttrain.build(**kw, batch_size=16, val_fraction=0.25, max_steps=2, device="cpu",
                          progress=False, verbose=False)
    record = last_eval(run)
    assert "val_loss" in record and not [k for k in record if "perplexity" in k], record


class RaggedTokens(torch.utils.data.IterableDataset):
    """Next-token pairs of 4 to 12 tokens (the same ones every pass), to be padded by a collate_fn
    of the user's: what a language model's stream of documents looks like."""

    def __init__(self, n: int = 96):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, VOCAB, (int(torch.randint(5, 14, (), generator=g)),),
                                generator=g)
            yield ids[:-1], ids[1:]


def pad(samples):
    """Pads to the batch's longest; padded targets are -100 (cross-entropy's ignore_index)."""
    longest = max(len(x) for x, _ in samples)
    x = torch.zeros(len(samples), longest, dtype=torch.long)
    y = torch.full((len(samples), longest), -100)
    for k, (a, b) in enumerate(samples):
        x[k, :len(a)], y[k, :len(b)] = a, b
    return x, y


def test_padded_token_batches_of_a_collate_fn_report_tokens_per_second_and_perplexity():
    # A DataLoader with its own collate_fn had neither: the first batch's length says nothing
    # of the next one's, so the engine said nothing at all. Tokens are counted batch by batch.
    loader = torch.utils.data.DataLoader
    data = {"train": loader(RaggedTokens(), batch_size=8, collate_fn=pad),
            "test": loader(RaggedTokens(16), batch_size=8, collate_fn=pad)}
    run = fasttrain.build(model=next_token_lm(), data=data, batch_size=8, max_steps=12,
                          log_every=12, device="cpu", progress=False, verbose=False)
    fasttrain.fit(run)
    (train,) = [r for r in run.history if r["kind"] == "train"]
    padded = sum(pad(list(RaggedTokens())[k:k + 8])[0].numel() for k in range(0, 96, 8))
    assert train["tokens_per_s"] == pytest.approx(
        train["samples_per_s"] * padded / 96), train
    record = [r for r in run.history if r["kind"] == "eval"][-1]
    assert record["test_perplexity"] == pytest.approx(math.exp(record["test_loss"])), record


def test_accuracy_leaves_out_the_targets_the_cross_entropy_ignores():
    # Padding (or a masked prompt) marked -100 is no prediction: counted, it made a model
    # that is always right look as wrong as the padding is long.
    output = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3, 0]]), 4).float()
    target = torch.tensor([[1, 2, -100, -100]])
    assert steps.accuracy(output, target).item() == 1.0
