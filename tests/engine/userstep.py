"""A user's own step, optimizer and scheduler, outside the package: what `--step
tests.engine.userstep:hf_step` imports. The model is Hugging Face-shaped: forward takes
input_ids and labels and returns an object with .loss."""

from types import SimpleNamespace

import torch
from torch import nn

TOTAL_STEPS = 12  # OneCycleLR must know the run's length


class TinyLM(nn.Module):
    """Embedding → LayerNorm → linear head; returns .loss and .logits like an HF model."""

    def __init__(self, vocab: int = 128, width: int = 16):  # any ASCII text
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.norm(self.embed(input_ids)))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return SimpleNamespace(loss=loss, logits=logits)


def make_lm() -> nn.Module:
    torch.manual_seed(0)
    return TinyLM()


def hf_step(model, batch):
    x, y = batch
    return model(**{"input_ids": x, "labels": y}).loss


def step_with_extras(model, batch):
    x, y = batch
    out = model(input_ids=x, labels=y)
    hits = (out.logits.argmax(-1) == y).float().mean()
    return {"loss": out.loss, "hits": hits, "twice": 2 * out.loss.detach()}


def adamw(param_groups):
    return torch.optim.AdamW(param_groups, lr=1e-2, weight_decay=0.1)


def onecycle(optimizer):
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=TOTAL_STEPS)


def warmup(optimizer):
    """A LambdaLR of the user's: its step reads base_lrs, one an optimizer group."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))


class BrokenLM(TinyLM):
    def forward(self, input_ids, labels=None):
        return _reshape_wrongly(self.embed(input_ids))


def _reshape_wrongly(h):
    raise ValueError(f"boom: cannot use hidden states of shape {tuple(h.shape)}")


def make_broken() -> nn.Module:
    return BrokenLM()


def xy_step(model, batch):
    """The default step written as a user's: the same loss of the same (x, y)."""
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def lm_step(model, batch):
    """The default language-model step written as a user's: logits [B, T, V], targets [B, T]."""
    x, y = batch
    logits = model(x)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
